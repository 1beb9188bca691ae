"""The fence of a partition run by a worker: its partition row, held at commit time.

Every transaction of a running partition (its step's start write, each chunk or tasklet call, and
its final write) holds the partition row with a guarded ``UPDATE`` on (id, node, attempt,
CLAIMED) that must change exactly one row; the final transaction records the partition's outcome
with the same guard instead. Every transition that takes a partition away from its node
(reassignment, failing it, abandoning its job, removing its node, a timeout) updates that same
row, so it either waits for the worker's ``COMMIT`` or is seen by it, and then the worker's whole
transaction rolls back.

A partition run before it was claimed (``placed``: a wake-up carried its execution to an idle
node, see :mod:`dbcluster.cluster.offers`) is claimed by its first transaction: every guard also
accepts the row PENDING on this node under this attempt, and a transaction that holds it leaves
it CLAIMED. Only transactional steps run so (every effect of a call in the call's transaction),
so nothing of a run whose partition moved before its first ``COMMIT`` is left behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from dbcluster.batch.domain import StepExecution, utcnow
from dbcluster.batch.fence import FencedError, FoldedGuard
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.store.verify import partition_is
from dbcluster.states import (
    PARTITION_CLAIMED,
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_PENDING,
    PARTITION_RELEASED,
    PARTITION_RETRIED,
)

if TYPE_CHECKING:
    from dbcluster.cluster.store import CoordinationStore

#: The outcome of a transferable partition stopped by a graceful shutdown: handed back.
RELEASED = PARTITION_RELEASED
#: The outcome of a failed try of a transferable partition that gets another: back to PENDING.
RETRIED = PARTITION_RETRIED


class PartitionFence:
    """Holds ``(step_execution_id, node_id, attempt)`` of one claimed partition.

    ``fenced`` is the node identity's fenced flag: once set, nothing more is even attempted.
    ``stopping`` says whether the node is leaving (a STOPPED transferable partition is then
    handed back rather than failed). A FAILED transferable partition with tries left
    (``attempt < max_attempts``) whose failure ``retryable`` accepts is put back for another
    try instead of failed. ``outage(error)`` says whether ``error`` is the database's passing
    trouble and reports it as the node's outage (see :meth:`met_outage`).
    """

    def __init__(
        self,
        store: CoordinationStore,
        step_execution_id: int,
        node_id: str,
        attempt: int,
        *,
        transferable: bool,
        fenced: threading.Event,
        stopping: Callable[[], bool],
        max_attempts: int = 1,
        retryable: Callable[[StepExecution], bool] = lambda _: False,
        next_partition: Callable[[], int | None] | None = None,
        outage: Callable[[BaseException], bool] | None = None,
        placed: bool = False,
    ) -> None:
        self.store = store
        #: Whether the partition may still be PENDING on this node (run before it was claimed):
        #: its guards accept that too, and claim it.
        self.placed = placed
        self.step_execution_id = step_execution_id
        self.node_id = node_id
        self.attempt = attempt
        self.transferable = transferable
        self.fenced = fenced
        self.stopping = stopping
        self.max_attempts = max_attempts
        self.retryable = retryable
        #: The partition status the final transaction recorded (last try).
        self.outcome: str | None = None
        #: Names a PENDING partition for the final write to claim next for this node (None:
        #: none known), asked once; see :meth:`finish_guard`.
        self.next_partition = next_partition
        self._next: int | None = None
        self._asked = False
        #: What the final write's claim of the next partition read back (its last try), when
        #: it was written: a row whose ``p_id`` is NULL when that partition was not won.
        self.next_claim: Any | None = None
        self.outage = outage
        #: When the final write's last try began (monotonic), None before one did: a final
        #: write that landed proves the database answered from then on.
        self.finishing_since: float | None = None
        #: What the guard of the transaction under way writes: CLAIMED (a hold) or the
        #: outcome (a final write); see :meth:`landed`.
        self._writing: str | None = None

    def _refuse(self, why: str) -> FencedError:
        return FencedError(
            f"partition {self.step_execution_id} is no longer held by {self.node_id} under "
            f"attempt {self.attempt}: {why}; this transaction was rolled back"
        )

    def met_outage(self, error: BaseException) -> bool:
        """Whether the step's failure ``error`` is the database's passing trouble, which its
        node reports once per outage (the step then says so at INFO): not for a fenced node,
        whose failures are its own to report."""
        return not self.fenced.is_set() and self.outage is not None and self.outage(error)

    def hold(self, conn: Connection) -> None:
        if self.fenced.is_set():
            raise self._refuse(f"node {self.node_id} is fenced")
        self._writing = PARTITION_CLAIMED
        held = self.store.hold_partition(
            conn, self.step_execution_id, self.node_id, self.attempt, placed=self.placed
        )
        if held != 1:
            raise self._refuse("it moved")

    def finish(self, conn: Connection, execution: Any) -> None:
        if self.fenced.is_set():
            raise self._refuse(f"node {self.node_id} is fenced")
        assert isinstance(execution, StepExecution)
        self.finishing_since = time.monotonic()
        outcome = self._writing = self.outcome_of(execution)
        changed = self.store.end_partition(
            conn, outcome, self.step_execution_id, self.node_id, self.attempt, placed=self.placed
        )
        if changed != 1:
            raise self._refuse("it moved")
        self.outcome = outcome

    def finish_guard(self, execution: Any) -> FoldedGuard | None:
        """:meth:`finish` as a guard the step's final write runs in its own statement, where
        the store has it as one statement (see :class:`~dbcluster.batch.fence.FoldedGuard`)."""
        if self.fenced.is_set():
            raise self._refuse(f"node {self.node_id} is fenced")
        assert isinstance(execution, StepExecution)
        self.finishing_since = time.monotonic()
        outcome = self._writing = self.outcome_of(execution)
        statement = self.store.end_partition_statement(outcome, self.placed)
        if statement is None:
            return None

        def done() -> None:
            self.outcome = outcome

        def took(row: Any) -> None:
            self.next_claim = row

        self.next_claim = None
        following = self._following(outcome)
        return FoldedGuard(
            statement,
            {"b_id": self.step_execution_id, "b_node": self.node_id, "b_attempt": self.attempt},
            refused=lambda: self._refuse("it moved"),
            done=done,
            then_params=(
                None
                if following is None
                else {"n_id": following, "n_node": self.node_id, "n_started_at": utcnow()}
            ),
            took=took,
        )

    def landed(self, conn: Connection) -> bool:
        """After an unclear COMMIT (with the step execution's version check): whether the
        partition row is as this transaction's guard left it. A placed run's step row is
        written by others as a matter of course (a steal's claim, a stop: version 0 -> 1), so
        its version alone does not say the write was this node's. Always True for a claimed
        partition (no one else writes its step row but the masters that fence it)."""
        if not self.placed or self._writing is None:
            return True
        if self._writing in (RELEASED, RETRIED):
            want: tuple[Any, ...] = (PARTITION_PENDING, None, self.attempt + 1)
        else:
            want = (self._writing, self.node_id, self.attempt)
        return partition_is(self.step_execution_id, *want, self.store.provider.locked)(conn)

    @property
    def asked_for(self) -> int | None:
        """The partition the final write was asked to claim next (None: none)."""
        return self._next

    def _following(self, outcome: str) -> int | None:
        """The partition the final write claims next: one the node knows is waiting, asked
        once (a try that is repeated claims the same one), never while the node leaves or for
        a partition handed back because it does."""
        if outcome == RELEASED or self.stopping() or self.next_partition is None:
            return None
        if not self._asked:
            self._asked = True
            self._next = self.next_partition()
        return self._next

    def outcome_of(self, execution: StepExecution) -> str:
        if execution.status is BatchStatus.COMPLETED:
            return PARTITION_COMPLETED
        if (
            execution.status is BatchStatus.STOPPED
            and self.stopping()
            and self.transferable
            and not execution.job_execution.stop_requested  # its job is stopping: it ends
        ):
            return RELEASED
        if (
            execution.status is BatchStatus.FAILED
            and self.transferable
            and self.attempt < self.max_attempts
            and self.retryable(execution)
        ):
            return RETRIED
        return PARTITION_FAILED
