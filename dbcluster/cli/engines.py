"""The one place a command opens its database (:func:`open_engine`) and waits it out
(:func:`ride_out`).

Every command that connects (``init``, ``migrate``, ``worker``, ``launch``, ``restart``,
``status``, ``stop``, ``submit``, ``prune``, ``web``...) gets its engine here, so what happens
when the database does not answer is decided once. A restart, a crash recovery or a switchover
is a passing outage (DESIGN.md §9): the command tries again, with one WARNING line when the
outage begins and one INFO line when it ends (no traceback; each later try is a DEBUG record),
for at most ``--connect-timeout`` (``DBCLUSTER_CONNECT_TIMEOUT``, 60 s by
default) from the first failure, then gives up in one line naming the URL (without its
password) and the driver's reason, exit status 3 (:class:`~dbcluster.errors.
DatabaseUnreachableError`). What is passing is the provider's judgement
(:func:`~dbcluster.cluster.patience.is_passing`: its transient errors, a read-only server, a
lost connection), never a database's name; anything else is raised at once (a wrong password or
a database that does not exist: exit 3; missing tables, an unknown job: exit 2).

The wait covers the connect, the table checks and, through :func:`ride_out`, the command's first
work (a launch's creating transaction, ``status``'s reads): one run of the retry primitive
(:class:`~dbcluster.retry.Retry`) per command, so the timeout bounds them all together.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

from dbcluster.errors import DatabaseUnreachableError, reason_of, unreachable
from dbcluster.retry import Retry, Retrying, quietly

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from dbcluster.dialects import QueryProvider

log = logging.getLogger("dbcluster.cli")
T = TypeVar("T")

#: How long a command waits the database out when nothing says otherwise (seconds).
DEFAULT_CONNECT_TIMEOUT_S = 60.0
#: Where a command's ``--connect-timeout`` and its one wait live (its click context's ``meta``,
#: shared with its subcommands).
TIMEOUT_KEY = "dbcluster.connect_timeout"
_RUN_KEY = "dbcluster.connect_run"
#: The provider of the engine a command opened last (see :func:`is_outage`).
_opened: list[QueryProvider] = []


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
    """An engine for a user-given URL, connected once (waiting a passing outage out, see the
    module doc), then checked for ``tables`` (missing or older tables: one line saying what
    to run, exit 2). Disposed again when that fails."""
    from dbcluster.dialects import get_provider, make_engine

    engine = make_engine(url)  # a URL no provider or driver speaks: exit 2 at once
    _opened[:] = [get_provider(engine)]
    try:
        ride_out(engine, lambda: _check(engine, tables), "connect")
    except BaseException:
        engine.dispose()
        raise
    return engine


def _check(engine: Engine, tables: Tables) -> None:
    """One connection, then the tables asked for. A database error that is no outage (a wrong
    password, a database that does not exist) is the database being unreachable for this URL:
    one line, exit 3, at once."""
    from sqlalchemy.exc import DBAPIError

    from dbcluster.dialects import get_provider
    from dbcluster.migrations import require_current_schema
    from dbcluster.monitor import require_schema

    try:
        with engine.connect():
            pass
        if tables is Tables.CURRENT:
            require_current_schema(engine)
        if tables is not Tables.ANY:
            require_schema(engine)
    except DBAPIError as exc:
        if is_outage(exc, get_provider(engine)):
            raise
        raise unreachable(engine.url, exc) from exc


def ride_out(
    engine: Engine, work: Callable[[], T], what: str = "work", *, fresh: bool = False
) -> T:
    """``work()`` (a read, or a write that is safe to repeat: it either committed or did not),
    tried again while it fails on a passing database error, for what is left of the command's
    connect timeout (one warning when the wait begins, one line when it ends: see
    :func:`_warn`, :func:`_back`); then :class:`~dbcluster.errors.DatabaseUnreachableError`
    (exit 3). Other errors are raised at once, and so is a commit whose outcome is unknown:
    repeating it could do the work twice. ``what`` names the work in those lines. ``fresh``: a
    wait of its own, with the whole timeout (work long after the command's start, such as a
    launch's summary once its job ended)."""
    from dbcluster.batch.transactions import UnclearCommitError
    from dbcluster.dialects import get_provider

    provider = get_provider(engine)
    run = _policy(connect_timeout_s()).start(what) if fresh else _command_run()
    #: This call's failed tries, and when the first failed: its own wait, said once as it
    #: begins and once as it ends, whatever the command's earlier waits said.
    failed, waited_since = 0, 0.0
    while True:
        try:
            result = work()
        except Exception as error:
            if isinstance(error, UnclearCommitError) or not is_outage(error, provider):
                raise
            run.accepts(error)  # the first passing error starts the deadline
            if run.exhausted():
                raise _gave_up(engine, error, run) from error
            failed += 1
            if failed == 1:
                waited_since = time.monotonic()
            _warn(engine, what, run, error, first=failed == 1)
            if not run.again(error):
                raise _gave_up(engine, error, run) from error
        else:
            if failed:
                _back(engine, what, failed + 1, time.monotonic() - waited_since)
            return result


def is_outage(error: BaseException, provider: QueryProvider | None = None) -> bool:
    """Whether ``error`` says the database is away for now (restarting, shutting down, failing
    over, refusing connections, read-only until clients reach the new primary), as the provider
    of ``provider`` (default: of the engine the command opened last) classifies it
    (:func:`~dbcluster.cluster.patience.is_passing`). A driver's error that reached here
    without SQLAlchemy's wrapper (from a pool event) is judged as if wrapped."""
    from sqlalchemy.exc import DBAPIError

    from dbcluster.cluster.patience import is_passing

    provider = provider or (_opened[0] if _opened else None)
    if provider is None:
        return False
    if is_passing(provider, error):
        return True
    dbapi = getattr(provider.dialect, "loaded_dbapi", None)
    driver_error = getattr(dbapi, "Error", None)
    if isinstance(driver_error, type) and isinstance(error, driver_error):
        return is_passing(provider, DBAPIError(None, None, error))  # type: ignore[arg-type]
    return False


def _gave_up(engine: Engine, error: BaseException, run: Retrying) -> DatabaseUnreachableError:
    given = unreachable(engine.url, error)
    if run.attempt == 1:
        return given
    return DatabaseUnreachableError(
        f"{given} (tried {run.attempt} times in {connect_timeout_s():g} s; see --connect-timeout)"
    )


def _warn(engine: Engine, what: str, run: Retrying, error: BaseException, *, first: bool) -> None:
    """A failed try of one wait (one call of :func:`ride_out`): the ``first`` is one warning
    line (a WARNING record where the command logs, as a worker or a launch's master does, else
    a warning line on stderr in the command's log format); a later one is a DEBUG record (a
    routine outage is one warning, not one per try). A later wait of the same command (the
    database went away again after it answered) warns again: each call waits until the
    database answers, so each wait is an outage of its own."""
    from dbcluster.masking import safe_url

    left = max(0.0, (run.deadline or 0.0) - run.policy.clock())
    if not first:
        log.debug(
            "database still unavailable (%s, try %d): %s", what, run.attempt, reason_of(error)
        )
        return
    _line(
        f"database unavailable ({what}): {safe_url(engine.url)}: {reason_of(error)}; "
        f"trying again for up to {left:.1f} s",
        warning=True,
    )


def _back(engine: Engine, what: str, tries: int, waited_s: float) -> None:
    """The database answered again after this call waited (``tries``: its tries, the one that
    succeeded included): one line (an INFO record where the command logs, else an info line on
    stderr)."""
    from dbcluster.masking import safe_url

    _line(
        f"database available again ({what}): {safe_url(engine.url)} "
        f"(after {waited_s:.1f} s, {tries} tries)",
        warning=False,
    )


def _line(text: str, *, warning: bool) -> None:
    from dbcluster.cli.output import announce

    if logging.getLogger().handlers:
        log.log(logging.WARNING if warning else logging.INFO, "%s", text)
        return
    log_format = _log_format()
    prefix = "" if log_format == "json" else ("warning: " if warning else "info: ")
    announce(prefix + text, log_format, warning=warning)


def set_connect_timeout(value: float) -> None:
    """The current command waits the database out for ``value`` seconds (the callback of
    ``--connect-timeout``)."""
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[TIMEOUT_KEY] = value


def connect_timeout_s() -> float:
    """The current command's connect timeout in seconds: its option, else
    ``DBCLUSTER_CONNECT_TIMEOUT``, else :data:`DEFAULT_CONNECT_TIMEOUT_S`."""
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is not None and TIMEOUT_KEY in ctx.meta:
        return float(ctx.meta[TIMEOUT_KEY])
    text = os.environ.get("DBCLUSTER_CONNECT_TIMEOUT")
    if not text:
        return DEFAULT_CONNECT_TIMEOUT_S
    from dbcluster.cluster.settings import parse_duration

    return parse_duration(text, bare="s", what="DBCLUSTER_CONNECT_TIMEOUT") / 1000


def _command_run() -> Retrying:
    """The current command's one wait (a new one outside a command)."""
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return _policy(connect_timeout_s()).start("connect")
    run = ctx.meta.get(_RUN_KEY)
    if run is None:
        run = ctx.meta[_RUN_KEY] = _policy(connect_timeout_s()).start("connect")
    return run


def _policy(timeout_s: float) -> Retry:
    """Pauses of 0.5 s growing to 5 s (jittered, so that commands started together do not all
    try again together), until ``timeout_s`` after the first failure. :func:`ride_out` judges
    which errors are worth another try and says so itself."""
    return Retry(
        _passing_already,
        deadline_s=timeout_s,
        pause_s=0.5,
        growth=2.0,
        max_pause_s=5.0,
        jitter=0.2,
        on_retry=quietly,
    )


def _passing_already(_error: BaseException) -> bool:
    return True


def _log_format() -> str:
    import click

    ctx = click.get_current_context(silent=True)
    chosen = ctx.params.get("log_format") if ctx is not None else None
    return str(chosen or os.environ.get("DBCLUSTER_LOG_FORMAT") or "text").lower()
