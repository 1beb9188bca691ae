"""The per-job master: places a partition step's partitions on live nodes and sees them through.

It runs on the node that launched the job, inside the partition step, behind the same interface
as :class:`~dbcluster.batch.local.LocalPartitionHandler`. Workers never call it and it never calls
workers: every decision is a read or a guarded write of coordination rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from dbcluster.batch.domain import StepExecution, utcnow
from dbcluster.batch.exceptions import BatchError, OptimisticLockingFailureError
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.cluster.assignment import AssignmentStrategy, LeastLoaded, RoundRobin
from dbcluster.cluster.store import NodeInfo, OrphanedPartition
from dbcluster.dialects.base import (
    COORD_STARTED,
    PARTITION_CLAIMED,
    PARTITION_IN_FLIGHT,
)
from dbcluster.schema import job_coordination

if TYPE_CHECKING:
    from dbcluster.batch.partition import PartitionStep
    from dbcluster.batch.repository import JobRepository
    from dbcluster.batch.runtime import BatchRuntime
    from dbcluster.cluster.node import Node

log = logging.getLogger("dbcluster.master")


class MastershipLostError(BatchError):
    """This node can no longer act as the job's master (fenced, or the job was abandoned)."""


class NoLiveNodeError(BatchError):
    """No live node could take the partitions within the timeout."""


def fail_step_execution(repository: JobRepository, step_execution_id: int, message: str) -> None:
    """Record FAILED on a partition's step execution, from outside the node that ran it."""
    for _ in range(5):
        se = repository.get_step_execution(step_execution_id)
        if se is None or se.status in (BatchStatus.COMPLETED, BatchStatus.FAILED):
            return
        se.status = BatchStatus.FAILED
        se.exit_status = ExitStatus.FAILED.with_description(message)  # type: ignore[attr-defined]
        se.end_time = utcnow()
        try:
            repository.update_step_execution(se)
            return
        except OptimisticLockingFailureError:
            time.sleep(0.01)
    log.warning("could not mark step execution %s FAILED", step_execution_id)


