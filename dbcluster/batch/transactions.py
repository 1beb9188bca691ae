"""Step and job transactions that ride out transient database errors.

A deadlock, a serialization failure, a lock wait timeout or a dropped connection inside a chunk,
a tasklet call, a step's start or final write, or a job write is repeated (bounded) instead of
failing the step. The rule for a commit whose outcome is unclear (the connection broke while
``COMMIT`` was on the wire) is the coordination store's: it is verified from the row it wrote,
never trusted and never repeated blindly. A transaction that did not get as far as ``COMMIT`` is
rolled back by the server, so repeating it from the same in-memory state is safe.

Which errors are transient is the caller's to say (the cluster asks its query provider); the
default only trusts SQLAlchemy's own verdict that the connection was invalidated.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from dbcluster import points
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.retry import Retry, Retrying

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A held connection (see :meth:`Transactions.holding`) idle longer than this goes back to the
#: pool, which pings or recycles a connection that sat idle as it does any other (a chunk read
#: for long between its writes must not find its session ended by the server's idle timeout).
HOLD_IDLE_S = 1.0


def connection_invalidated(error: BaseException) -> bool:
    """SQLAlchemy's own judgement: the connection was lost (a disconnect)."""
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


def _never() -> bool:
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Which errors a transaction repeats, how often and for how long.

    ``give_up`` is asked before each repetition (a cluster node answers "I am fenced": its
    writes would be refused anyway, and its partitions belong to their masters now).
    ``attempts`` None: no bound on the tries, only the deadline.
    """

    is_transient: Callable[[BaseException], bool] = connection_invalidated
    attempts: int | None = 5
    deadline_s: float = 10.0
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    give_up: Callable[[], bool] = field(default=_never)

    def retry(self) -> Retry:
        """This policy as a :class:`~dbcluster.retry.Retry` (the deadline runs from the first
        transient error, not from the start: time the body spent before it, a long step or a
        process stopped mid-transaction whose connection the server then closed, must not
        leave it no repetition at all)."""
        return Retry(
            self.is_transient,
            pause_s=self.backoff_s,
            max_pause_s=self.max_backoff_s,
            attempts=self.attempts,
            deadline_s=self.deadline_s,
            give_up=self.give_up,
        )


class UnclearCommitError(RuntimeError):
    """A ``COMMIT`` failed on the wire and its outcome could not be read back in time."""


@dataclass(frozen=True)
class Settling:
    """How a database ends the session that sent an unclear ``COMMIT`` before its outcome is
    read (PostgreSQL: the server process that ran it, by pid and client port). Until that
    session is gone the transaction may still commit: a ``COMMIT`` the server already holds
    in its input, behind a statement waiting on a lock, runs once the lock frees, even though
    its client is gone. Each hook is the query provider's (see ``QueryProvider.session_of``)."""

    #: The session of a driver connection, read without a round trip (None: cannot tell).
    session_of: Callable[[Any], Any | None]
    #: A statement that ends that session (None: the database has none).
    end_session: Callable[[Any], Any | None]
    #: A statement with a row while that session still exists.
    session_alive: Callable[[Any], Any | None]

    @classmethod
    def of(cls, provider: Any) -> Settling | None:
        """The provider's settling, where it has one."""
        if getattr(provider, "session_of", None) is None:
            return None
        return cls(provider.session_of, provider.end_session, provider.session_alive)


def settle_session(
    engine: Engine, settling: Settling, session: Any, deadline: float, pause_s: float = 0.02
) -> bool:
    """From a fresh connection of ``engine``: end ``session`` (the one that sent an unclear
    ``COMMIT``) and wait until the server no longer lists it, up to ``deadline`` (monotonic);
    True once it is gone (its transaction committed or not, for good), False when it could not
    be ended in time. A failure to connect or to run the statements is raised (the caller
    tries again while its own deadline allows)."""
    end, alive = settling.end_session(session), settling.session_alive(session)
    if end is None or alive is None:
        return False
    with engine.connect() as conn:
        conn.execute(end).all()
        conn.commit()
        while conn.execute(alive).first() is not None:
            conn.commit()
            if time.monotonic() > deadline:
                return False
            time.sleep(pause_s)
            conn.execute(end).all()
        conn.commit()
    return True


