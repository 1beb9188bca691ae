"""Job steps: a step that runs another job (Spring Batch's ``JobStep``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, StepExecution
from dbcluster.batch.fence import FencedError
from dbcluster.batch.job import Job
from dbcluster.batch.parameters import JobParameters, as_job_parameters
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step, commit_step

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)

#: Step-context key: the id of the child job execution this step runs or ran.
CHILD_KEY = "dbcluster.job_step.execution"
#: Child job-context key: which job instance and step launched it.
LAUNCHED_BY_KEY = "dbcluster.job_step.launched_by"


class JobStep(Step):
    """Runs ``job`` as one step: a new execution of the job instance its parameters name (a
    restart of it when its last execution failed), in this process, under the runtime's
    ``create_execution`` (on a cluster the child is a job of its own, mastered by this node
    and taken over like any other if the node is lost). The step ends with the child's status
    and exit code.

    ``parameters``: the child's parameters: a mapping, or ``fn(step_execution)`` returning one;
    default: the parent job's parameters.

    A master that takes the parent over while the child runs (or after it ended) adopts that
    child execution instead of starting another: it follows it to its end, checking every
    ``poll_interval`` seconds.
    """

    def __init__(
        self,
        name: str,
        job: Job,
        *,
        parameters: Mapping[str, Any] | Callable[[StepExecution], Mapping[str, Any]] | None = None,
        poll_interval: float = 1.0,
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        self.job = job
        self.parameters = parameters
        self.poll_interval = poll_interval

    def _parameters(self, se: StepExecution) -> JobParameters:
        if self.parameters is None:
            return se.job_execution.parameters
        made = self.parameters(se) if callable(self.parameters) else self.parameters
        return as_job_parameters(made)

    def _launched_by(self, se: StepExecution) -> dict[str, Any]:
        return {"job_instance": se.job_execution.job_instance.id, "step": self.name}

    def _adoptable(
        self, se: StepExecution, params: JobParameters, runtime: BatchRuntime
    ) -> JobExecution | None:
        """The child execution an earlier run of this step (in this job instance) left running,
        or completed without recording it (its master was lost in between)."""
        repository = runtime.repository
        instance = repository.get_job_instance(self.job.name, params)
        if instance is None:
            return None
        executions = repository.get_job_executions(instance)
        newest = executions[0] if executions else None
        if newest is None or newest.execution_context.get(LAUNCHED_BY_KEY) != self._launched_by(se):
            return None
        # A failed or stopped child is restarted (a new execution of its instance).
        if newest.status.is_running or newest.status is BatchStatus.COMPLETED:
            return newest
        return None

    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        se = step_execution
        params = self._parameters(se)
        child = self._adoptable(se, params, runtime)
        if child is not None and child.status.is_running:
            log.info("step %s follows job execution %s it launched", self.name, child.id)
            child = self._follow(se, child.id, runtime)
        elif child is None:
            create = runtime.create_execution
            if create is None:
                raise RuntimeError("this runtime cannot create job executions")
            child = create(
                self.job, params, ExecutionContext({LAUNCHED_BY_KEY: self._launched_by(se)})
            )
            se.execution_context.put(CHILD_KEY, child.id)
            commit_step(se, runtime)
            try:
                self.job.execute(child, runtime)
            except FencedError:
                # Another node took the child over: it finishes it.
                child = self._follow(se, child.id, runtime)
        if child is None or child.status.is_running:
            se.status = BatchStatus.STOPPED
            return
        se.execution_context.put(CHILD_KEY, child.id)
        code = child.exit_status.code
        if child.status is not BatchStatus.COMPLETED:
            se.status = BatchStatus.max(BatchStatus.STOPPED, child.status)
        se.exit_status = ExitStatus(
            code, f"job {self.job.name!r} execution {child.id} ended {child.status.value}"
        )

    def _follow(
        self, se: StepExecution, execution_id: int, runtime: BatchRuntime
    ) -> JobExecution | None:
        """Wait for a child execution run elsewhere to end (or for this step to be stopped)."""
        while True:
            child = runtime.repository.get_job_execution(execution_id)
            if child is None or not child.status.is_running or se.should_stop:
                return child
            time.sleep(self.poll_interval)
