"""What counts as the database's passing trouble (as opposed to a bug, or a statement it refuses
as it is): a master waits it out (running its work until it succeeds while its node is still the
master), and a worker does not withdraw over it (see :mod:`dbcluster.cluster.worker`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

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
from dbcluster.cluster.service import Outage, Outages
from dbcluster.retry import Retry, brief, warn_once

if TYPE_CHECKING:
    from dbcluster.cluster.context import NodeContext
    from dbcluster.cluster.mastership import Mastership

log = logging.getLogger("dbcluster.master")
T = TypeVar("T")


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


class Patience:
    """How a master waits the database out: it runs its work until it succeeds, trying again
    every ``pause_ms`` after a database error (:func:`is_connectivity_error`, or one the
    provider's ``is_transient`` names) while its node is the master; a fenced node stops
    (:class:`MastershipLostError`), and any other error is raised at once. A wait is part of
    the node's outage (``outages``: its one WARNING, unless a service or another master of the
    node gave it already, and one INFO when the work gets through; without ``outages``, one
    WARNING per wait), and says at INFO what it waits to do."""

    def __init__(
        self,
        is_transient: Callable[[BaseException], bool],
        pause_ms: int,
        outages: Outages | None = None,
    ) -> None:
        def waits_out(error: BaseException) -> bool:
            if isinstance(error, FencedError):
                return False
            return is_connectivity_error(error) or is_transient(error)

        self.retry = Retry.every(pause_ms / 1000, waits_out, on_retry=warn_once(log))
        self.outages = outages

    @classmethod
    def of(cls, context: NodeContext) -> Patience:
        """A node's masters' patience: the provider's transient errors, every
        ``master_check_interval``, reported with the node's outages."""
        provider, settings = context.store.provider, context.settings
        return cls(provider.is_transient, settings.master_check_interval, context.outages)

    def run(self, mastership: Mastership, work: Callable[[], T], what: str) -> T:
        """``work()`` once it succeeds (see the class doc); ``what`` it does, for the log."""

        def as_master() -> T:
            mastership.check()
            return work()

        doing = f"master {mastership.node_id} cannot {what}"
        if self.outages is None:
            return self.retry.call(as_master, doing)
        outage = Outage("master", self.outages, who=f"master {mastership.node_id}")

        def waiting(what: str, attempt: int, error: BaseException) -> None:
            if attempt == 1:
                log.info("%s yet: %s", what, brief(error))
            outage.began(error)

        done = self.retry.but(on_retry=waiting).call(as_master, doing)
        outage.ended()
        return done
