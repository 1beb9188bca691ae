"""The job launcher: run a job with parameters, or restart a failed execution."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dbcluster.batch.domain import JobExecution
from dbcluster.batch.exceptions import (
    JobExecutionAlreadyRunningError,
    JobInstanceAlreadyCompleteError,
    JobRestartError,
    NoSuchJobExecutionError,
    StartLimitExceededError,
)
from dbcluster.batch.job import Job
from dbcluster.batch.local import LocalPartitionHandler
from dbcluster.batch.parameters import JobParameters, as_job_parameters
from dbcluster.batch.partition import PartitionHandler
from dbcluster.batch.registry import JobRegistry
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.runtime import BatchRuntime
from dbcluster.batch.status import BatchStatus

log = logging.getLogger(__name__)


class JobLauncher:
    """Launches jobs synchronously in this process.

    ``partition_handler`` is the default for partition steps that name none (default: a
    :class:`LocalPartitionHandler`); ``registry`` lets :meth:`restart` find a job by name.
    """

    def __init__(
        self,
        repository: JobRepository,
        partition_handler: PartitionHandler | None = None,
        registry: JobRegistry | None = None,
    ) -> None:
        self.repository = repository
        self.runtime = BatchRuntime(
            repository=repository,
            partition_handler=partition_handler or LocalPartitionHandler(),
            registry=registry,
        )

    def run(
        self, job: Job, params: JobParameters | Mapping[str, Any] | None = None
    ) -> JobExecution:
        """Run ``job`` with ``params`` and return its (finished) execution.

        Refuses a COMPLETED instance (:class:`JobInstanceAlreadyCompleteError`) and an instance
        with a running execution (:class:`JobExecutionAlreadyRunningError`); a FAILED, STOPPED or
        ABANDONED instance runs again as a new execution that resumes where the last one stopped.
        """
        execution = self.create_execution(job, as_job_parameters(params))
        log.info("launching job %s, execution %s", job.name, execution.id)
        job.execute(execution, self.runtime)
        log.info("job %s, execution %s ended %s", job.name, execution.id, execution.status.value)
        return execution

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
        return self.run(job, old.parameters)

    def create_execution(self, job: Job, params: JobParameters) -> JobExecution:
        """Check that the instance may start and create its new execution (STARTING), under the
        instance's row lock so that concurrent launchers cannot both pass the checks."""
        repository = self.repository
        instance = repository.get_or_create_job_instance(job.name, params)
        with repository.engine.begin() as conn:
            repository.lock_job_instance(instance, conn)
            executions = repository.get_job_executions(instance, conn)
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
            return repository.create_job_execution(instance, params, conn=conn)
