"""Executes the provider's coordination statements and judges their row counts.

Every method is one short transaction. Transient errors (as the provider classifies them) are
retried with backoff; a guarded transition whose first try may have committed before the error
is re-checked rather than trusted to its second row count.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection

from dbcluster.dialects import QueryProvider, get_provider
from dbcluster.dialects.base import NODE_ACTIVE
from dbcluster.schema import job_coordination, partitions

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    host: str
    status: str
    current_load: int
    capacity: int
    last_heartbeat: datetime | None = None


@dataclass(frozen=True)
class PendingPartition:
    step_execution_id: int
    job_execution_id: int
    master_step_execution_id: int
    partition_name: str
    attempt: int
    transferable: bool
    worker_step_name: str


@dataclass(frozen=True)
class OrphanedPartition:
    step_execution_id: int
    partition_name: str
    assigned_node: str | None
    attempt: int
    status: str
    transferable: bool


@dataclass(frozen=True)
class StrandedJob:
    job_execution_id: int
    master_node: str
    master_step_execution_id: int
    status: str


class CoordinationStore:
    def __init__(
        self,
        engine: Engine,
        provider: QueryProvider | None = None,
        *,
        retries: int = 4,
        backoff_s: float = 0.05,
    ) -> None:
        self.engine = engine
        self.provider = provider or get_provider(engine)
        self.retries = retries
        self.backoff_s = backoff_s

    # --- plumbing -------------------------------------------------------------------------------

    def _retry(self, work: Callable[[], T], what: str) -> T:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return work()
            except Exception as exc:
                if attempt >= self.retries or not self.provider.is_transient(exc):
                    raise
                log.info("transient error in %s (retry %d): %s", what, attempt + 1, exc)
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    def _rowcount(self, stmt: Any, what: str) -> int:
        def work() -> int:
            with self.engine.begin() as conn:
                return conn.execute(stmt).rowcount

        return self._retry(work, what)

    def _rows(self, stmt: Any, what: str) -> Sequence[Any]:
        def work() -> Sequence[Any]:
            with self.engine.connect() as conn:
                return conn.execute(stmt).all()

        return self._retry(work, what)

    def _guarded(self, stmt: Any, what: str, verify: Callable[[Connection], bool]) -> bool:
        """Run a guarded UPDATE; True when it changed exactly one row. After a transient error
        the first try may have committed, so ``verify`` decides from the row itself."""
        retried = False
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                if retried:
                    with self.engine.connect() as conn:
                        if verify(conn):
                            return True
                with self.engine.begin() as conn:
                    return conn.execute(stmt).rowcount == 1
            except Exception as exc:
                if attempt >= self.retries or not self.provider.is_transient(exc):
                    raise
                log.info("transient error in %s (retry %d): %s", what, attempt + 1, exc)
                retried = True
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    def _partition_is(
        self, step_execution_id: int, status: str, node_id: str | None, attempt: int
    ) -> Callable[[Connection], bool]:
        def verify(conn: Connection) -> bool:
            row = conn.execute(
                select(partitions.c.status, partitions.c.assigned_node, partitions.c.attempt).where(
                    partitions.c.step_execution_id == step_execution_id
                )
            ).first()
            return row is not None and tuple(row) == (status, node_id, attempt)

        return verify

    # --- nodes ----------------------------------------------------------------------------------

    def db_now(self) -> datetime:
        return self._rows(self.provider.select_now(), "clock")[0][0]

    def register(self, node_id: str, host: str, capacity: int) -> None:
        def work() -> None:
            with self.engine.begin() as conn:
                self.provider.register_node(conn, node_id, host, capacity)

        self._retry(work, "register")

    def heartbeat(self, node_id: str, load: int) -> bool:
        """False when the node's row is gone: it was declared dead and must fence."""
        return self._rowcount(self.provider.heartbeat(node_id, load), "heartbeat") == 1

    def sweep(self, unreachable_ms: int, cleanup_ms: int) -> tuple[int, int]:
        def work() -> tuple[int, int]:
            with self.engine.begin() as conn:
                marked = conn.execute(self.provider.mark_unreachable(unreachable_ms)).rowcount
            with self.engine.begin() as conn:
                removed = conn.execute(self.provider.remove_stale(cleanup_ms)).rowcount
            return marked, removed

        return self._retry(work, "sweep")

    def set_capacity(self, node_id: str, capacity: int) -> None:
        self._rowcount(self.provider.set_node_capacity(node_id, capacity), "capacity")

    def deregister(self, node_id: str) -> None:
        self._rowcount(self.provider.deregister_node(node_id), "deregister")

    def nodes(self, status: str | None = NODE_ACTIVE) -> list[NodeInfo]:
        rows = self._rows(self.provider.select_nodes(status), "nodes")
        return [
            NodeInfo(r.node_id, r.host, r.status, r.current_load, r.capacity, r.last_heartbeat)
            for r in rows
        ]

    def worker_nodes(self) -> list[NodeInfo]:
        """ACTIVE nodes that take partitions."""
        return [n for n in self.nodes(NODE_ACTIVE) if n.capacity > 0]

    # --- partitions (worker side) ---------------------------------------------------------------

    def poll(self, node_id: str, limit: int) -> list[PendingPartition]:
        rows = self._rows(self.provider.select_pending_for_node(node_id, limit), "poll")
        return [
            PendingPartition(
                r.step_execution_id,
                r.job_execution_id,
                r.master_step_execution_id,
                r.partition_name,
                r.attempt,
                bool(r.transferable),
                r.worker_step_name,
            )
            for r in rows
        ]

    def claim(self, step_execution_id: int, node_id: str, attempt: int) -> bool:
        return self._guarded(
            self.provider.claim_partition(step_execution_id, node_id, attempt),
            "claim",
            self._partition_is(step_execution_id, "CLAIMED", node_id, attempt),
        )

    def holds(self, step_execution_id: int, node_id: str, attempt: int) -> bool:
        """Whether the partition is CLAIMED by this node under this attempt."""
        verify = self._partition_is(step_execution_id, "CLAIMED", node_id, attempt)

        def work() -> bool:
            with self.engine.connect() as conn:
                return verify(conn)

        return self._retry(work, "holds")

    def finish(self, step_execution_id: int, node_id: str, attempt: int, status: str) -> bool:
        return self._guarded(
            self.provider.finish_partition(step_execution_id, node_id, attempt, status),
            "finish",
            self._partition_is(step_execution_id, status, node_id, attempt),
        )

    def release(self, step_execution_id: int, node_id: str, attempt: int) -> bool:
        return self._guarded(
            self.provider.release_partition(step_execution_id, node_id, attempt),
            "release",
            self._partition_is(step_execution_id, "PENDING", None, attempt + 1),
        )

    def release_pending(self, node_id: str) -> int:
        return self._rowcount(self.provider.release_pending_for_node(node_id), "release pending")

    # --- partitions (master side) ---------------------------------------------------------------

    def orphans(self, master_step_execution_id: int) -> list[OrphanedPartition]:
        rows = self._rows(
            self.provider.select_orphaned_partitions(master_step_execution_id), "orphans"
        )
        return [
            OrphanedPartition(
                r.step_execution_id,
                r.partition_name,
                r.assigned_node,
                r.attempt,
                r.status,
                bool(r.transferable),
            )
            for r in rows
        ]

    def reassign(self, orphan: OrphanedPartition, to_node: str) -> bool:
        return self._guarded(
            self.provider.reassign_partition(
                orphan.step_execution_id, orphan.assigned_node, orphan.attempt, to_node
            ),
            "reassign",
            self._partition_is(orphan.step_execution_id, "PENDING", to_node, orphan.attempt + 1),
        )

    def fail_orphan(self, orphan: OrphanedPartition) -> bool:
        return self._guarded(
            self.provider.fail_orphaned_partition(
                orphan.step_execution_id, orphan.assigned_node, orphan.attempt
            ),
            "fail orphan",
            self._partition_is(
                orphan.step_execution_id, "FAILED", orphan.assigned_node, orphan.attempt
            ),
        )

    def counts(self, master_step_execution_id: int) -> dict[str, int]:
        rows = self._rows(self.provider.select_partition_counts(master_step_execution_id), "counts")
        return {r[0]: int(r[1]) for r in rows}

    def in_flight(self, job_execution_id: int) -> int:
        rows = self._rows(self.provider.select_in_flight_count(job_execution_id), "in flight")
        return int(rows[0][0])

    def fail_job_partitions(self, job_execution_id: int) -> int:
        return self._rowcount(self.provider.fail_job_partitions(job_execution_id), "fail job")

    def insert_coordination(self, job_execution_id: int, master_node: str, status: str) -> None:
        """The row a master writes before its job runs, so a master lost before its first
        partitioned step still leaves something a survivor recovers."""
        stmt = self.provider.insert_coordination(job_execution_id, master_node, 0, "-", status)
        self._rowcount(stmt, "coordination")

    def partitions(self, master_step_execution_id: int) -> list[Any]:
        return list(self._rows(self.provider.select_partitions(master_step_execution_id), "list"))

    # --- job coordination -----------------------------------------------------------------------

    def coordination(self, job_execution_id: int) -> Any | None:
        rows = self._rows(
            select(job_coordination).where(job_coordination.c.job_execution_id == job_execution_id),
            "coordination",
        )
        return rows[0] if rows else None

    def set_coordination_status(
        self, job_execution_id: int, master_node: str, from_statuses: Sequence[str], to: str
    ) -> bool:
        stmt = self.provider.set_coordination_status(
            job_execution_id, master_node, from_statuses, to
        )
        return self._rowcount(stmt, "coordination status") == 1

    def stranded_jobs(self) -> list[StrandedJob]:
        rows = self._rows(self.provider.select_stranded_masters(), "stranded")
        return [
            StrandedJob(r.job_execution_id, r.master_node, r.master_step_execution_id, r.status)
            for r in rows
        ]

    def unfinished_recoveries(self, node_id: str) -> list[StrandedJob]:
        rows = self._rows(self.provider.select_recovering_owned_by(node_id), "recovering")
        return [
            StrandedJob(r.job_execution_id, r.master_node, r.master_step_execution_id, r.status)
            for r in rows
        ]

    def claim_stranded(self, job: StrandedJob, new_owner: str) -> bool:
        stmt = self.provider.claim_stranded_master(
            job.job_execution_id, job.master_node, job.status, new_owner
        )

        def verify(conn: Connection) -> bool:
            row = conn.execute(
                select(job_coordination.c.status, job_coordination.c.master_node).where(
                    job_coordination.c.job_execution_id == job.job_execution_id
                )
            ).first()
            return row is not None and tuple(row) == ("RECOVERING", new_owner)

        return self._guarded(stmt, "claim stranded master", verify)