def _roll_back(conn: Connection, transaction: Any, what: str) -> None:
    """Roll back after the body or the commit failed, without hiding that failure: a rollback
    that fails too (the server ended the session, e.g. past its idle-in-transaction bound) has
    nothing left to undo, since the server rolled the transaction back itself; the connection
    is dropped."""
    try:
        transaction.rollback()
    except Exception as lost:  # noqa: BLE001 - the body's own error is the one raised
        log.info("%s: the rollback failed too (%s); dropping the connection", what, lost)
        conn.invalidate()


class Transactions:
    """Runs a transaction body, repeating it on transient errors under a :class:`RetryPolicy`."""

    def __init__(
        self, engine: Engine, policy: RetryPolicy | None = None, settling: Settling | None = None
    ) -> None:
        self.engine = engine
        self.policy = policy or RetryPolicy()
        self._retry = self.policy.retry()
        #: How the session of an unclear commit is ended before its outcome is read (None:
        #: it is read at once).
        self.settling = settling
        #: Per thread: whether it is :meth:`holding`, and the connection it holds.
        self._held = threading.local()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Within it, this thread's transactions run on one pooled connection, kept checked out
        from one to the next (a worker's slot running partition after partition: the pool's
        checkout and return cost more than a tiny partition's own statements). It goes back to
        the pool on the way out, after a transaction that failed, and when its user changed its
        execution options or closed it, when it sat idle longer than :data:`HOLD_IDLE_S` or
        the pool invalidated its connections since it was made; a transaction begun inside
        another (the held connection busy) takes a connection of its own."""
        held = self._held
        if getattr(held, "on", False):
            yield
            return
        held.on = True
        try:
            yield
        finally:
            held.on = False
            self._let_go()

    def _let_go(self) -> None:
        conn = getattr(self._held, "conn", None)
        self._held.conn = None
        if conn is not None:
            conn.close()

    def _stale(self, conn: Connection) -> bool:
        """Whether the held connection must go back to the pool before its next transaction."""
        if (
            conn.closed
            or conn.invalidated
            or conn.get_execution_options() is not self.engine.get_execution_options()
            or time.monotonic() - getattr(self._held, "since", 0.0) > HOLD_IDLE_S
        ):
            return True
        # The pool invalidated every connection it had made before a disconnect it saw.
        record = getattr(conn.connection, "_connection_record", None)
        invalidated_at = getattr(self.engine.pool, "_invalidate_time", 0)
        return record is not None and getattr(record, "starttime", invalidated_at) < invalidated_at

    def _connect(self) -> tuple[Connection, bool]:
        """A connection for a transaction, and whether it is the one this thread holds."""
        held = self._held
        if not getattr(held, "on", False):
            return self.engine.connect(), False
        conn: Connection | None = getattr(held, "conn", None)
        if conn is not None:
            if conn.in_transaction():
                return self.engine.connect(), False  # the held one is busy: a nested run
            if not self._stale(conn):
                return conn, True
            self._let_go()
        conn = held.conn = self.engine.connect()
        return conn, True

    def close_with(self, conn: Connection, closing: Callable[[], None]) -> bool:
        """From inside :meth:`run`'s body on ``conn``: have ``closing`` end the transaction in
        place of its ``COMMIT`` (it sends the transaction's last statement with the ``COMMIT``
        behind it, in one round trip: see ``Prebuilt.one_committing``; one that finds it cannot
        do so sends the statement and leaves the commit to :meth:`run`). It runs after the
        body, once the fault points before ``COMMIT`` were reached, as a ``COMMIT`` would; a
        failure is judged as a failed ``COMMIT`` is (an unclear outcome is verified once the
        session is settled). False, registering nothing, outside a run on ``conn`` (the caller
        runs its statement now)."""
        local = self._held
        if getattr(local, "closable", None) is not conn or getattr(local, "closing", None):
            return False
        local.closing = closing
        return True

    def run(
        self,
        body: Callable[[Connection], T],
        *,
        verify: Callable[[Connection], bool] | None = None,
        point: str | Callable[[], Sequence[str]] | None = None,
        what: str = "transaction",
        **details: object,
    ) -> T:
        """Run ``body(conn)`` in a transaction and commit it.

        ``body`` must be repeatable: it is called again, in a new transaction, after a transient
        error, so it restores any in-memory state it changes before changing it. ``verify(conn)``
        says from the database whether a commit whose acknowledgement was lost took effect; a
        body without it is not repeated after an unclear commit. ``point`` names the fault point
        reached just before ``COMMIT`` (with ``conn`` and ``details``), or a callable naming
        those reached in order (asked after ``body``).
        """
        run = self._retry.start(what)
        local = self._held
        while True:
            committing = False
            session = None
            outer = getattr(local, "closable", None), getattr(local, "closing", None)
            try:
                conn, held = self._connect()
                done = False
                try:
                    transaction = conn.begin()
                    try:
                        local.closable, local.closing = conn, None
                        try:
                            result = body(conn)
                        finally:
                            closing = local.closing
                            local.closable, local.closing = outer
                        if isinstance(point, str):
                            points.reach(point, conn=conn, **details)
                        elif point is not None:
                            for name in point():
                                points.reach(name, conn=conn, **details)
                        points.reach("transaction.before_commit", conn=conn, **details)
                        session = self._session(conn)
                        committing = True
                        if closing is not None:
                            closing()
                        transaction.commit()
                        done = True
                    except BaseException:
                        if transaction.is_active:
                            _roll_back(conn, transaction, what)
                        raise
                finally:
                    if not held:
                        conn.close()
                    elif not done:
                        self._let_go()  # back to the pool, which judges it
                    else:
                        self._held.since = time.monotonic()
                return result
            except OptimisticLockingFailureError:
                raise
            except Exception as error:
                if not run.accepts(error):
                    raise
                if committing:
                    if verify is None:
                        raise UnclearCommitError(
                            f"{what}: the commit's outcome is unknown ({error})"
                        ) from error
                    if self._committed(verify, run, error, session):
                        return result
                if not run.again(error):
                    raise

    def read(self, work: Callable[[], T], what: str = "read") -> T:
        """Run a read (it commits nothing, so repeating it is always safe), repeating it on
        transient errors under the policy."""
        return self._retry.call(work, what)

    def _session(self, conn: Connection) -> Any | None:
        """The session about to send ``COMMIT`` (see :class:`Settling`), or None."""
        settling = self.settling
        if settling is None:
            return None
        info = conn.connection.info
        if "dbcluster_session" not in info:
            info["dbcluster_session"] = settling.session_of(conn.connection.dbapi_connection)
        return info["dbcluster_session"]

    def _committed(
        self,
        verify: Callable[[Connection], bool],
        run: Retrying,
        error: BaseException,
        session: Any | None = None,
    ) -> bool:
        """Read back whether an unclear commit took effect, while the database answers (until
        the deadline of ``run``, the transaction's repetitions), once the session that sent it
        is gone where the database can end it (see :class:`Settling`)."""
        what = run.what
        verifying = self._retry.but(attempts=None).start(what, deadline=run.deadline)
        settled = session is None or self.settling is None
        while True:
            try:
                if not settled:
                    assert self.settling is not None
                    deadline = run.deadline or time.monotonic() + self.policy.deadline_s
                    settled = settle_session(self.engine, self.settling, session, deadline)
                    if not settled:
                        raise UnclearCommitError(
                            f"{what}: the session that sent the commit could not be ended in "
                            f"time ({error})"
                        ) from error
                with self.engine.connect() as conn:
                    landed = verify(conn)
                # Judged from the database, nothing for a person to do: the outage that lost
                # it has its one WARNING (of the service or command that met it).
                log.info(
                    "%s: the commit's acknowledgement was lost; it %s",
                    what,
                    "took effect" if landed else "did not take effect",
                )
                return landed
            except OptimisticLockingFailureError:
                raise
            except Exception as again:
                if not verifying.again(again):
                    raise UnclearCommitError(
                        f"{what}: the commit's outcome is unknown ({error})"
                    ) from error
