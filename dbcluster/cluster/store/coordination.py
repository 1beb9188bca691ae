"""A job execution's coordination as its master and its followers read it (its row, its
partitions' counts), and stopping it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from dbcluster.batch.domain import utcnow
from dbcluster.batch.fence import Fence, hold
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.store.connector import Connector
from dbcluster.inlists import in_batches
from dbcluster.schema import job_coordination
from dbcluster.states import PARTITION_FAILED


class JobCoordination(Connector):
    """``batch_job_coordination`` and a job's partitions, read; the stop request."""

    def coordination(self, job_execution_id: int) -> Any | None:
        rows = self.rows(
            select(job_coordination).where(job_coordination.c.job_execution_id == job_execution_id),
            "coordination",
        )
        return rows[0] if rows else None

    def counts(self, master_step_execution_id: int) -> dict[str, int]:
        stmt = self.prepared(
            "counts", lambda: self.provider.select_partition_counts(bindparam("b_master"))
        )
        rows = self.rows(stmt, "counts", {"b_master": master_step_execution_id})
        return {r[0]: int(r[1]) for r in rows}

    def partitions(self, master_step_execution_id: int) -> list[Any]:
        stmt = self.prepared(
            "partitions", lambda: self.provider.select_partitions(bindparam("b_master"))
        )
        return list(self.rows(stmt, "list", {"b_master": master_step_execution_id}))

    def in_flight(self, job_execution_id: int, conn: Connection | None = None) -> int:
        """How many partitions of the execution are PENDING or CLAIMED (in ``conn``'s
        transaction when given)."""
        stmt = self.provider.select_in_flight_count(job_execution_id)
        rows = conn.execute(stmt).all() if conn is not None else self.rows(stmt, "in flight")
        return int(rows[0][0])

    def request_stop(self, job_execution_id: int) -> bool:
        """The durable stop request (one guarded UPDATE); True when this call made the
        execution STOPPING (a repeat after an unclear commit answers False: the caller reads
        the execution to judge)."""
        provider = self.provider
        return self.transaction(
            lambda conn: self.execute(conn, provider.request_stop(job_execution_id, utcnow())) == 1,
            "request stop",
        )

    def stopping(self, job_execution_ids: Iterable[int]) -> set[int]:
        """Which of these job executions are STOPPING (one read per ``partition_write_batch``
        ids; a node watches a handful)."""
        stmt = self.prepared("select_stopping", self.provider.select_stopping)
        found: set[int] = set()
        for batch in in_batches(list(job_execution_ids), self.provider.partition_write_batch):
            found.update(int(r[0]) for r in self.rows(stmt, "stopping", {"ids": batch}))
        return found

    def stop_pending(
        self, master_step_execution_id: int, repository: JobRepository, fence: Fence
    ) -> int:
        """End the partitions of a stopping job that no node has claimed: partition rows, then
        their step executions STOPPED, under the master's fence, at most
        ``partition_write_batch`` of them a transaction (a big job's stop never holds many row
        locks at once). A claim that races it either committed first (the partition runs and
        stops itself) or finds the row gone. Returns how many were stopped."""
        provider = self.provider
        size = provider.partition_write_batch
        pending = provider.select_pending_partition_ids(master_step_execution_id).limit(size)

        def work(conn: Connection) -> tuple[int, int]:
            hold(fence, conn)
            batch = [int(r[0]) for r in conn.execute(pending)]
            if not batch:
                return 0, 0
            changed = self.execute(conn, provider.stop_pending_partitions(batch))
            stopped = batch
            if changed != len(batch):
                # A claim won some of them between the read and this write: only those this
                # transaction ended (FAILED now, their step not started) are ours; a step that
                # ended otherwise is not running, so the write below leaves it alone.
                rows = conn.execute(provider.select_partition_ids_in(batch, PARTITION_FAILED))
                stopped = [int(r[0]) for r in rows]
            if stopped:
                repository.fail_running(
                    "its job was stopped before a node started it",
                    conn,
                    step_execution_ids=stopped,
                    exit_code=BatchStatus.STOPPED.value,
                    status=BatchStatus.STOPPED,
                )
            return len(batch), len(stopped)

        total = 0
        while True:
            seen, stopped = self.transaction(work, "stop pending partitions")
            total += stopped
            if seen < size:
                return total
