"""Job instances: a job's name and the key of its identifying parameters."""

from __future__ import annotations

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from dbcluster.batch.dao.connections import Dao, retried_read
from dbcluster.batch.dao.rows import instance_from
from dbcluster.batch.dao.statements import JOB_INSTANCE, SELECT_INSTANCE
from dbcluster.batch.domain import JobInstance
from dbcluster.batch.parameters import JobParameters


class JobInstanceDao(Dao):
    """Creates, finds and locks job instances."""

    def create_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance:
        key = params.job_key()
        with self.db.transaction(conn) as c:
            new_id = self.db.insert_id(
                c, JOB_INSTANCE, {"job_name": job_name, "job_key": key, "version": 0}
            )
        return JobInstance(id=new_id, job_name=job_name, job_key=key, version=0)

    def get_or_create_job_instance(self, job_name: str, params: JobParameters) -> JobInstance:
        """The instance for these parameters; tolerates a concurrent creator."""
        found = self.get_job_instance(job_name, params)
        if found is not None:
            return found
        try:
            return self.create_job_instance(job_name, params)
        except IntegrityError:
            found = self.get_job_instance(job_name, params)
            if found is None:
                raise
            return found

    @retried_read
    def get_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance | None:
        with self.db.read(conn) as c:
            row = c.execute(
                SELECT_INSTANCE, {"b_name": job_name, "b_key": params.job_key()}
            ).first()
        return None if row is None else instance_from(row._mapping)

    @retried_read
    def get_job_instance_by_id(
        self, instance_id: int, conn: Connection | None = None
    ) -> JobInstance | None:
        with self.db.read(conn) as c:
            row = c.execute(
                select(JOB_INSTANCE).where(JOB_INSTANCE.c.job_instance_id == instance_id)
            ).first()
        return None if row is None else instance_from(row._mapping)

    @staticmethod
    def lock_job_instance(instance: JobInstance, conn: Connection) -> None:
        """Take the instance's row lock for the rest of ``conn``'s transaction (serializes launches
        of the same instance across processes)."""
        conn.execute(
            update(JOB_INSTANCE)
            .where(JOB_INSTANCE.c.job_instance_id == instance.id)
            .values(version=JOB_INSTANCE.c.version + 1)
        )
        instance.version += 1
