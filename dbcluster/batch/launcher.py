"""The job launcher: run a job with parameters, or restart a failed execution."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, JobInstance
from dbcluster.batch.exceptions import (
    JobExecutionAlreadyRunningError,
    JobInstanceAlreadyCompleteError,
    JobParametersError,
    JobRestartError,
    NoSuchJobExecutionError,
    StartLimitExceededError,
)
from dbcluster.batch.job import Job
from dbcluster.batch.local import LocalPartitionHandler
from dbcluster.batch.parameters import JobParameters, as_job_parameters
from dbcluster.batch.registry import JobRegistry
from dbcluster.batch.repository import InsertExtras, JobRepository
from dbcluster.batch.runtime import BatchRuntime, PartitionHandler
from dbcluster.batch.status import BatchStatus

log = logging.getLogger(__name__)

#: How a job step's child job execution is made: ``(job, params, context) -> execution``.
ChildExecutions = Callable[[Job, JobParameters, ExecutionContext | None], JobExecution]


class JobLauncher:
    """Launches jobs synchronously in this process.

    ``partition_handler`` is the default for partition steps that name none (default: a
    :class:`LocalPartitionHandler`); ``registry`` lets :meth:`restart` find a job by name.
    ``child_executions(job, params, context)`` makes the execution of a job a
    :class:`~dbcluster.batch.jobstep.JobStep` runs (default: :meth:`create_execution`; a cluster
    gives its own, which makes the child's coordination row too).
    """

    def __init__(
        self,
        repository: JobRepository,
        partition_handler: PartitionHandler | None = None,
        registry: JobRegistry | None = None,
        *,
        child_executions: ChildExecutions | None = None,
    ) -> None:
        self.repository = repository
        self.runtime = BatchRuntime(
            repository=repository,
            partition_handler=partition_handler or LocalPartitionHandler(),
            registry=registry,
            create_execution=child_executions or self._create_child_execution,
        )

    def _create_child_execution(
        self, job: Job, params: JobParameters, context: ExecutionContext | None
    ) -> JobExecution:
        return self.create_execution(job, params, context=context)

    def run(
        self, job: Job, params: JobParameters | Mapping[str, Any] | None = None
    ) -> JobExecution:
        """Run ``job`` with ``params`` and return its (finished) execution.

        Refuses a COMPLETED instance (:class:`JobInstanceAlreadyCompleteError`) and an instance
        with a running execution (:class:`JobExecutionAlreadyRunningError`); a FAILED, STOPPED or
        ABANDONED instance runs again as a new execution that resumes where the last one stopped.
        """
        return self._run(job, self.create_execution(job, as_job_parameters(params)))

    def _run(self, job: Job, execution: JobExecution) -> JobExecution:
        log.info("launching job %s, execution %s", job.name, execution.id)
        job.execute(execution, self.runtime)
        log.info("job %s, execution %s ended %s", job.name, execution.id, execution.status.value)
        return execution

    def next_parameters(
        self, job: Job, extra: JobParameters | Mapping[str, Any] | None = None
    ) -> JobParameters:
        """The parameters of the job's next run (Spring's ``startNextInstance``): its
        incrementer applied to the parameters of its last instance's last execution, then
        ``extra`` on top."""
        if job.incrementer is None:
            raise JobParametersError(
                f"job {job.name!r} has no incrementer; give it Job(..., incrementer="
                f"RunIdIncrementer()) to start its next run"
            )
        last = self.repository.get_last_job_instance_execution(job.name)
        made = job.incrementer.get_next(last.parameters if last is not None else None)
        values = made.parameters()
        values.update(as_job_parameters(extra).parameters())
        return JobParameters(values)

    def restart(self, execution_id: int, job: Job | None = None) -> JobExecution:
        """Run the instance of execution ``execution_id`` again, with its parameters."""
        old = self.repository.get_job_execution(execution_id)
        if old is None:
            raise NoSuchJobExecutionError(f"there is no job execution with id {execution_id}")
        if job is None:
            if self.runtime.registry is None:
                raise JobRestartError(
                    f"cannot restart execution {execution_id}: pass the job or give the "
                    f"launcher a registry"
                )
            job = self.runtime.registry.get_job(old.job_name)
        elif job.name != old.job_name:
            raise JobRestartError(
                f"execution {execution_id} belongs to job {old.job_name!r}, not {job.name!r}"
            )
        return self._run(job, self.create_execution(job, old.parameters, existing=True))

    def create_execution(
        self,
        job: Job,
        params: JobParameters,
        on_created: Callable[[Connection, JobExecution], None] | None = None,
        context: ExecutionContext | None = None,
        *,
        check: Callable[[Connection, list[JobExecution]], None] | None = None,
        existing: bool = False,
        riders: InsertExtras | None = None,
    ) -> JobExecution:
        """Check that the instance may start and create its new execution, already STARTED,
        in one transaction under the instance's row lock (so that concurrent launchers cannot
        both pass the checks); the instance is created in it if it is new.

        ``check(conn, executions)`` adds a check of the caller's on the instance's executions
        (newest first) in the same transaction; ``on_created(conn, execution)`` runs in it last
        (a cluster master records its mastership there, so no execution ever exists without an
        owner survivors can see). ``existing``: the caller knows the instance exists (a
        restart), so the launch reads it first instead of trying to create it. ``riders``: what
        a first launch's creating statement also writes and reads where it can (see
        :class:`~dbcluster.batch.dao.combined.InsertExtras`; ``on_created`` then sees their
        ``rows``).
        """
        job.validate_parameters(params)
        repository = self.repository
        made: list[JobExecution] = []

        def create(conn: Connection) -> JobExecution:
            made[:] = [
                self._create(job, params, conn, on_created, context, check, existing, riders)
            ]
            return made[0]

        def created(conn: Connection) -> bool:
            # A commit whose acknowledgement was lost: it took effect if the execution that try
            # made exists (a committed execution's id is never made again; on SQLite, whose
            # commits have no acknowledgement to lose, an id an insert rolled back can be).
            return bool(made) and repository.get_job_execution(made[0].id, conn) is not None

        for attempt in range(2):
            try:
                # Repeated on a transient error (a lock wait, a deadlock, SQLite's read-to-write
                # upgrade refused while another writer commits): nothing of it was committed.
                return repository.transactions.run(
                    create, verify=created, what=f"launch of {job.name}"
                )
            except IntegrityError:
                # Another launcher created the same new instance first: its row is there now.
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _create(
        self,
        job: Job,
        params: JobParameters,
        conn: Connection,
        on_created: Callable[[Connection, JobExecution], None] | None,
        context: ExecutionContext | None,
        check: Callable[[Connection, list[JobExecution]], None] | None,
        existing: bool,
        riders: InsertExtras | None = None,
    ) -> JobExecution:
        repository = self.repository
        execution: JobExecution | None = None
        instance: JobInstance | None = None
        executions: list[JobExecution] = []
        first = job.first_step()
        if repository.creates_instance_if_absent and not existing:
            # A first launch (the usual one) creates its instance, its execution and its first
            # step's execution in one statement without reading first; where the instance
            # exists it writes nothing (having waited for one another launcher was committing),
            # and the launch reads it.
            execution = repository.create_instance_if_absent(
                job.name,
                params,
                context,
                conn,
                started=True,
                first_step=first.name if first is not None else None,
                riders=riders,
            )
        if execution is None:
            instance = repository.get_job_instance(job.name, params, conn)
            if instance is not None:
                repository.lock_job_instance(instance, conn)
                executions = repository.get_job_executions(instance, conn)
                self._may_run_again(job, instance, executions)
        if check is not None:
            check(conn, executions)
        if execution is None and instance is None:
            # New: created with its execution; its insert holds the instance's row until
            # COMMIT, as the lock above would (a concurrent creator's insert fails).
            execution = repository.create_instance_and_execution(
                job.name, params, context, conn, started=True
            )
        elif execution is None:
            assert instance is not None
            execution = repository.create_job_execution(
                instance, params, context, conn=conn, started=True
            )
        execution.earlier = executions
        if not executions and first is not None and first.name not in execution.prepared_steps:
            # A first launch starts with this step: create its execution now, STARTED, rather
            # than in a transaction of its own.
            execution.prepared_steps[first.name] = repository.create_step_execution(
                execution, first.name, None, conn, started=True
            )
        if on_created is not None:
            on_created(conn, execution)
        return execution

    @staticmethod
    def _may_run_again(job: Job, instance: JobInstance, executions: list[JobExecution]) -> None:
        """Refuse a new execution of an existing instance that its executions (newest first)
        forbid: one still running, a COMPLETED one, a non-restartable job that ran, the start
        limit reached."""
        running = [e for e in executions if e.status.is_running]
        if running:
            raise JobExecutionAlreadyRunningError(
                f"job {job.name!r} instance {instance.id} already has execution "
                f"{running[0].id} in status {running[0].status.value}"
            )
        if executions:
            last = executions[0]
            if last.status is BatchStatus.COMPLETED and not job.allow_start_if_complete:
                raise JobInstanceAlreadyCompleteError(
                    f"job {job.name!r} instance {instance.id} already completed (execution "
                    f"{last.id}); run it with different identifying parameters"
                )
            if not job.restartable and last.status is not BatchStatus.COMPLETED:
                raise JobRestartError(
                    f"job {job.name!r} is not restartable and instance {instance.id} already "
                    f"ran (execution {last.id}, {last.status.value})"
                )
            if job.start_limit is not None and len(executions) >= job.start_limit:
                raise StartLimitExceededError(
                    f"job {job.name!r} instance {instance.id} has been started "
                    f"{len(executions)} times; its start_limit is {job.start_limit}"
                )
