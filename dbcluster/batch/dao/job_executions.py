"""Job executions: written at their version, failed from outside the process that ran them, and read
with their instance, parameters and context (new ones: :mod:`dbcluster.batch.dao.creation`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, exists, func, select, update

from dbcluster.batch.dao.connections import Connections, Dao, retried_read, version_is
from dbcluster.batch.dao.job_instances import JobInstanceDao
from dbcluster.batch.dao.rows import (
    execution_values,
    job_execution_from,
    parameter_from,
)
from dbcluster.batch.dao.statements import (
    EXECUTION_COLUMNS,
    JOB_CONTEXT,
    JOB_EXECUTION,
    JOB_INSTANCE,
    JOB_PARAMS,
    KEEPS_STOPPING,
    RUNNING,
    SELECT_EXECUTION_WITH_PARAMS,
    UPDATE_JOB,
    UPDATE_RUNNING_JOB,
)
from dbcluster.batch.domain import JobExecution, JobInstance, utcnow
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.parameters import JobParameter, JobParameters
from dbcluster.batch.status import BatchStatus
from dbcluster.inlists import in_batches


class JobExecutionDao(Dao):
    """Updates and finds job executions."""

    def __init__(self, db: Connections, instances: JobInstanceDao) -> None:
        super().__init__(db)
        self.instances = instances

    def job_version_is(self, execution: JobExecution, version: int) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit of a job-execution write: its row carries ``version``."""
        return version_is(
            JOB_EXECUTION,
            JOB_EXECUTION.c.job_execution_id,
            execution.id,
            version,
            f"job execution {execution.id}",
            self.db.locked,
        )

    # --- writing -----------------------------------------------------------------------------

    def update_job_execution(self, execution: JobExecution, conn: Connection | None = None) -> None:
        now = utcnow()
        with self.db.transaction(conn) as c:
            stmt = UPDATE_RUNNING_JOB if execution.status in KEEPS_STOPPING else UPDATE_JOB
            if c.execute(stmt, execution_values(execution, now)).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"job execution {execution.id} (version {execution.version}) was updated by "
                    f"someone else or no longer exists; reload it before updating"
                )
        execution.version += 1
        execution.last_updated = now

    @staticmethod
    def fail_running_job(
        job_execution_id: int, message: str, conn: Connection, exit_code: str = "FAILED"
    ) -> bool:
        """Mark a job execution FAILED if it is still running (see ``fail_running``)."""
        now = utcnow()
        return (
            conn.execute(
                update(JOB_EXECUTION)
                .where(
                    JOB_EXECUTION.c.job_execution_id == job_execution_id,
                    JOB_EXECUTION.c.status.in_(RUNNING),
                )
                .values(
                    status=BatchStatus.FAILED.value,
                    exit_code=exit_code,
                    exit_message=message,
                    end_time=now,
                    last_updated=now,
                    version=JOB_EXECUTION.c.version + 1,
                )
            ).rowcount
            == 1
        )

    # --- reading -----------------------------------------------------------------------------

    @retried_read
    def get_job_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> JobExecution | None:
        with self.db.read(conn) as c:
            rows = c.execute(SELECT_EXECUTION_WITH_PARAMS, {"b_id": execution_id}).all()
        if not rows:
            return None
        params = {
            m["parameter_name"]: parameter_from(m)
            for m in (row._mapping for row in rows)
            if m["parameter_name"] is not None
        }
        return job_execution_from(rows[0]._mapping, params)

    @retried_read
    def get_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        """Every execution of the instance, newest first."""
        with self.db.read(conn) as c:
            return self.job_executions(c, JOB_EXECUTION.c.job_instance_id == job_instance.id)

    @retried_read
    def get_last_job_execution(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobExecution | None:
        with self.db.read(conn) as c:
            instance = self.instances.get_job_instance(job_name, params, c)
            if instance is None:
                return None
            found = self.job_executions(c, JOB_EXECUTION.c.job_instance_id == instance.id, limit=1)
        return found[0] if found else None

    @retried_read
    def get_last_job_instance_execution(
        self, job_name: str, conn: Connection | None = None
    ) -> JobExecution | None:
        """The newest execution of the job's newest instance (what an incrementer reads)."""
        with self.db.read(conn) as c:
            newest = c.execute(
                select(func.max(JOB_INSTANCE.c.job_instance_id)).where(
                    JOB_INSTANCE.c.job_name == job_name
                )
            ).scalar_one_or_none()
            if newest is None:
                return None
            found = self.job_executions(c, JOB_EXECUTION.c.job_instance_id == newest, limit=1)
        return found[0] if found else None

    @retried_read
    def find_running_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        with self.db.read(conn) as c:
            return self.job_executions(
                c,
                JOB_EXECUTION.c.job_instance_id == job_instance.id,
                JOB_EXECUTION.c.status.in_(RUNNING),
            )

    @retried_read
    def find_failed_for(
        self, job_name: str, exit_codes: Sequence[str], conn: Connection | None = None
    ) -> list[JobExecution]:
        """The newest execution of each instance of ``job_name`` when it ended FAILED with one
        of ``exit_codes`` (what an automatic restart looks for)."""
        newer = JOB_EXECUTION.alias("newer")
        with self.db.read(conn) as c:
            return self.job_executions(
                c,
                JOB_INSTANCE.c.job_name == job_name,
                JOB_EXECUTION.c.status == BatchStatus.FAILED.value,
                JOB_EXECUTION.c.exit_code.in_(list(exit_codes)),
                ~exists().where(
                    newer.c.job_instance_id == JOB_EXECUTION.c.job_instance_id,
                    newer.c.job_execution_id > JOB_EXECUTION.c.job_execution_id,
                ),
            )

    @retried_read
    def count_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> int:
        stmt = (
            select(func.count())
            .select_from(JOB_EXECUTION)
            .where(JOB_EXECUTION.c.job_instance_id == job_instance.id)
        )
        with self.db.read(conn) as c:
            return int(c.execute(stmt).scalar_one())

    def job_executions(
        self, c: Connection, *where: Any, limit: int | None = None
    ) -> list[JobExecution]:
        """The job executions ``where`` says, newest first, with their parameters."""
        stmt = (
            select(*EXECUTION_COLUMNS)
            .join(JOB_INSTANCE, JOB_INSTANCE.c.job_instance_id == JOB_EXECUTION.c.job_instance_id)
            .outerjoin(
                JOB_CONTEXT, JOB_CONTEXT.c.job_execution_id == JOB_EXECUTION.c.job_execution_id
            )
            .where(*where)
            .order_by(JOB_EXECUTION.c.create_time.desc(), JOB_EXECUTION.c.job_execution_id.desc())
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        rows = c.execute(stmt).all()
        if not rows:
            return []
        ids = [int(r._mapping["job_execution_id"]) for r in rows]
        params: dict[int, dict[str, JobParameter]] = {i: {} for i in ids}
        for batch in in_batches(ids):
            for p in c.execute(
                select(JOB_PARAMS)
                .where(JOB_PARAMS.c.job_execution_id.in_(batch))
                .order_by(JOB_PARAMS.c.job_execution_id, JOB_PARAMS.c.parameter_name)
            ).all():
                pm = p._mapping
                params[int(pm["job_execution_id"])][pm["parameter_name"]] = parameter_from(pm)
        return [
            job_execution_from(m, params[int(m["job_execution_id"])])
            for m in (row._mapping for row in rows)
        ]
