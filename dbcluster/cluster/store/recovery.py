"""Recovery: a master's orphans, stalled and failed partitions, and the survivors' claim of a
stranded job (takeover or abandon)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from dbcluster.batch.fence import Fence, hold
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import EXIT_ABANDONED, EXIT_NODE_LOST, BatchStatus
from dbcluster.cluster.store.records import OrphanedPartition, StalledPartition, StrandedJob
from dbcluster.cluster.store.verify import coordination_is, partition_is
from dbcluster.cluster.store.wakeups import WakeUps
from dbcluster.inlists import in_batches
from dbcluster.schema import job_coordination, job_execution, partitions
from dbcluster.states import (
    COORD_ABANDONED,
    COORD_COMPLETED,
    COORD_FAILED,
    COORD_RECOVERING,
    COORD_STARTED,
    JOB_COMPLETED,
    PARTITION_FAILED,
    PARTITION_PENDING,
)


class Recovery(WakeUps):
    """What masters and survivors change when a node or a master is lost."""

    def orphans(self, master_step_execution_id: int) -> list[OrphanedPartition]:
        stmt = self.prepared(
            "orphans", lambda: self.provider.select_orphaned_partitions(bindparam("b_master"))
        )
        rows = self.rows(stmt, "orphans", {"b_master": master_step_execution_id})
        return [
            OrphanedPartition(
                r.step_execution_id,
                r.partition_name,
                r.assigned_node,
                r.attempt,
                r.status,
                bool(r.transferable),
                r.retried_at,
                r.db_now,
            )
            for r in rows
        ]

    def stalled(self, master_step_execution_id: int, timeout_ms: int) -> list[StalledPartition]:
        rows = self.rows(
            self.provider.select_stalled(master_step_execution_id, timeout_ms), "stalled"
        )
        return [
            StalledPartition(
                r.step_execution_id,
                r.partition_name,
                r.assigned_node,
                r.attempt,
                int(r.max_attempts),
                bool(r.transferable),
            )
            for r in rows
        ]

    def time_out(
        self,
        stalled: StalledPartition,
        timeout_ms: int,
        message: str,
        repository: JobRepository,
        fence: Fence,
    ) -> str | None:
        """Fence a stalled partition (one transaction, after the master's fence): PENDING for
        another try when it is transferable and has tries left, else FAILED with its step
        execution. Returns the status written, or None when it moved on meanwhile."""
        provider = self.provider
        retry = stalled.transferable and stalled.attempt < stalled.max_attempts

        def work(conn: Connection) -> str | None:
            hold(fence, conn)
            stmt = provider.time_out_partition(
                stalled.step_execution_id,
                stalled.assigned_node,
                stalled.attempt,
                timeout_ms,
                retry=retry,
            )
            if self.execute(conn, stmt) != 1:
                return None
            if retry:
                return PARTITION_PENDING
            repository.fail_running(message, conn, step_execution_id=stalled.step_execution_id)
            return PARTITION_FAILED

        def verify(conn: Connection) -> str | None:
            row = conn.execute(
                select(partitions.c.status, partitions.c.attempt).where(
                    partitions.c.step_execution_id == stalled.step_execution_id
                )
            ).first()
            if row is not None and row[1] == stalled.attempt + 1:
                return str(row[0])
            return None

        return self.transaction(work, "time out", verify)

    def reassign(self, orphan: OrphanedPartition, to_node: str, fence: Fence) -> bool:
        """Move an orphaned partition to ``to_node`` (after the master's fence), waking that
        node where the database can."""
        stmt = self.provider.reassign_partition(
            orphan.step_execution_id, orphan.assigned_node, orphan.attempt, to_node
        )

        def work(conn: Connection) -> bool:
            hold(fence, conn)
            if self.execute(conn, stmt) != 1:
                return False
            self.wake_nodes(conn, [to_node])
            return True

        verify = partition_is(
            orphan.step_execution_id,
            PARTITION_PENDING,
            to_node,
            orphan.attempt,
            self.provider.locked,
        )
        return self.transaction(work, "reassign", lambda conn: True if verify(conn) else None)

    def fail_orphan(
        self,
        orphan: OrphanedPartition,
        message: str,
        repository: JobRepository,
        fence: Fence,
        *,
        stopped: bool = False,
    ) -> bool:
        """Fail a lost partition and its step execution together (partition row first).
        ``stopped``: its job is being stopped, so its step execution ends STOPPED (a restart
        resumes it from its last commit) rather than FAILED."""
        provider = self.provider

        def work(conn: Connection) -> bool:
            hold(fence, conn)
            stmt = provider.fail_orphaned_partition(
                orphan.step_execution_id, orphan.assigned_node, orphan.attempt
            )
            if self.execute(conn, stmt) != 1:
                return False
            if stopped:
                repository.fail_running(
                    message,
                    conn,
                    step_execution_id=orphan.step_execution_id,
                    exit_code=BatchStatus.STOPPED.value,
                    status=BatchStatus.STOPPED,
                )
            else:
                repository.fail_running(
                    message,
                    conn,
                    step_execution_id=orphan.step_execution_id,
                    exit_code=EXIT_NODE_LOST,
                )
            return True

        verify = partition_is(
            orphan.step_execution_id,
            PARTITION_FAILED,
            orphan.assigned_node,
            orphan.attempt,
            self.provider.locked,
        )
        return self.transaction(work, "fail orphan", lambda conn: True if verify(conn) else None)

    def fail_in_flight(
        self, job_execution_id: int, message: str, repository: JobRepository, fence: Fence
    ) -> int:
        """Fail every in-flight partition of a job execution and their step executions."""

        def work(conn: Connection) -> int:
            hold(fence, conn)
            failed = self._fail_job_partitions(conn, job_execution_id)
            for step_execution_id in failed:
                repository.fail_running(message, conn, step_execution_id=step_execution_id)
            return len(failed)

        return self.transaction(work, "fail in flight")

    def _fail_job_partitions(self, conn: Connection, job_execution_id: int) -> list[int]:
        """FAILED for every in-flight partition of a job execution, in the caller's transaction,
        at most ``partition_write_batch`` rows a statement. Returns the ids failed."""
        provider = self.provider
        ids = [
            row[0]
            for row in conn.execute(provider.select_in_flight_partition_ids(job_execution_id))
        ]
        failed: list[int] = []
        for batch in in_batches(ids, provider.partition_write_batch):
            if self.execute(conn, provider.fail_job_partitions(job_execution_id, batch)):
                failed.extend(batch)
        return failed

    def stranded_jobs(self) -> list[StrandedJob]:
        return self._stranded(self.provider.select_stranded_masters(), "stranded")

    def unfinished_recoveries(self, node_id: str) -> list[StrandedJob]:
        return self._stranded(self.provider.select_recovering_owned_by(node_id), "recovering")

    def _stranded(self, stmt: Any, what: str) -> list[StrandedJob]:
        return [
            StrandedJob(
                r.job_execution_id,
                r.master_node,
                r.master_epoch,
                r.master_step_execution_id,
                r.status,
            )
            for r in self.rows(stmt, what)
        ]

    def claim_stranded(self, job: StrandedJob, new_owner: str, reason: str) -> StrandedJob | None:
        """Take a stranded job's coordination row (RECOVERING, next epoch) and record the new
        owner in the job's master history (``reason``: takeover or abandon), in one
        transaction; the job as now owned, or None when another survivor won."""
        provider = self.provider
        stmt = provider.claim_stranded_master(
            job.job_execution_id, job.master_node, job.master_epoch, job.status, new_owner
        )
        won = StrandedJob(
            job.job_execution_id,
            new_owner,
            job.master_epoch + 1,
            job.master_step_execution_id,
            COORD_RECOVERING,
        )

        def claim(conn: Connection) -> bool:
            if self.execute(conn, stmt) != 1:
                return False
            conn.execute(
                provider.insert_master(job.job_execution_id, won.master_epoch, new_owner, reason)
            )
            return True

        verify = coordination_is(
            job.job_execution_id,
            COORD_RECOVERING,
            new_owner,
            won.master_epoch,
            self.provider.locked,
        )
        claimed = self.transaction(
            claim, "claim stranded master", lambda conn: True if verify(conn) else None
        )
        return won if claimed else None

    def start_mastership(self, job: StrandedJob) -> bool:
        """The survivor that claimed a stranded job becomes its master: RECOVERING -> STARTED
        under the claimed epoch."""
        stmt = self.provider.set_coordination_status(
            job.job_execution_id,
            job.master_node,
            job.master_epoch,
            [COORD_RECOVERING],
            COORD_STARTED,
        )

        verify = coordination_is(
            job.job_execution_id,
            COORD_STARTED,
            job.master_node,
            job.master_epoch,
            self.provider.locked,
        )
        return self.guarded(stmt, "start mastership", verify)

    def abandon(self, job: StrandedJob, message: str, repository: JobRepository) -> str | None:
        """Finish the recovery of a stranded job this node owns (RECOVERING): in one transaction
        that holds the coordination row, fail its in-flight partitions, its running step
        executions and the execution; close the row ABANDONED (or, when the job had ended,
        with the job's own outcome). Returns the coordination status written, or None when
        the row is no longer this node's to close."""
        provider = self.provider

        def work(conn: Connection) -> str | None:
            if (
                self.execute(
                    conn,
                    provider.hold_mastership(
                        job.job_execution_id, job.master_node, job.master_epoch, [COORD_RECOVERING]
                    ),
                )
                != 1
            ):
                return None
            self._fail_job_partitions(conn, job.job_execution_id)
            repository.fail_running(
                message, conn, job_execution_id=job.job_execution_id, exit_code=EXIT_ABANDONED
            )
            if repository.fail_running_job(
                job.job_execution_id, message, conn, exit_code=EXIT_ABANDONED
            ):
                status = COORD_ABANDONED
            else:
                ended = conn.execute(
                    select(job_execution.c.status).where(
                        job_execution.c.job_execution_id == job.job_execution_id
                    )
                ).scalar_one_or_none()
                status = COORD_COMPLETED if ended == JOB_COMPLETED else COORD_FAILED
            self.execute(
                conn,
                provider.set_coordination_status(
                    job.job_execution_id,
                    job.master_node,
                    job.master_epoch,
                    [COORD_RECOVERING],
                    status,
                ),
            )
            return status

        def verify(conn: Connection) -> str | None:
            row = conn.execute(
                select(job_coordination.c.status, job_coordination.c.master_node).where(
                    job_coordination.c.job_execution_id == job.job_execution_id
                )
            ).first()
            if row is not None and row[1] == job.master_node and row[0] != COORD_RECOVERING:
                return str(row[0])
            return None

        return self.transaction(work, "abandon", verify)
