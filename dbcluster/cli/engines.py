"""The one place a command opens its database: :func:`open_engine`.

Every command that connects (``init``, ``migrate``, ``worker``, ``launch``, ``status``, ``stop``,
``submit``, ``prune``, ``demo``...) gets its engine here, so what happens when the database does
not answer is decided once: today a failed first connection is one line naming the URL (without
its password) and the driver's reason, exit status 3 (:class:`~dbcluster.errors.
DatabaseUnreachableError`). Waiting the database out before that (issue 34: retries, one WARNING
per try, exit 3 after ``--connect-timeout``) belongs in :func:`_connect`, and only there.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from dbcluster.errors import unreachable

if TYPE_CHECKING:
    from sqlalchemy import Engine


class Tables(Enum):
    """What a command needs of the dbcluster tables before it starts."""

    #: Nothing: it creates or upgrades them (``init``, ``migrate``) or brings its own (``demo``).
    ANY = "any"
    #: Every table exists ("run `dbcluster init`" otherwise); their version is not read.
    PRESENT = "present"
    #: Every table exists at this release's schema version ("run `dbcluster init`" or "run
    #: `dbcluster migrate`" otherwise): what a command that runs or reads the cluster needs.
    CURRENT = "current"


def open_engine(url: str, tables: Tables = Tables.ANY) -> Engine:
    """An engine for a user-given URL, connected once so that a bad host fails here, in one
    line (exit 3), then checked for ``tables`` (missing or older tables: one line saying what
    to run, exit 2). Disposed again when a check fails."""
    from dbcluster.dialects import make_engine

    engine = make_engine(url)
    try:
        _connect(engine, url)
        if tables is Tables.CURRENT:
            from dbcluster.migrations import require_current_schema
            from dbcluster.monitor import require_schema

            require_current_schema(engine)
            require_schema(engine)
        elif tables is Tables.PRESENT:
            _require_tables(engine, url)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _connect(engine: Engine, url: str) -> None:
    """One connection, or :class:`~dbcluster.errors.DatabaseUnreachableError`."""
    from sqlalchemy.exc import DBAPIError

    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        raise unreachable(url, exc) from exc


def _require_tables(engine: Engine, url: str) -> None:
    """Every dbcluster table exists; a database error while looking is the database being
    unavailable (one line, exit 3)."""
    from sqlalchemy.exc import DBAPIError

    from dbcluster.monitor import require_schema

    try:
        require_schema(engine)
    except DBAPIError as exc:
        raise unreachable(url, exc) from exc
