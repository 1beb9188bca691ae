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
    """

    is_transient: Callable[[BaseException], bool] = connection_invalidated
    attempts: int = 5
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

    def __init__(self, engine: Engine, policy: RetryPolicy | None = None) -> None:
        self.engine = engine
        self.policy = policy or RetryPolicy()
        self._retry = self.policy.retry()
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
        while True:
            committing = False
            try:
                conn, held = self._connect()
                done = False
                try:
                    transaction = conn.begin()
                    try:
                        result = body(conn)
                        if isinstance(point, str):
                            points.reach(point, conn=conn, **details)
                        elif point is not None:
                            for name in point():
                                points.reach(name, conn=conn, **details)
                        points.reach("transaction.before_commit", conn=conn, **details)
                        committing = True
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
                    if self._committed(verify, run, error):
                        return result
                if not run.again(error):
                    raise

    def read(self, work: Callable[[], T], what: str = "read") -> T:
        """Run a read (it commits nothing, so repeating it is always safe), repeating it on
        transient errors under the policy."""
        return self._retry.call(work, what)

    def _committed(
        self, verify: Callable[[Connection], bool], run: Retrying, error: BaseException
    ) -> bool:
        """Read back whether an unclear commit took effect, while the database answers (until
        the deadline of ``run``, the transaction's repetitions)."""
        what = run.what
        verifying = self._retry.but(attempts=None).start(what, deadline=run.deadline)
        while True:
            try:
                with self.engine.connect() as conn:
                    landed = verify(conn)
                log.warning(
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