class ClusterPartitionHandler:
    """Runs a partition step's partitions across the cluster, with this node as master."""

    def __init__(
        self,
        node: Node,
        strategy: AssignmentStrategy | None = None,
        *,
        no_node_timeout_ms: int | None = None,
    ) -> None:
        self.node = node
        self.strategy = strategy or RoundRobin()
        self.no_node_timeout_ms = (
            node.settings.no_node_timeout if no_node_timeout_ms is None else no_node_timeout_ms
        )
        #: Called with (master step execution id, partition counts by status) on each check.
        self.progress: Callable[[int, dict[str, int]], None] | None = None

    # --- placing ------------------------------------------------------------------------------

    def _wait_for_workers(self) -> list[NodeInfo]:
        deadline = time.monotonic() + self.no_node_timeout_ms / 1000
        while True:
            workers = self.node.store.worker_nodes()
            if workers:
                return workers
            if time.monotonic() >= deadline:
                raise NoLiveNodeError(
                    f"no live worker node joined within {self.no_node_timeout_ms} ms"
                )
            time.sleep(self.node.settings.master_check_interval / 1000)

    def handle(
        self, step: PartitionStep, master: StepExecution, runtime: BatchRuntime
    ) -> list[StepExecution]:
        node = self.node
        identity = node.identity
        provider, repository = node.store.provider, runtime.repository
        job_execution = master.job_execution
        workers = self._wait_for_workers()
        strategy = self.strategy
        # The node's coordination engine: on SQLite it begins IMMEDIATE, and this transaction
        # reads before it writes.
        # The partitioner runs before the transaction: user code must not hold the write lock
        # (SQLite has one for the whole database) while it reads its input.
        planned = step.plan(master, len(workers))
        with node.coordination_engine.begin() as conn:
            works = step.split(master, len(workers), runtime, conn, planned=planned)
            placement = strategy.assign([w.name for w in works], workers) if works else {}
            exists = conn.execute(
                select(job_coordination.c.master_node).where(
                    job_coordination.c.job_execution_id == job_execution.id
                )
            ).first()
            if exists is None:
                conn.execute(
                    provider.insert_coordination(
                        job_execution.id,
                        identity.node_id,
                        master.id,
                        step.worker_step.name,
                        COORD_STARTED,
                    )
                )
            elif (
                conn.execute(
                    provider.restart_coordination(
                        job_execution.id, identity.node_id, master.id, step.worker_step.name
                    )
                ).rowcount
                != 1
            ):
                raise MastershipLostError(
                    f"job execution {job_execution.id} is coordinated by {exists[0]}, "
                    f"not by this node ({identity.node_id})"
                )
            if works:
                conn.execute(
                    provider.insert_partitions(),
                    [
                        {
                            "step_execution_id": w.step_execution.id,
                            "job_execution_id": job_execution.id,
                            "master_step_execution_id": master.id,
                            "partition_name": w.name,
                            "assigned_node": placement[w.name],
                            "transferable": w.transferable,
                        }
                        for w in works
                    ],
                )
        if not works:
            return []
        log.info(
            "master %s placed %d partition(s) of %s on %d node(s) (%s)",
            identity.node_id,
            len(works),
            step.name,
            len({placement[w.name] for w in works}),
            type(strategy).__name__,
        )
        node._emit("placed", master=master.id, placement=placement)
        node.wake()
        node.masters.add(self)
        try:
            self._monitor(master, job_execution.id)
        except MastershipLostError:
            raise  # not ours to write any more: a survivor fails what is in flight
        except Exception:
            self._fail_in_flight(job_execution.id)
            raise
        finally:
            node.masters.discard(self)
        return repository.get_step_executions_by_ids(
            job_execution, [w.step_execution.id for w in works]
        )

    # --- monitoring ---------------------------------------------------------------------------

    def _monitor(self, master: StepExecution, job_execution_id: int) -> None:
        node, store = self.node, self.node.store
        identity = node.identity
        settings = node.settings
        last_orphan_check = 0.0
        no_node_since: float | None = None
        while True:
            node._resumed.wait()
            if identity.fenced.is_set():
                raise MastershipLostError(
                    f"master node {identity.node_id} was fenced ({identity.fence_reason})"
                )
            counts = store.counts(master.id)
            if self.progress is not None:
                self.progress(master.id, counts)
            if not sum(counts.get(s, 0) for s in PARTITION_IN_FLIGHT):
                return
            now = time.monotonic()
            if (now - last_orphan_check) * 1000 >= settings.orphan_check_interval:
                last_orphan_check = now
                self._check_still_master(job_execution_id)
                no_node_since = self._recover_orphans(master.id, no_node_since)
            time.sleep(settings.master_check_interval / 1000)

    def _fail_in_flight(self, job_execution_id: int) -> None:
        """The monitor broke (the database stopped answering): the step is about to end FAILED,
        so nothing of it may go on running, or a restart would run it beside the old attempt.
        Fail what is in flight once the database answers; if it never does before this node is
        fenced, a survivor abandons the job and does it."""
        node = self.node
        identity = node.identity
        while not identity.fenced.is_set():
            try:
                failed = node.store.fail_job_partitions(job_execution_id)
                log.warning(
                    "master %s failed %d in-flight partition(s) of job execution %s",
                    identity.node_id,
                    failed,
                    job_execution_id,
                )
                return
            except Exception as exc:  # noqa: BLE001 - wait for the database
                log.warning("master cannot fail in-flight partitions yet: %s", exc)
                time.sleep(node.settings.heartbeat_interval / 1000)

    def _check_still_master(self, job_execution_id: int) -> None:
        row = self.node.store.coordination(job_execution_id)
        me = self.node.identity.node_id
        if row is None or row.master_node != me or row.status != COORD_STARTED:
            raise MastershipLostError(
                f"job execution {job_execution_id} is no longer coordinated by {me} "
                f"(row: {None if row is None else (row.master_node, row.status)})"
            )

    def _recover_orphans(self, master_id: int, no_node_since: float | None) -> float | None:
        node, store = self.node, self.node.store
        orphans = store.orphans(master_id)
        if not orphans:
            return None
        repository = node.repository
        workers = store.worker_nodes()
        movable: list[OrphanedPartition] = []
        for orphan in orphans:
            if orphan.status == PARTITION_CLAIMED and not orphan.transferable:
                se = repository.get_step_execution(orphan.step_execution_id)
                if se is not None and se.status is BatchStatus.COMPLETED:
                    movable.append(orphan)  # done; a live node only records it
                    continue
                if store.fail_orphan(orphan):
                    message = (
                        f"non-transferable partition {orphan.partition_name} lost with node "
                        f"{orphan.assigned_node}; not run again"
                    )
                    fail_step_execution(repository, orphan.step_execution_id, message)
                    log.warning("master failed partition %s: %s", orphan.step_execution_id, message)
                    node._emit(
                        "orphan_failed", id=orphan.step_execution_id, node=orphan.assigned_node
                    )
                continue
            movable.append(orphan)
        if not movable:
            return None
        if not workers:
            since = no_node_since if no_node_since is not None else time.monotonic()
            waited_ms = (time.monotonic() - since) * 1000
            if waited_ms < self.no_node_timeout_ms:
                return since
            for orphan in movable:
                if store.fail_orphan(orphan):
                    fail_step_execution(
                        repository,
                        orphan.step_execution_id,
                        f"no live node to run partition {orphan.partition_name} "
                        f"within {self.no_node_timeout_ms} ms",
                    )
            return None
        placement = LeastLoaded().assign([str(o.step_execution_id) for o in movable], workers)
        for orphan in movable:
            target = placement[str(orphan.step_execution_id)]
            if store.reassign(orphan, target):
                log.info(
                    "master reassigned partition %s (%s) from %s to %s, attempt %d",
                    orphan.partition_name,
                    orphan.step_execution_id,
                    orphan.assigned_node or "(handed back)",
                    target,
                    orphan.attempt + 1,
                )
                node._emit(
                    "reassigned",
                    id=orphan.step_execution_id,
                    partition=orphan.partition_name,
                    from_node=orphan.assigned_node,
                    to_node=target,
                )
        return None


def describe(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items()))
