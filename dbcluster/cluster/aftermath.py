"""What a failed claim or final write leaves behind, settled once the database answers.

A claim that raised may have landed (its acknowledgement lost, its retries spent), and so may a
final write that claimed the next partition; a partition whose outcome could not be written is
still CLAIMED. Masters recover only the partitions of nodes that are gone, so a live node that
left any of these alone would hang its job: it reads back what it won and runs it, and records
what it could not, every heartbeat interval while the database's trouble lasts, until the node
is fenced or leaves (then its master decides). Only the database's passing trouble is waited
out. A read it refuses as it is (a schema this version cannot use, a bug) leaves the node
unable to tell what it holds: it gives up the identity those partitions were claimed under
(fenced, it joins again under a new id, and their masters recover them once the old one is
removed), with one ERROR: a person must mend what the database refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from dbcluster.batch.fence import FencedError
from dbcluster.batch.step import commit_step
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.patience import is_passing
from dbcluster.cluster.store import ClaimedPartition, NodeRemovedError
from dbcluster.cluster.store.verify import partition_is
from dbcluster.cluster.task import Task
from dbcluster.retry import Retry, brief
from dbcluster.states import PARTITION_FAILED

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from dbcluster.batch.domain import StepExecution
    from dbcluster.batch.repository import JobRepository
    from dbcluster.batch.runtime import BatchRuntime
    from dbcluster.cluster.context import NodeContext
    from dbcluster.cluster.fencing import PartitionFence
    from dbcluster.cluster.store import CoordinationStore

log = logging.getLogger("dbcluster.node")


class Slots(Protocol):
    """What the aftermath uses of the executor whose claims and runs it settles
    (:class:`~dbcluster.cluster.executor.Executor`)."""

    context: NodeContext
    store: CoordinationStore
    repository: JobRepository
    runtime: BatchRuntime

    @property
    def load(self) -> int: ...

    def submit(
        self, identity: Identity, claimed: list[ClaimedPartition], *, read_back: bool = False
    ) -> None: ...

    def holds(self, step_execution_id: int) -> bool: ...

    def _fence_for(self, task: Task, *, hand_on: bool = False) -> PartitionFence: ...

    def _end_without_running(self, task: Task, se: StepExecution, message: str) -> None: ...

    def met_outage(self, error: BaseException) -> bool: ...

    def _recorded(self, task: Task, outcome: str | None, se: StepExecution) -> None: ...

    def _recorded_failed(self, task: Task, why: str) -> None: ...


class Aftermath:
    """The :mod:`aftermath <dbcluster.cluster.aftermath>` of an executor's claims and runs."""

    def __init__(self, executor: Slots) -> None:
        self.executor = executor
        self.context = executor.context
        self.store = executor.store

    def _every_heartbeat(
        self, identity: Identity, retry_on: Callable[[BaseException], bool]
    ) -> Retry:
        """Tries of work that must be done (what a landed claim won, an outcome to record):
        every heartbeat interval after an error ``retry_on`` accepts (said once for the whole
        wait: :meth:`_waiting`), until the node no longer acts under ``identity``
        (:meth:`gone`); a fenced write is never tried again."""
        return Retry.every(
            self.context.settings.heartbeat_interval / 1000,
            lambda exc: not isinstance(exc, FencedError) and retry_on(exc),
            give_up=lambda: self.gone(identity),
            on_retry=self._waiting,
        )

    def _waiting(self, what: str, attempt: int, error: BaseException) -> None:
        """A wait's one line, "<what> yet: <error>": INFO when ``error`` is the database's
        passing trouble (the node's outage has its one WARNING: see
        :meth:`Executor.met_outage <dbcluster.cluster.executor.Executor.met_outage>`), else a
        WARNING."""
        if attempt != 1:
            return
        level = logging.INFO if self.executor.met_outage(error) else logging.WARNING
        log.log(level, "%s yet: %s", what, brief(error))

    def _until_read(self, identity: Identity) -> Retry:
        """Tries of a read that must be made: while the database's trouble passes. Anything
        else (a statement the database refuses as it is) is not waited out: it is raised."""
        return self._every_heartbeat(identity, lambda exc: is_passing(self.store.provider, exc))

    def gone(self, identity: Identity) -> bool:
        """Whether the node no longer acts under ``identity``: fenced, leaving, or joined again
        under another (its master recovers what ``identity`` held)."""
        membership = self.context.membership
        return identity.fenced.is_set() or membership.stopping or membership.current is not identity

    def read_back_claim(self, identity: Identity, ids: list[int]) -> list[ClaimedPartition]:
        """After a claim of ``ids`` failed (past its retries, or with an unclear commit it
        could not judge): those of them this node holds CLAIMED, read as an unclear claim is
        judged (its own row locked first) once the database answers, every heartbeat interval
        until the node is fenced or leaves. A claim that landed and was never read back would
        leave its partitions CLAIMED on a live node that does not run them: their masters
        recover only the partitions of nodes that are gone, so the job would hang. A read the
        database refuses as it is (not its passing trouble) gives the identity up
        (:meth:`_give_up`)."""
        if self.gone(identity):
            return []
        node_id = identity.node_id
        reading = self._until_read(identity)
        try:
            won = reading.call(
                lambda: self.store.read_back(node_id, self.executor.load, ids),
                f"node {node_id} cannot read back a failed claim",
            )
        except NodeRemovedError as exc:
            self.context.fence(identity, str(exc))
            return []
        except Exception as exc:  # noqa: BLE001 - see the docstring
            self._give_up(identity, "could not read back a claim that failed", exc)
            return []
        return won

    def run_read_back(self, identity: Identity, ids: list[int]) -> None:
        """:meth:`read_back_claim`, and what it finds runs (nothing once the node is leaving:
        the slots shut down, its masters recover them)."""
        won = self.read_back_claim(identity, ids)
        try:
            self.executor.submit(identity, won, read_back=True)
        except RuntimeError:
            log.info("node %s is leaving: what a failed claim won goes back", identity.node_id)

    def read_back_following(self, task: Task) -> None:
        """:meth:`_adopt_following`, tried again (every heartbeat interval) while the database
        does not answer, until the node is fenced or leaves: a partition claimed by a landed
        write and never read back would stay CLAIMED on a live node."""
        identity = task.identity
        reading = self._until_read(identity)
        try:
            reading.call(
                lambda: self._adopt_following(task),
                f"node {identity.node_id} cannot read the partition it claimed next",
            )
        except Exception as exc:  # noqa: BLE001 - fenced or leaving: its master recovers it
            self._give_up(identity, "could not read back the partition it claimed next", exc)

    def _give_up(self, identity: Identity, failed: str, error: BaseException) -> None:
        """A read back or a partition's end that cannot be made (``failed`` says which; ``error``
        is not the database's passing trouble): what ``identity`` claimed may stand CLAIMED with
        no thread to run it, and only a node that is gone has its partitions recovered. So the
        node gives the identity up (it joins again under a new id; the old one is removed and
        its masters recover what it held), unless it is gone already."""
        if self.gone(identity):
            return
        reason = f"{failed}: {brief(error)}"
        log.error(
            "node %s %s; it gives this id up so that its masters recover what it holds",
            identity.node_id,
            reason,
        )
        self.context.fence(identity, reason)

    def fail_after_error(self, task: Task, error: BaseException) -> None:
        """The step could not record its outcome (its final transaction failed beyond the retry
        budget, or its commit's outcome stayed unknown). A partition left CLAIMED on a live node
        is never looked at again (masters recover partitions of nodes that are gone), so record
        its end under the fence once the database answers, unless the step's own final commit
        landed after all (the step row's version moved on). A fenced or leaving node leaves it
        to the master.

        A step that concluded (COMPLETED, FAILED or STOPPED in memory: every write of its work
        committed, only its final write failed) gets that same final write, judged as it would
        have been: a completed step is recorded COMPLETED (never run again), a failed one is
        tried again only if its failure is retryable. A step that did not get as far is judged
        on ``error``, what stopped it: a transferable partition that a database outage stopped
        is tried again while it has tries left.

        Only the database's passing trouble is waited out (every heartbeat interval). A final
        write the database refuses as it is (a context value too long for its column, say)
        would be refused every time: the partition is recorded FAILED from what the database
        holds of it instead, with the reason (:meth:`_record_refused`), so its job ends rather
        than hangs. If even that is refused, or the step execution cannot be read (to judge
        its end), the partition is failed where it is, by a guarded write that reads nothing of
        it (:meth:`_fail_unread`). Only if that too is refused, or its guard finds the partition
        gone after a final write that asked to claim the next one (which, if it landed, is
        CLAIMED here, unread), does the node give the identity up with one ERROR
        (:meth:`_give_up`): its master recovers what it holds. Not at once: a transferable
        partition would be placed, at the same attempt, on a node refused the same way, which
        would give its own id up in turn, without end."""
        identity = task.identity
        if self.gone(identity):  # then its master decides
            return
        provider = self.store.provider
        recording = self._every_heartbeat(identity, lambda exc: is_passing(provider, exc))
        what = f"cannot record partition {task.partition.step_execution_id}"
        try:
            recording.call(lambda: self._record_after_error(task, error), what)
            return
        except FencedError:  # its master decides
            return
        except Exception as exc:  # noqa: BLE001 - see the docstring
            refused: BaseException = exc
        try:
            if self.gone(identity):
                return
            if recording.call(lambda: self._fail_unread(task, refused), what):
                return
            if not self._may_hold_following(task):  # the partition is not this node's now
                return
        except FencedError:
            return
        except Exception as exc:  # noqa: BLE001 - see the docstring
            refused = exc
        if not self.gone(identity):  # else given up as the node leaves: not ours
            name = task.partition.partition_name
            self._give_up(identity, f"could not record the end of partition {name}", refused)

    def _fail_unread(self, task: Task, refused: BaseException) -> bool:
        """The end of ``task``'s partition cannot be judged or written as the step left it
        (``refused``: its step execution's read, or its write, refused as it is): the partition
        ends FAILED in one transaction that reads nothing of it, its row's guard first (CLAIMED
        by this node under its attempt), then its step execution's status (as a master fails
        a lost partition; its counters and context stay as last committed). Whether the guard
        held: not, when its final write landed after all or the partition moved. A
        transferable partition is not put back: the next node would be refused the same
        way."""
        p, identity = task.partition, task.identity
        node_id, store = identity.node_id, self.store
        message = (
            f"node {node_id} could not read or record the end of partition "
            f"{p.partition_name}: {brief(refused)}"
        )

        def work(conn: Connection) -> bool:
            if identity.fenced.is_set():
                raise FencedError(f"node {node_id} is fenced")
            ended = store.end_partition(
                conn, PARTITION_FAILED, p.step_execution_id, node_id, p.attempt, placed=task.placed
            )
            if ended != 1:
                return False
            self.executor.repository.fail_running(
                message, conn, step_execution_id=p.step_execution_id
            )
            return True

        verify = partition_is(
            p.step_execution_id, PARTITION_FAILED, node_id, p.attempt, store.provider.locked
        )
        if not store.transaction(work, "fail partition", lambda c: True if verify(c) else None):
            return False
        log.error(
            "node %s could not read or record the end of partition %s (%s): %s; it is recorded "
            "FAILED as last committed",
            node_id,
            p.partition_name,
            p.step_execution_id,
            brief(refused),
        )
        self.executor._recorded_failed(task, message)
        return True

    def _record_after_error(self, task: Task, error: BaseException) -> None:
        """One try of :meth:`fail_after_error`."""
        p, identity = task.partition, task.identity
        ran = task.step_execution
        se = self.executor.repository.get_step_execution(p.step_execution_id)
        if se is None:
            return
        if ran is not None and se.version != ran.version:
            # Its final commit landed after all (with the partition's outcome, and with the
            # claim of the next partition it made, which this node now runs), or its master
            # ended it (after taking the partition away).
            self._adopt_following(task)
            return
        if ran is None and not se.status.is_running:
            return
        fence = self.executor._fence_for(task)
        if ran is not None and not ran.status.is_running:
            ran.fence = fence
            try:
                commit_step(ran, self.executor.runtime, final=True)
            except FencedError:
                raise
            except Exception as refused:
                if is_passing(self.store.provider, refused):
                    raise
                self._record_refused(task, se, ran, refused)
                return
            self.executor._recorded(task, fence.outcome, ran)
            return
        se.fence = fence
        se.failure_exceptions.append(error)
        self.executor._end_without_running(
            task,
            se,
            f"node {identity.node_id} could not record the outcome of partition {p.partition_name}",
        )

    def _record_refused(
        self, task: Task, se: StepExecution, ran: StepExecution, refused: BaseException
    ) -> None:
        """The end of ``ran`` (its step concluded here) was refused as it is (``refused``, not
        the database's passing trouble): the partition ends FAILED as the database holds it
        (``se``: its context as last committed), its exit description saying how the step had
        ended and what was refused, for a person to judge before a restart runs it again. Not
        tried again: what was refused would be refused again."""
        p = task.partition
        log.error(
            "node %s could not record the end of partition %s (%s): %s; recording it FAILED",
            task.identity.node_id,
            p.partition_name,
            p.step_execution_id,
            brief(refused),
        )
        se.fence = self.executor._fence_for(task)
        se.failure_exceptions.append(refused)
        self.executor._end_without_running(
            task,
            se,
            f"partition {p.partition_name} ended {ran.status.value} on node "
            f"{task.identity.node_id}, but its end could not be written: {brief(refused)}",
        )

    def _may_hold_following(self, task: Task) -> bool:
        """Whether the final write of ``task`` asked to claim a partition next that this node
        does not run: if that write landed, the partition is CLAIMED here, unread."""
        fence = task.fence
        following = None if fence is None else fence.asked_for
        return following is not None and not self.executor.holds(following)

    def _adopt_following(self, task: Task) -> None:
        """After a final write whose COMMIT was unclear and landed: the partition it claimed
        next (if it asked for one) is this node's now, and runs like any other claim."""
        fence = task.fence
        following = None if fence is None else fence.asked_for
        identity = task.identity
        if following is None or self.executor.holds(following):
            return
        try:
            won = self.store.read_back(identity.node_id, self.executor.load, [following])
        except NodeRemovedError as exc:
            self.context.fence(identity, str(exc))
            return
        if won:
            self.executor.submit(identity, won, read_back=True)
