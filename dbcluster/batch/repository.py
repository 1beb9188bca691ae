"""The job repository: every job and step execution recorded in SQL, on SQLAlchemy Core.

Every write method takes an optional ``conn``: given, it runs inside that connection's transaction
and does not commit; omitted, it runs in its own transaction. Updates are guarded by ``version``
(optimistic locking). Steps and jobs write through :attr:`JobRepository.transactions`, which
repeats transient errors and holds each execution's fence (see :mod:`dbcluster.batch.fence`).

:class:`JobRepository` is a façade: each record kind has its data access object in
:mod:`dbcluster.batch.dao`, and the statements a database can combine into one round trip are
built once per repository (:class:`~dbcluster.batch.dao.combined.CombinedStatements`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.dao import rows
from dbcluster.batch.dao.combined import CombinedStatements, InsertExtras
from dbcluster.batch.dao.connections import Connections
from dbcluster.batch.dao.contexts import ExecutionContextDao
from dbcluster.batch.dao.creation import ExecutionCreation
from dbcluster.batch.dao.job_executions import JobExecutionDao
from dbcluster.batch.dao.job_instances import JobInstanceDao
from dbcluster.batch.dao.step_executions import StepExecutionDao
from dbcluster.batch.domain import JobExecution, JobInstance, PartitionsEnded, StepExecution
from dbcluster.batch.fence import FoldedGuard
from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.status import BatchStatus
from dbcluster.batch.transactions import RetryPolicy, Settling, Transactions

__all__ = ["InsertExtras", "JobRepository", "Riders"]

#: The former name of :class:`~dbcluster.batch.dao.combined.InsertExtras`, kept for callers.
Riders = InsertExtras


def _provider(engine: Engine) -> Any:
    from dbcluster.dialects import get_provider

    return get_provider(engine)


class JobRepository:
    """Creates, updates and finds job instances, job executions and step executions."""

    def __init__(
        self, engine: Engine, retry: RetryPolicy | None = None, *, reader: Engine | None = None
    ) -> None:
        self.engine = engine
        #: Where reads outside a caller's transaction run: an autocommit engine of the same
        #: database makes each statement one round trip (no BEGIN, no ROLLBACK).
        self.reader = reader or engine
        #: Step and job transactions, repeated on transient errors under ``retry``.
        provider = _provider(engine)
        self.transactions = Transactions(engine, retry, Settling.of(provider))
        # An unclear commit is judged by locking reads: they wait for a commit still in flight
        # (behind a pooler, or on MySQL and MariaDB, where its session cannot be ended first).
        db = Connections(engine, self.transactions, self.reader, provider.locked)
        #: This database's combined statements, built once (see :mod:`dbcluster.batch.dao`).
        self.combined = CombinedStatements(provider, engine.dialect)
        #: The data access objects behind this façade.
        self.instances = JobInstanceDao(db)
        self.contexts = ExecutionContextDao(db)
        self.creation = ExecutionCreation(db, self.combined, self.instances, self.contexts)
        self.job_executions = JobExecutionDao(db, self.instances)
        self.step_executions = StepExecutionDao(
            db, self.combined, self.contexts, self.job_executions
        )
        self._db = db

    def step_version_is(
        self, execution: StepExecution, version: int
    ) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit: the step execution's row carries ``version``. A row
        at any other version than that or the one before was written by someone else."""
        return self.step_executions.step_version_is(execution, version)

    def step_versions_are(
        self, executions: Sequence[StepExecution], versions: Sequence[int]
    ) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit of a group's transaction (see
        :meth:`StepExecutionDao.step_versions_are`)."""
        return self.step_executions.step_versions_are(executions, versions)

    def job_version_is(self, execution: JobExecution, version: int) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit of a job-execution write (see :meth:`step_version_is`)."""
        return self.job_executions.job_version_is(execution, version)

    @contextmanager
    def transaction(self, conn: Connection | None = None) -> Iterator[Connection]:
        """``conn`` itself if given (its transaction, not committed here), else a new transaction
        committed on exit."""
        with self._db.transaction(conn) as c:
            yield c

    # --- job instances -----------------------------------------------------------------------

    def create_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance:
        return self.instances.create_job_instance(job_name, params, conn)

    def get_or_create_job_instance(self, job_name: str, params: JobParameters) -> JobInstance:
        """The instance for these parameters; tolerates a concurrent creator."""
        return self.instances.get_or_create_job_instance(job_name, params)

    def get_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance | None:
        return self.instances.get_job_instance(job_name, params, conn)

    def get_job_instance_by_id(
        self, instance_id: int, conn: Connection | None = None
    ) -> JobInstance | None:
        return self.instances.get_job_instance_by_id(instance_id, conn)

    def lock_job_instance(self, instance: JobInstance, conn: Connection) -> None:
        """Take the instance's row lock for the rest of ``conn``'s transaction (serializes launches
        of the same instance across processes)."""
        self.instances.lock_job_instance(instance, conn)

    # --- job executions ----------------------------------------------------------------------

    def create_job_execution(
        self,
        job_instance: JobInstance,
        params: JobParameters,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
        *,
        started: bool = False,
    ) -> JobExecution:
        """A new execution of the instance, STARTING; with ``started``, already STARTED."""
        return self.creation.create_job_execution(
            job_instance, params, context, conn, started=started
        )

    def create_instance_and_execution(
        self,
        job_name: str,
        params: JobParameters,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
        *,
        started: bool = False,
    ) -> JobExecution:
        """A new instance of ``job_name`` for ``params`` and its first execution (one statement
        where the database can; see :meth:`ExecutionCreation.create_instance_and_execution`)."""
        return self.creation.create_instance_and_execution(
            job_name, params, context, conn, started=started
        )

    @property
    def creates_instance_if_absent(self) -> bool:
        """Whether :meth:`create_instance_if_absent` can be asked (one statement, no read first)."""
        return self.creation.creates_instance_if_absent

    def create_instance_if_absent(
        self,
        job_name: str,
        params: JobParameters,
        context: ExecutionContext | None,
        conn: Connection,
        *,
        started: bool = False,
        first_step: str | None = None,
        riders: InsertExtras | None = None,
    ) -> JobExecution | None:
        """As :meth:`create_instance_and_execution` in one statement, without reading first
        whether the instance exists: None, having written nothing, where it exists.
        ``first_step``: that step's execution is created too; ``riders``: the
        :class:`InsertExtras` the statement carries (see
        :meth:`ExecutionCreation.create_instance_if_absent`)."""
        return self.creation.create_instance_if_absent(
            job_name,
            params,
            context,
            conn,
            started=started,
            first_step=first_step,
            extras=riders,
        )

    def update_job_execution(self, execution: JobExecution, conn: Connection | None = None) -> None:
        self.job_executions.update_job_execution(execution, conn)

    def update_job_execution_context(
        self, execution: JobExecution, conn: Connection | None = None
    ) -> None:
        self.contexts.update_job_execution_context(execution, conn)

    def get_job_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> JobExecution | None:
        return self.job_executions.get_job_execution(execution_id, conn)

    def get_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        """Every execution of the instance, newest first."""
        return self.job_executions.get_job_executions(job_instance, conn)

    def get_last_job_execution(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobExecution | None:
        return self.job_executions.get_last_job_execution(job_name, params, conn)

    def get_last_job_instance_execution(
        self, job_name: str, conn: Connection | None = None
    ) -> JobExecution | None:
        """The newest execution of the job's newest instance (what an incrementer reads)."""
        return self.job_executions.get_last_job_instance_execution(job_name, conn)

    def find_running_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        return self.job_executions.find_running_job_executions(job_instance, conn)

    def find_failed_for(
        self, job_name: str, exit_codes: Sequence[str], conn: Connection | None = None
    ) -> list[JobExecution]:
        """The newest execution of each instance of ``job_name`` when it ended FAILED with one
        of ``exit_codes`` (what an automatic restart looks for)."""
        return self.job_executions.find_failed_for(job_name, exit_codes, conn)

    def count_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> int:
        return self.job_executions.count_job_executions(job_instance, conn)

    # --- step executions ---------------------------------------------------------------------

    def create_step_execution(
        self,
        job_execution: JobExecution,
        step_name: str,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
        *,
        started: bool = False,
    ) -> StepExecution:
        return self.creation.create_step_execution(
            job_execution, step_name, context, conn, started=started
        )

    def create_step_executions(
        self,
        job_execution: JobExecution,
        steps: Sequence[tuple[str, ExecutionContext | None]],
        conn: Connection | None = None,
        *,
        started: bool = False,
        context_of: StepExecution | None = None,
        riders: InsertExtras | None = None,
    ) -> list[StepExecution]:
        """Insert many step executions (e.g. a step's partitions) and their contexts in bulk.
        ``context_of``: that step execution's context is written too; ``riders``: the
        :class:`InsertExtras` the statement creating one step execution carries (see
        :meth:`ExecutionCreation.create_step_executions`)."""
        return self.creation.create_step_executions(
            job_execution, steps, conn, started=started, context_of=context_of, extras=riders
        )

    @property
    def commits_with_final_write(self) -> bool:
        """Whether a step's final write with its fence's guard is sent with the ``COMMIT`` in
        one round trip (see ``CombinedStatements.run_guarded_write``): nothing holds the owner
        row before that flight."""
        return self.combined.commits_with_final_write

    @property
    def folds_guards(self) -> bool:
        """Whether :meth:`update_step_execution` runs a fence's guard in its own statement."""
        return self.combined.folds_guards

    def update_step_execution(
        self,
        execution: StepExecution,
        conn: Connection | None = None,
        *,
        context: bool = False,
        guard: FoldedGuard | None = None,
    ) -> None:
        """Persist status, exit status, times and counters; bumps ``version``. ``context``: its
        execution context too; ``guard``: the fence's final guarded write, in the same statement
        (only where :attr:`folds_guards`; see :meth:`StepExecutionDao.update_step_execution`)."""
        self.step_executions.update_step_execution(execution, conn, context=context, guard=guard)

    def update_step_executions(self, executions: Sequence[StepExecution], conn: Connection) -> None:
        """The final writes of a group's executions in ``conn``'s transaction (see
        :meth:`StepExecutionDao.update_step_executions`)."""
        self.step_executions.update_step_executions(executions, conn)

    def update_step_execution_context(
        self, execution: StepExecution, conn: Connection | None = None
    ) -> None:
        self.contexts.update_step_execution_context(execution, conn)

    def fail_running(
        self,
        message: str,
        conn: Connection,
        *,
        job_execution_id: int | None = None,
        step_execution_id: int | None = None,
        step_execution_ids: Sequence[int] | None = None,
        exit_code: str = "FAILED",
        status: BatchStatus = BatchStatus.FAILED,
    ) -> int:
        """Mark FAILED, from outside the process that ran it, what is still running (see
        :meth:`StepExecutionDao.fail_running`). Returns the rows changed."""
        return self.step_executions.fail_running(
            message,
            conn,
            job_execution_id=job_execution_id,
            step_execution_id=step_execution_id,
            step_execution_ids=step_execution_ids,
            exit_code=exit_code,
            status=status,
        )

    def fail_running_job(
        self, job_execution_id: int, message: str, conn: Connection, exit_code: str = "FAILED"
    ) -> bool:
        """Mark a job execution FAILED if it is still running (see :meth:`fail_running`)."""
        return self.job_executions.fail_running_job(job_execution_id, message, conn, exit_code)

    def get_step_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> StepExecution | None:
        """One step execution with its context, its job execution and that job's parameters."""
        return self.step_executions.get_step_execution(execution_id, conn)

    def step_execution_exists(self, execution_id: int, conn: Connection | None = None) -> bool:
        return self.step_executions.step_execution_exists(execution_id, conn)

    def get_step_executions_by_ids(
        self, job_execution: JobExecution, ids: Sequence[int], conn: Connection | None = None
    ) -> list[StepExecution]:
        """Step executions of one job execution, reloaded, in the order of ``ids``."""
        return self.step_executions.get_step_executions_by_ids(job_execution, ids, conn)

    def partitions_ended(
        self, ids: Sequence[int], conn: Connection | None = None
    ) -> PartitionsEnded:
        """What a partitioned step aggregates of the step executions ``ids`` (its partitions,
        all ended; see :meth:`StepExecutionDao.partitions_ended`)."""
        return self.step_executions.partitions_ended(ids, conn)

    def get_step_executions(
        self, job_execution: JobExecution, conn: Connection | None = None
    ) -> list[StepExecution]:
        """Every step execution of a job execution, oldest first."""
        return self.step_executions.get_step_executions(job_execution, conn)

    def get_last_step_execution(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> StepExecution | None:
        """The newest execution of ``step_name`` in any execution of the instance."""
        return self.step_executions.get_last_step_execution(job_instance, step_name, conn)

    def get_last_step_executions(
        self,
        job_instance: JobInstance,
        step_names: Sequence[str],
        conn: Connection | None = None,
        before_job_execution_id: int | None = None,
    ) -> dict[str, StepExecution]:
        """The newest execution of each named step in the instance (optionally only those of job
        executions older than ``before_job_execution_id``)."""
        return self.step_executions.get_last_step_executions(
            job_instance, step_names, conn, before_job_execution_id
        )

    def count_step_executions(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> int:
        return self.step_executions.count_step_executions(job_instance, step_name, conn)

    # --- rows read elsewhere -----------------------------------------------------------------

    @staticmethod
    def job_execution_from_row(row: Any, prefix: str) -> JobExecution | None:
        """A job execution from a row holding its columns under ``prefix`` (a claim reads them
        with the partitions it won; see :func:`dbcluster.batch.dao.rows.job_execution_from_row`);
        None where the row holds none."""
        return rows.job_execution_from_row(row, prefix)

    @staticmethod
    def step_execution_from_row(row: Any, job_execution: JobExecution) -> StepExecution:
        """A step execution from a row holding its columns and its context's (a claim reads
        them with the partitions it won)."""
        return rows.step_execution_from_row(row, job_execution)
