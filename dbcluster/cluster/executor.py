"""The executor of a node's claimed partitions: each runs on a thread of its own under its fence.

The worker step runs with a :class:`~dbcluster.cluster.fencing.PartitionFence`: every one of its
transactions holds the partition row until ``COMMIT``, and its final transaction records the
partition's outcome with the step's. A partition whose fence is refused stops (it was taken
away: nothing of it commits any more); one whose outcome cannot be recorded is failed under its
fence once the database answers.

**A slot hands itself on.** Where the final write can claim in the same statement (see
``QueryProvider.fold_guard``), a partition that ends claims the next one its node knows is
waiting (``next_partitions``: what a wake-up or a poll named), and its thread runs that one next:
one COMMIT ends a partition and starts the next, with no claim, poll or thread hand-off between.
It is an ordinary claim (the partition was PENDING, it becomes CLAIMED and its step STARTED in
that COMMIT), so every fence holds as for any other; a claim that wins nothing frees the slot
and the poller takes over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING

from dbcluster.batch.domain import StepExecution, utcnow
from dbcluster.batch.fence import FencedError
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import commit_step
from dbcluster.batch.transactions import UnclearCommitError
from dbcluster.cluster.aftermath import Aftermath
from dbcluster.cluster.announce import Announcer
from dbcluster.cluster.claimed import ClaimedExecutions
from dbcluster.cluster.draining import Draining
from dbcluster.cluster.fencing import PartitionFence
from dbcluster.cluster.grouping import Grouping
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.patience import is_passing
from dbcluster.cluster.placed import PlacedRuns
from dbcluster.cluster.service import Outage
from dbcluster.cluster.store import ClaimedPartition, PendingPartition
from dbcluster.cluster.task import CLAIMED, DONE, RUNNING, Task
from dbcluster.retry import brief
from dbcluster.states import PARTITION_FAILED

if TYPE_CHECKING:
    from dbcluster.batch.registry import JobRegistry
    from dbcluster.batch.runtime import BatchRuntime
    from dbcluster.cluster.context import NodeContext
    from dbcluster.cluster.stopping import StopRequests

log = logging.getLogger("dbcluster.node")


#: The id of the node running the current partition (for logs and ledgers in user code).
current_node_id: ContextVar[str | None] = ContextVar("dbcluster_current_node_id", default=None)
#: The attempt (fencing token) of the partition being run.
current_attempt: ContextVar[int | None] = ContextVar("dbcluster_current_attempt", default=None)

#: The weight of the newest run in :attr:`Executor.recent_run_ms` (an exponential average).
_RUN_MS_WEIGHT = 0.2

#: How many ended partitions an executor remembers (see :meth:`Executor.take`).
_ENDED_KEPT = 4096


def _ended_key(p: PendingPartition) -> tuple[int, int, int, str]:
    """A partition at its attempt, as :attr:`Executor._ended` remembers it (its job and name
    too: SQLite may hand a pruned step execution's id out again)."""
    return (p.step_execution_id, p.attempt, p.job_execution_id, p.partition_name)


class Executor:
    """Runs claimed partitions on ``capacity`` threads, each a step of ``runtime``'s registry
    (``stop_requests`` watches their jobs while they run); ``on_free`` is called each time one
    of them ends (the poller may claim more)."""

    def __init__(
        self,
        context: NodeContext,
        runtime: BatchRuntime,
        *,
        capacity: int,
        stop_requests: StopRequests,
        on_free: Callable[[], None],
        next_partitions: Callable[[Identity, int], list[int]] | None = None,
        on_claim: Callable[[list[ClaimedPartition]], None] | None = None,
    ) -> None:
        if runtime.registry is None:
            raise ValueError("an executor of partitions needs a JobRegistry")
        self.context = context
        #: Up to so many PENDING partitions the node knows are waiting (taken from what it
        #: knows: each is named once), for a final write or a slot to claim next.
        self.next_partitions = next_partitions
        self.store = context.store
        self.runtime = runtime
        self.repository = runtime.repository
        self.registry: JobRegistry = runtime.registry
        self.capacity = capacity
        self.stop_requests = stop_requests
        self.on_free = on_free
        #: Told of every claim's partitions, whoever claimed them (the poller, a slot).
        self.on_claim = on_claim
        self.announce = Announcer(context.events)
        self._lock = threading.RLock()
        self._tasks: dict[int, Task] = {}
        #: Partitions this node ran or gave up lately (:func:`_ended_key`): a claim read back
        #: from a snapshot taken before one of them ended must not run it again. Every way a
        #: CLAIMED partition becomes claimable again moves its attempt on, so one claimed
        #: afresh is not taken for one of these.
        self._ended: OrderedDict[tuple[int, int, int, str], None] = OrderedDict()
        #: What claims won, as the batch model's objects (their jobs read once per node).
        self.claimed = ClaimedExecutions(self.repository)
        self._pool = ThreadPoolExecutor(self.capacity, thread_name_prefix="dbcluster-part")
        #: How long this node's partitions ran lately (an exponential average, milliseconds);
        #: None before the first one ended.
        self.recent_run_ms: float | None = None
        #: Claimed partitions run together (see :mod:`dbcluster.cluster.grouping`).
        self.grouping = Grouping(self, context.settings.commit_group_size)
        #: What a failed claim or final write left (see :mod:`dbcluster.cluster.aftermath`).
        self.aftermath = Aftermath(self)
        #: Partitions run before they were claimed (see :mod:`dbcluster.cluster.placed`).
        self.placed_runs = PlacedRuns(self)
        self.draining = Draining(self)
        #: Slots running (each a partition, a chain of them, or a group).
        self._busy = 0
        #: A database outage as this node's partitions meet it (see :meth:`met_outage`).
        self.outage = Outage("partitions", context.outages)

    @property
    def load(self) -> int:
        """Partitions held: running, or claimed and waiting for a slot."""
        with self._lock:
            return sum(1 for t in self._tasks.values() if t.state in (CLAIMED, RUNNING))

    def _ran_for(self, seconds: float) -> None:
        ms = seconds * 1000
        last = self.recent_run_ms
        self.recent_run_ms = ms if last is None else last + _RUN_MS_WEIGHT * (ms - last)

    def knows_job(self, job_execution_id: int) -> bool:
        """Whether this node has the job execution (its partitions need no read of it)."""
        return self.claimed.knows_job(job_execution_id)

    def holds(self, step_execution_id: int) -> bool:
        with self._lock:
            return step_execution_id in self._tasks

    def free_slots(self) -> int:
        """Slots running nothing."""
        with self._lock:
            return self.capacity - self._busy

    def submit(
        self, identity: Identity, claimed: list[ClaimedPartition], *, read_back: bool = False
    ) -> None:
        """Run partitions a claim won (their step executions are already STARTED): alone, or
        several in one transaction (see :mod:`dbcluster.cluster.grouping`). ``read_back``:
        they were read back after a claim failed (see :meth:`take`)."""
        tasks = self.take(identity, claimed, read_back=read_back)
        for batch in self.grouping.batches(tasks, self.free_slots()):
            with self._lock:
                self._busy += 1
            try:
                if len(batch) == 1:
                    self._pool.submit(self._run, batch[0])
                else:
                    self._pool.submit(self._run_group, batch)
            except RuntimeError:  # the pool shut down: the node is leaving
                with self._lock:
                    self._busy -= 1
                raise

    def take(
        self,
        identity: Identity,
        claimed: list[ClaimedPartition],
        after: str | None = None,
        *,
        read_back: bool = False,
    ) -> list[Task]:
        """Partitions a claim won (the final write of partition ``after``, when it was that),
        announced and held; one held already is not held twice (checked and held under one
        lock, so two threads reading back at once never both take a partition). A claim
        ``read_back`` after an error may also name, read before it ended, one this node has
        run since (:attr:`_ended`): it is not run again. Only a read back is checked so (a
        claim that just won a partition is never stale, and SQLite may hand a pruned
        partition's id out again)."""
        with self._lock:
            fresh = self._new(claimed, read_back)
            tasks = [Task(w.partition, identity) for w in fresh]
            for task in tasks:
                self._tasks[task.partition.step_execution_id] = task
        if not tasks:
            return []
        if read_back:
            log.info(
                "node %s: a claim that failed had landed; it runs the %d partition(s) it won",
                identity.node_id,
                len(tasks),
            )
        self.announce.claimed(identity.node_id, fresh, after)
        if self.on_claim is not None:
            self.on_claim(fresh)
        for task, won in zip(tasks, fresh, strict=True):
            task.preloaded = self.claimed.step_execution(won)
        return tasks

    def ended_lately(self, partition: PendingPartition) -> bool:
        """Whether this node ran or gave up this partition at this attempt lately (under the
        lock)."""
        return _ended_key(partition) in self._ended

    def claimed_placed(self, partitions: list[PendingPartition]) -> None:
        """Partitions taken to run before they were claimed: told as a claim's would be."""
        if self.on_claim is not None:
            self.on_claim([ClaimedPartition(p, {}) for p in partitions])  # type: ignore[arg-type]

    def _new(self, claimed: list[ClaimedPartition], read_back: bool) -> list[ClaimedPartition]:
        """Those of ``claimed`` this node does not hold, each once (under the lock); those it
        ended too, for a ``read_back``."""
        tasks, ended = self._tasks, self._ended
        new: dict[int, ClaimedPartition] = {}
        for won in claimed:
            p = won.partition
            if p.step_execution_id in tasks or p.step_execution_id in new:
                continue
            if read_back and _ended_key(p) in ended:
                continue
            new[p.step_execution_id] = won
        return list(new.values())

    # --- running a partition --------------------------------------------------------------------

    def _can_begin(self, task: Task) -> bool:
        """Whether ``task`` may start now (under the lock)."""
        return (
            task.state == CLAIMED
            and not task.identity.fenced.is_set()
            and not self.context.stopping
        )

    def _begin_all(self, tasks: list[Task]) -> bool:
        """Start every one of ``tasks`` (a group), or none."""
        with self._lock:
            if not all(self._can_begin(task) for task in tasks):
                return False
            for task in tasks:
                task.state = RUNNING
            return True

    def _unbegin(self, tasks: list[Task]) -> None:
        """Those of ``tasks`` still running are claimed again (a group that did not commit:
        each then runs alone)."""
        with self._lock:
            for task in tasks:
                if task.state == RUNNING:
                    task.state = CLAIMED

    @staticmethod
    def _entering(node_id: str, attempt: int) -> None:
        """The partition about to run, for user code (:data:`current_node_id`,
        :data:`current_attempt`)."""
        current_node_id.set(node_id)
        current_attempt.set(attempt)

    def _begin(self, task: Task) -> bool:
        with self._lock:
            if not self._can_begin(task):
                return False
            task.state = RUNNING
            return True

    def _run(self, task: Task) -> None:
        """A slot: the partition, then each one its final write claimed next, on one pooled
        connection held from one to the next (see :meth:`Transactions.holding`)."""
        try:
            with self.repository.transactions.holding():
                self._chain(task)
        finally:
            self._slot_ends()

    def _slot_ends(self) -> None:
        """A slot ran its last partition: it is free (counted so before the poller hears)."""
        with self._lock:
            self._busy -= 1
        self.on_free()

    def _chain(self, task: Task) -> None:
        following: Task | None = task
        while following is not None:
            following = self._run_one(following)

    def _run_group(self, tasks: list[Task]) -> None:
        """A slot given several partitions of one step: run together where they still can
        (see :mod:`dbcluster.cluster.grouping`), else each alone, one after another."""
        try:
            with self.repository.transactions.holding():
                while tasks:
                    alone = self.grouping.run(tasks)
                    for task in alone:
                        self._chain(task)
                    if alone:
                        return
                    identity = tasks[0].identity
                    for task in tasks:
                        self._forget(task)
                    # The slot's next group, claimed by the slot and run on it (see
                    # Grouping.refill); none: it is free, and the poller takes over.
                    won, read_back = self.grouping.refill(identity)
                    tasks = self.take(identity, won, read_back=read_back)
                    if tasks and not self.grouping.together(tasks):
                        for task in tasks:
                            self._chain(task)
                        return
        finally:
            self._slot_ends()

    def _run_one(self, task: Task) -> Task | None:
        p, identity = task.partition, task.identity
        following = None
        try:
            if not self._begin(task):
                if task.state == CLAIMED and self.context.stopping:
                    self._release(task)
                return None
            began = time.monotonic()
            self._execute(task)
            self._ran_for(time.monotonic() - began)
            self.grouping.ran_alone(task)
        except Exception as error:  # noqa: BLE001 - recorded once the database answers
            if identity.is_fenced or self.met_outage(error):
                # The database's passing trouble (the node's outage says so once), or a node
                # that may no longer write: its outcome is recorded once the database answers
                # (or left to its master).
                log.log(
                    logging.WARNING if identity.is_fenced else logging.INFO,
                    "node %s could not finish partition %s yet: %s",
                    identity.node_id,
                    p.partition_name,
                    brief(error),
                )
            else:
                log.exception(
                    "node %s failed to run partition %s", identity.node_id, p.partition_name
                )
            self.aftermath.fail_after_error(task, error)
        else:
            following = self._following(task)
        finally:
            # The next one is held before this one is forgotten: the slot never looks free
            # (it frees when its chain ends: Executor._slot_ends).
            self._forget(task)
        return following

    def _following(self, task: Task) -> Task | None:
        """The partition ``task``'s committed final write claimed next, held by this slot."""
        fence = task.fence
        if fence is None or fence.outcome is None:
            return None
        if fence.next_claim is None and fence.asked_for is not None:
            # The final write asked for one but its row never came back: its COMMIT (sent with
            # it) lost its acknowledgement and was found to have landed. What it claimed is
            # read back and runs as any other claim.
            self.aftermath.read_back_following(task)
            return None
        try:
            won = self.store.claimed_next(fence.next_claim)
            if won is None:
                return None
            taken = self.take(task.identity, [won], task.partition.partition_name)
            return taken[0] if taken else None
        except Exception:  # noqa: BLE001 - a bug: the claim stands, so it runs as any other
            log.exception(
                "node %s could not take the partition it claimed next", task.identity.node_id
            )
            self.aftermath.read_back_following(task)
            return None

    def _next_partition(self, identity: Identity) -> int | None:
        assert self.next_partitions is not None
        taken = self.next_partitions(identity, 1)
        return taken[0] if taken else None

    def _fence_for(self, task: Task, *, hand_on: bool = False) -> PartitionFence:
        p = task.partition
        next_partition = None
        if hand_on and self.next_partitions is not None:
            next_partition = partial(self._next_partition, task.identity)
        return PartitionFence(
            self.store,
            p.step_execution_id,
            task.identity.node_id,
            p.attempt,
            transferable=p.transferable,
            fenced=task.identity.fenced,
            stopping=lambda: self.context.stopping,
            max_attempts=p.max_attempts,
            retryable=lambda se: self._retryable(p.worker_step_name, se),
            next_partition=next_partition,
            outage=self.met_outage,
            placed=task.placed,
        )

    def met_outage(self, error: BaseException) -> bool:
        """Whether ``error``, what stopped a partition, is the database's passing trouble: then
        it is this node's outage, one WARNING when it begins however many partitions it
        interrupts (each says so at INFO), and one INFO once a partition's outcome is recorded
        again (:meth:`_recorded`)."""
        if not is_passing(self.store.provider, error):
            return False
        self.outage.began(error)
        return True

    def _retryable(self, worker_step_name: str, se: StepExecution) -> bool:
        """Whether a failed try is worth another: its partitioned step declares the failure
        retryable, or the failure is a transient database error."""
        step = self.registry.partition_step_of(worker_step_name)
        provider = self.store.provider
        return any(
            (step is not None and step.retryable(error))
            or provider.is_transient(error)
            or isinstance(error, UnclearCommitError)
            for error in se.failure_exceptions
        )

    def _execute(self, task: Task) -> None:
        p, identity = task.partition, task.identity
        se = task.preloaded or self.repository.get_step_execution(p.step_execution_id)
        if se is None:
            log.error("partition %s has no step execution", p.step_execution_id)
            return
        # A partition that could be grouped frees its slot as it ends (the poller claims the
        # next ones for a group) rather than claiming the next one alone.
        fence = self._fence_for(task, hand_on=not self.grouping.qualifies(p.worker_step_name))
        se.fence = fence
        with self._lock:
            task.step_execution = se
            task.fence = fence
            if identity.fenced.is_set():
                return
        # Its job's stop request reaches it through the node's periodic check (no read of its
        # own per chunk).
        stop_requests = self.stop_requests
        stop_requests.watch(se.job_execution)
        try:
            self._run_step(task, se, fence)
        finally:
            stop_requests.unwatch(se.job_execution)

    def _run_step(self, task: Task, se: StepExecution, fence: PartitionFence) -> None:
        p, identity = task.partition, task.identity
        try:
            step = self.registry.get_step(p.worker_step_name)
        except Exception as exc:  # noqa: BLE001 - recorded on the step execution
            self._end_without_running(
                task, se, f"node {identity.node_id} has no step {p.worker_step_name!r}: {exc}"
            )
            return
        current_node_id.set(identity.node_id)
        current_attempt.set(p.attempt)
        try:
            step.execute(se, self.runtime)
        except FencedError as exc:
            self._lost(task, str(exc))
            return
        self._recorded(task, fence.outcome, se)

    def _end_without_running(self, task: Task, se: StepExecution, message: str) -> None:
        se.status = BatchStatus.FAILED
        se.exit_status = ExitStatus.FAILED.with_description(message)  # type: ignore[attr-defined]
        se.end_time = utcnow()
        try:
            commit_step(se, self.runtime, final=True)
        except FencedError as exc:
            self._lost(task, str(exc))
            return
        assert isinstance(se.fence, PartitionFence)
        self._recorded(task, se.fence.outcome, se)

    def _recorded(self, task: Task, outcome: str | None, se: StepExecution) -> None:
        fence = se.fence
        if isinstance(fence, PartitionFence) and fence.finishing_since is not None:
            # A final write that began after the outage did and landed: it is over.
            self.outage.ended(fence.finishing_since)
        provider = self.store.provider
        errors = se.failure_exceptions
        # The exit description says why a partition failed (its outcome is PARTITION_FAILED
        # once its final write landed; the announcement reads it only then).
        self.announce.recorded(
            task.identity.node_id,
            task.partition,
            outcome,
            se.exit_status.description,
            outage=errors[0] if errors and all(is_passing(provider, e) for e in errors) else None,
        )

    def _recorded_failed(self, task: Task, why: str) -> None:
        """``task``'s partition recorded FAILED without its step execution (``why``)."""
        self.announce.recorded(task.identity.node_id, task.partition, PARTITION_FAILED, why)

    def _lost(self, task: Task, reason: str) -> None:
        self.announce.lost(task.identity.node_id, task.partition, reason)

    # --- handing back ---------------------------------------------------------------------------

    def _forget(self, task: Task) -> None:
        p = task.partition
        with self._lock:
            task.state = DONE
            if self._tasks.get(p.step_execution_id) is task:
                del self._tasks[p.step_execution_id]
            self._ended[_ended_key(p)] = None
            if len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)

    def on_fenced(self, identity: Identity) -> None:
        """The node fenced ``identity``: partitions claimed under it stop at their next boundary
        (their fences already refuse every write)."""
        with self._lock:
            for task in self._tasks.values():
                if task.identity is identity and task.step_execution is not None:
                    task.step_execution.terminate_only = True

    def drain(self, deadline: float) -> None:
        """A graceful stop (see :class:`~dbcluster.cluster.draining.Draining`)."""
        self.draining.drain(deadline)

    def _release(self, task: Task) -> None:
        self.draining.release(task)
