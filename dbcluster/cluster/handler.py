"""The per-job master of a partitioned step: places its partitions on live nodes and sees them
through.

It runs on the node that launched the job, inside the partition step, behind the same interface
as :class:`~dbcluster.batch.local.LocalPartitionHandler`. Workers never call it and it never calls
workers: every decision is a read or a guarded write of coordination rows, and every write holds
the job's :class:`~dbcluster.cluster.mastership.Mastership` in its own transaction.

A master rides out a database outage as a node does: it keeps monitoring (read errors are
retried), and only when its node fences itself does it stop, leaving the job to the survivors.
It never fails work because of its own connectivity.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dbcluster import points
from dbcluster.batch.domain import PartitionsEnded, StepExecution
from dbcluster.batch.fence import FencedError
from dbcluster.cluster.assignment import AssignmentStrategy, LeastLoaded, RoundRobin
from dbcluster.cluster.mastership import Mastership, MastershipLostError
from dbcluster.cluster.patience import Patience, is_connectivity_error
from dbcluster.cluster.placement import NoLiveNodeError, Placer, Planned
from dbcluster.cluster.service import Outage
from dbcluster.cluster.store import OrphanedPartition
from dbcluster.errors import ConfigurationError
from dbcluster.states import (
    COORD_MASTERED,
    PARTITION_CLAIMED,
    PARTITION_FAILED,
    PARTITION_IN_FLIGHT,
    PARTITION_PENDING,
)

if TYPE_CHECKING:
    from dbcluster.batch.partition import PartitionStep
    from dbcluster.batch.repository import JobRepository
    from dbcluster.batch.runtime import BatchRuntime
    from dbcluster.cluster.context import NodeContext

log = logging.getLogger("dbcluster.master")

__all__ = [
    "ClusterPartitionHandler",
    "MastershipLostError",
    "NoLiveNodeError",
    "describe",
    "is_connectivity_error",
]


#: The master's first look at a partitioned step's progress after placing it (milliseconds).
FIRST_CHECK_MS = 5


class CheckPace:
    """When a master looks at its partitions next: soon after placing them, then at doubling
    intervals up to ``max_ms`` while none has ended; once they are ending, at half the time the
    ones still in flight need at the pace seen since the last look that found some ended
    (within ``first_ms`` and ``max_ms``), so the step's end is seen a few milliseconds after
    it, not up to ``max_ms`` later. A look that finds none ended since (a group of partitions
    ends all at once) waits twice its last pause: falling back to the doubling the first looks
    grew would wait ``max_ms`` once that reached it, and a drain's end was then seen up to half
    a second late."""

    def __init__(self, first_ms: float, max_ms: float) -> None:
        self.first_ms = min(first_ms, max_ms)
        self.max_ms = max_ms
        self._doubling = self.first_ms
        #: The last look that found fewer in flight (or the first look): seconds, count.
        self._last: tuple[float, int] | None = None
        #: The last pause chosen from the pace seen (None: none has ended yet).
        self._pause: float | None = None

    def backoff_ms(self) -> float:
        """The pause after a look that found nothing (the database did not answer)."""
        pause = self._doubling
        self._doubling = min(self._doubling * 2, self.max_ms)
        return pause

    def next_ms(self, in_flight: int, now: float) -> float:
        """The pause after a look at ``now`` (seconds, monotonic) found ``in_flight``."""
        last = self._last
        if last is not None and now > last[0] and in_flight < last[1]:
            self._last = (now, in_flight)
            per_ms = (last[1] - in_flight) / ((now - last[0]) * 1000)
            self._pause = max(self.first_ms, min(self.max_ms, in_flight / per_ms / 2))
            return self._pause
        if last is None or in_flight > last[1]:
            self._last = (now, in_flight)
        if self._pause is None:
            return self.backoff_ms()
        self._pause = min(self.max_ms, self._pause * 2)
        return self._pause


class ClusterPartitionHandler:
    """Runs a partition step's partitions across the cluster, with this node as master."""

    #: handle() reads what the step aggregates of its partitions once they have all ended (a
    #: :class:`~dbcluster.batch.domain.PartitionsEnded`, see
    #: :class:`~dbcluster.batch.partition.PartitionHandler`); the step does not read them again.
    returns_stored = True

    def __init__(
        self,
        context: NodeContext,
        repository: JobRepository,
        strategy: AssignmentStrategy | None = None,
        *,
        offer: Callable[[str, Sequence[int]], None] | None = None,
        no_node_timeout_ms: int | None = None,
    ) -> None:
        self.context = context
        self.store = context.store
        self.repository = repository
        #: Hands the partitions placed on this node to its own worker (a master that is also a
        #: worker starts them without a poll): ``offer(node_id, step_execution_ids)``.
        self.offer = offer
        self.patience = Patience.of(context)
        self.placer = Placer(
            context,
            strategy or RoundRobin(),
            context.settings.no_node_timeout if no_node_timeout_ms is None else no_node_timeout_ms,
            self.patience,
        )
        #: Called with (master step execution id, partition counts by status) on each check.
        self.progress: Callable[[int, dict[str, int]], None] | None = None

    @property
    def strategy(self) -> AssignmentStrategy:
        return self.placer.strategy

    @strategy.setter
    def strategy(self, strategy: AssignmentStrategy) -> None:
        self.placer.strategy = strategy

    @property
    def no_node_timeout_ms(self) -> int:
        return self.placer.no_node_timeout_ms

    @no_node_timeout_ms.setter
    def no_node_timeout_ms(self, ms: int) -> None:
        self.placer.no_node_timeout_ms = ms

    def handle(
        self, step: PartitionStep, master: StepExecution, runtime: BatchRuntime
    ) -> list[StepExecution] | PartitionsEnded:
        job_execution = master.job_execution
        mastership = job_execution.fence
        if not isinstance(mastership, Mastership):
            raise ConfigurationError(
                f"partition step {step.name!r} is handled by the cluster, so its job must be "
                f"launched through dbcluster.cluster.Cluster (launch or restart)"
            )
        # What the launch's transaction did for this step: its placement, or the partitioner's
        # result for a placement here (see Placer.place_at_launch).
        prepared, master.prepared = master.prepared, None
        planned = prepared if isinstance(prepared, Planned) else None
        placed = None if planned is not None else prepared
        if planned is not None and planned.error is not None:
            raise planned.error  # the partitioner failed in the launch's transaction
        # A master step execution this process has just created has no partitions yet.
        placed_before = (
            []
            if master.fresh or placed is not None
            else self.patience.run(
                mastership, lambda: self.store.partitions(master.id), "read the partitions"
            )
        )
        if placed_before:
            # A master that took over this job adopts the partitions its predecessor placed:
            # running ones run on where they are, pending ones are claimed or moved as usual.
            ids = [int(r.step_execution_id) for r in placed_before]
            log.info(
                "master %s adopted %d partition(s) of %s",
                mastership.node_id,
                len(ids),
                step.name,
            )
        else:
            if placed is None:
                workers = self.placer.wait_for_workers(mastership)
                # The partitioner runs before the transaction: user code must not hold the write
                # lock (SQLite has one for the whole database) while it reads its input.
                slices = planned.slices if planned is not None else step.plan(master, len(workers))
                points.reach("master.before_place", job_execution=job_execution)
                placed = self.placer.place(step, master, runtime, mastership, workers, slices)
            works, placement, placed_on = placed
            if not works:
                return []
            ids = [w.step_execution.id for w in works]
            log.info(
                "master %s placed %d partition(s) of %s on %d node(s) (%s)",
                mastership.node_id,
                len(works),
                step.name,
                len(set(placement.values())),
                type(self.strategy).__name__,
            )
            self.context.events.placed(mastership.node_id, job_execution.id, master.id, placement)
            # A master that is also a worker starts what it placed on itself without a poll.
            if self.offer is not None:
                self.offer(mastership.node_id, placed_on.get(mastership.node_id, []))
        with self.context.masters.mastering():
            try:
                self._monitor(step, master, mastership, placed_now=not placed_before)
            except FencedError:
                raise
            except Exception as error:
                # A bug, not the database: nothing of this step may go on running, or a restart
                # would run it beside the old attempt.
                self._fail_in_flight(mastership, f"master {mastership.node_id} failed: {error}")
                raise
        return self.patience.run(
            mastership,
            lambda: runtime.repository.partitions_ended(ids),
            "read the partitions' outcome",
        )

    # --- monitoring ---------------------------------------------------------------------------

    def _monitor(
        self,
        step: PartitionStep,
        master: StepExecution,
        mastership: Mastership,
        *,
        placed_now: bool,
    ) -> None:
        """Watch the step's partitions until none is in flight. ``placed_now``: this master has
        just placed them (on nodes it read as live), so nothing can have ended or been
        orphaned yet: the first look waits ``FIRST_CHECK_MS`` and the first orphan check a
        whole ``orphan_check_interval``, which keeps the master's statements out of the
        window in which a worker claims and starts what was placed. A master that adopted
        its partitions looks, and checks for orphans, at once."""
        store, settings = self.store, self.context.settings
        no_node_since: float | None = None
        # The node's outages: one WARNING for one, however many of its services and masters
        # meet it (see cluster/service.py).
        outage = Outage("master", self.context.outages, who=f"master {mastership.node_id}")
        # A short step ends within milliseconds of its placement: look soon, then at doubling
        # intervals up to master_check_interval, sooner while partitions are ending.
        pace = CheckPace(FIRST_CHECK_MS, settings.master_check_interval)
        last_orphan_check = time.monotonic() if placed_now else 0.0
        if placed_now:
            time.sleep(pace.first_ms / 1000)
        while True:
            points.reach("master.monitor", node_id=mastership.node_id)
            mastership.check()
            try:
                counts = store.counts(master.id)
                outage.ended()  # (if it met one) the database answers again
                if self.progress is not None:
                    self.progress(master.id, counts)
                in_flight = sum(counts.get(s, 0) for s in PARTITION_IN_FLIGHT)
                if not in_flight:
                    return
                pause_ms = pace.next_ms(in_flight, time.monotonic())
                if master.job_execution.stop_requested and counts.get(PARTITION_PENDING):
                    self._stop_pending(master.id, mastership)
                now = time.monotonic()
                if (now - last_orphan_check) * 1000 >= settings.orphan_check_interval:
                    last_orphan_check = now
                    self._check_still_master(mastership)
                    if step.timeout_ms is not None:
                        self._time_out_stalled(step, master.id, mastership)
                    no_node_since = self._recover_orphans(
                        step,
                        master.id,
                        mastership,
                        no_node_since,
                        stopping=master.job_execution.stop_requested,
                    )
            except FencedError:
                raise
            except Exception as error:
                if not is_connectivity_error(error) and not store.provider.is_transient(error):
                    raise
                outage.began(error)  # the node's one WARNING, unless it gave it already
                pause_ms = pace.backoff_ms()
            time.sleep(pause_ms / 1000)

    def _stop_pending(self, master_id: int, mastership: Mastership) -> None:
        """The job is being stopped: what no node has claimed does not start (see
        :mod:`dbcluster.cluster.stopping`); running partitions stop themselves."""
        stopped = self.store.stop_pending(master_id, self.repository, mastership)
        if stopped:
            log.info(
                "master %s stopped %d unclaimed partition(s) of job execution %s",
                mastership.node_id,
                stopped,
                mastership.job_execution_id,
            )

    def _fail_in_flight(self, mastership: Mastership, message: str) -> None:
        """Fail what is in flight (partitions and their step executions, one transaction), once
        the database answers; if this node is fenced first, the survivors do it."""
        try:
            failed = self.patience.run(
                mastership,
                lambda: self.store.fail_in_flight(
                    mastership.job_execution_id, message[:2000], self.repository, mastership
                ),
                "fail the partitions in flight",
            )
        except FencedError:
            return
        log.warning(
            "master %s failed %d in-flight partition(s) of job execution %s",
            mastership.node_id,
            failed,
            mastership.job_execution_id,
        )

    def _check_still_master(self, mastership: Mastership) -> None:
        row = self.store.coordination(mastership.job_execution_id)
        if (
            row is None
            or row.master_node != mastership.node_id
            or row.master_epoch != mastership.epoch
            or row.status not in COORD_MASTERED
        ):
            raise mastership.lost(
                f"coordination row is "
                f"{None if row is None else (row.master_node, row.master_epoch, row.status)}"
            )

    def _time_out_stalled(
        self, step: PartitionStep, master_id: int, mastership: Mastership
    ) -> None:
        """Fence every partition whose progress is older than the step's timeout: another try
        if it is transferable and has tries left, else FAILED."""
        store = self.store
        timeout_ms = step.timeout_ms
        assert timeout_ms is not None
        for stalled in store.stalled(master_id, timeout_ms):
            message = (
                f"partition {stalled.partition_name} made no progress on node "
                f"{stalled.assigned_node} for {timeout_ms} ms (attempt {stalled.attempt})"
            )
            outcome = store.time_out(stalled, timeout_ms, message, self.repository, mastership)
            if outcome is None:
                continue
            log.warning("master timed out: %s; %s", message, outcome.lower())
            self.context.events.timed_out(
                mastership.node_id,
                stalled.step_execution_id,
                stalled.partition_name,
                stalled.assigned_node,
                outcome != PARTITION_FAILED,
            )

    def _recover_orphans(
        self,
        step: PartitionStep,
        master_id: int,
        mastership: Mastership,
        no_node_since: float | None,
        *,
        stopping: bool = False,
    ) -> float | None:
        store, events = self.store, self.context.events
        # A partition put back for another try waits out its backoff first.
        orphans = [o for o in store.orphans(master_id) if o.due(step.retry_backoff_for(o.attempt))]
        if not orphans:
            return None
        repository = self.repository
        movable: list[OrphanedPartition] = []
        for orphan in orphans:
            if stopping:
                # Its job is being stopped: it ends where its node left it (a restart resumes
                # it from its last commit) instead of running again elsewhere.
                message = (
                    f"partition {orphan.partition_name} stopped: its job is being stopped and "
                    f"node {orphan.assigned_node or '(handed back)'} no longer runs it"
                )
                if store.fail_orphan(orphan, message, repository, mastership, stopped=True):
                    log.info("master stopped partition %s: %s", orphan.step_execution_id, message)
                continue
            if orphan.status == PARTITION_CLAIMED and not orphan.transferable:
                message = (
                    f"non-transferable partition {orphan.partition_name} lost with node "
                    f"{orphan.assigned_node}; not run again"
                )
                if store.fail_orphan(orphan, message, repository, mastership):
                    log.warning("master failed partition %s: %s", orphan.step_execution_id, message)
                    events.orphan_failed(
                        mastership.node_id, orphan.step_execution_id, orphan.assigned_node
                    )
                continue
            movable.append(orphan)
        if not movable:
            return None
        workers = store.worker_nodes()
        if not workers:
            since = no_node_since if no_node_since is not None else time.monotonic()
            waited_ms = (time.monotonic() - since) * 1000
            if waited_ms < self.no_node_timeout_ms:
                return since
            for orphan in movable:
                store.fail_orphan(
                    orphan,
                    f"no live node to run partition {orphan.partition_name} "
                    f"within {self.no_node_timeout_ms} ms",
                    repository,
                    mastership,
                )
            return None
        placement = LeastLoaded().assign([str(o.step_execution_id) for o in movable], workers)
        for orphan in movable:
            target = placement[str(orphan.step_execution_id)]
            if store.reassign(orphan, target, mastership):
                log.info(
                    "master reassigned partition %s (%s) from %s to %s, attempt %d",
                    orphan.partition_name,
                    orphan.step_execution_id,
                    orphan.assigned_node or "(handed back)",
                    target,
                    orphan.attempt,
                )
                events.reassigned(
                    mastership.node_id,
                    orphan.step_execution_id,
                    orphan.partition_name,
                    orphan.assigned_node,
                    target,
                )
        return None


def describe(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items()))
