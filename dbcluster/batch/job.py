"""Jobs: an ordered list of steps; a step that does not complete stops the job."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, StepExecution, utcnow
from dbcluster.batch.exceptions import StartLimitExceededError
from dbcluster.batch.listeners import call_listeners
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step, describe_failure

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)


class Job:
    """A named, ordered list of steps.

    ``restartable``: a FAILED/STOPPED execution may be restarted. ``allow_start_if_complete``: a
    COMPLETED instance may run again (every step runs afresh). ``start_limit``: at most that many
    executions per job instance.
    """

    def __init__(
        self,
        name: str,
        steps: Sequence[Step],
        *,
        restartable: bool = True,
        allow_start_if_complete: bool = False,
        start_limit: int | None = None,
        listeners: Sequence[Any] = (),
    ) -> None:
        if not name:
            raise ValueError("a job needs a name")
        if not steps:
            raise ValueError(f"job {name!r} needs at least one step")
        seen: set[str] = set()
        for step in steps:
            for nested in step.steps():
                if nested.name in seen:
                    raise ValueError(f"job {name!r} has two steps named {nested.name!r}")
                seen.add(nested.name)
        self.name = name
        self.steps = list(steps)
        self.restartable = restartable
        self.allow_start_if_complete = allow_start_if_complete
        self.start_limit = start_limit
        self.listeners = list(listeners)

    def __repr__(self) -> str:
        return f"Job({self.name!r}, steps={[s.name for s in self.steps]!r})"

    def all_steps(self) -> list[Step]:
        return [nested for step in self.steps for nested in step.steps()]

    def execute(self, job_execution: JobExecution, runtime: BatchRuntime) -> None:
        """Run the steps in order, skipping those a previous (not COMPLETED) execution of the same
        instance completed; record the outcome."""
        je = job_execution
        repository = runtime.repository
        previous = [e for e in repository.get_job_executions(je.job_instance) if e.id != je.id]
        restarting = bool(previous) and previous[0].status is not BatchStatus.COMPLETED
        je.start_time = utcnow()
        je.status = BatchStatus.STARTED
        je.exit_status = ExitStatus.EXECUTING
        repository.update_job_execution(je)
        try:
            call_listeners(self.listeners, "before_job", je)
            for step in self.steps:
                se = self._start_step(step, je, runtime, restarting)
                if se is None:
                    continue
                step.execute(se, runtime)
                je.step_executions.append(se)
                if se.status is not BatchStatus.COMPLETED:
                    je.status = BatchStatus.max(BatchStatus.STOPPED, se.status)
                    reason = se.exit_status.description.strip().splitlines()
                    je.exit_status = ExitStatus(
                        se.exit_status.code,
                        f"step {se.step_name!r} ended {se.status.value}"
                        + (f": {reason[-1]}" if reason else ""),
                    )
                    break
            else:
                je.status = BatchStatus.COMPLETED
                je.exit_status = ExitStatus.COMPLETED
        except Exception as error:
            log.warning("job %s (execution %s) failed: %s", self.name, je.id, error)
            je.failure_exceptions.append(error)
            je.status = BatchStatus.FAILED
            je.exit_status = ExitStatus.FAILED.with_description(describe_failure(error))
        try:
            call_listeners(self.listeners, "after_job", je)
        except Exception as error:
            log.warning("after_job listener of %s failed: %s", self.name, error)
            je.failure_exceptions.append(error)
            je.status = BatchStatus.FAILED
            je.exit_status = je.exit_status.and_(
                ExitStatus.FAILED.with_description(describe_failure(error))
            )
        je.end_time = utcnow()
        with repository.engine.begin() as conn:
            repository.update_job_execution_context(je, conn)
            repository.update_job_execution(je, conn)

    def _start_step(
        self, step: Step, je: JobExecution, runtime: BatchRuntime, restarting: bool
    ) -> StepExecution | None:
        repository = runtime.repository
        context = ExecutionContext()
        if restarting:
            last = repository.get_last_step_execution(je.job_instance, step.name)
            if last is not None:
                if last.status is BatchStatus.COMPLETED and not step.allow_start_if_complete:
                    log.info("step %s already completed; skipped on restart", step.name)
                    return None
                if last.status is not BatchStatus.COMPLETED:
                    context = last.execution_context.copy()
        if step.start_limit is not None:
            count = repository.count_step_executions(je.job_instance, step.name)
            if count >= step.start_limit:
                raise StartLimitExceededError(
                    f"step {step.name!r} has been started {count} times in this job instance; "
                    f"its start_limit is {step.start_limit}"
                )
        return repository.create_step_execution(je, step.name, context)
