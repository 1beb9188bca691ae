"""What counts as the database's passing trouble (as opposed to a bug, or a statement it refuses
as it is): a master waits it out (running its work until it succeeds while its node is still the
master), and a worker does not withdraw over it (see :mod:`dbcluster.cluster.worker`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    NotSupportedError,
    ProgrammingError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from dbcluster.batch.fence import FencedError
from dbcluster.batch.transactions import UnclearCommitError

if TYPE_CHECKING:
    from dbcluster.cluster.mastership import Mastership
    from dbcluster.cluster.node import Node

log = logging.getLogger("dbcluster.master")


#: What the database says of a statement itself: its data does not fit, a constraint refuses it,
#: it is not valid SQL here. Asking again gets the same answer, so a master does not wait these
#: out (the provider's ``is_transient`` may still name some it knows will pass).
STATEMENT_ERRORS = (DataError, IntegrityError, ProgrammingError, NotSupportedError)


#: Trouble outside any statement: no pooled connection in time, a commit whose outcome is
#: unclear, a refused or timed-out connection.
UNREACHED = (PoolTimeoutError, UnclearCommitError, ConnectionError, TimeoutError)


def is_connectivity_error(error: BaseException) -> bool:
    """An error of the database or of reaching it (as opposed to a bug, or a statement the
    database refuses as it is): a master waits it out."""
    if isinstance(error, STATEMENT_ERRORS):
        return False
    return isinstance(error, (DBAPIError, *UNREACHED))


def is_passing(provider: Any, error: BaseException) -> bool:
    """Whether ``error`` is trouble the database gets over without anyone mending anything: a
    transient error (deadlock, lock timeout, a lost or refused connection: the provider's
    classifier), a server that takes no writes for now (read-only after a switchover), a pool
    or client timeout, a commit whose outcome is unclear. Not every driver ``OperationalError``
    is: SQLite and MySQL report a missing column as one."""
    if provider.is_transient(error) or provider.is_read_only(error):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, (InterfaceError, *UNREACHED))


def patiently(node: Node, mastership: Mastership, work: Callable[[], Any], what: str) -> Any:
    """Run ``work`` until it succeeds, waiting out database errors while this node is the
    master (a fenced node stops: :class:`MastershipLostError`)."""
    warned = False
    while True:
        mastership.check()
        try:
            return work()
        except FencedError:
            raise
        except Exception as error:
            if not is_connectivity_error(error) and not node.store.provider.is_transient(error):
                raise
            if not warned:
                log.warning("master %s cannot %s yet: %s", mastership.node_id, what, error)
                warned = True
            time.sleep(node.settings.master_check_interval / 1000)
