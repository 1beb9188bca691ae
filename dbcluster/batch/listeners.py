"""Listener protocols: implement any subset of the methods."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dbcluster.batch.domain import JobExecution, StepExecution
    from dbcluster.batch.status import ExitStatus


class JobListener:
    """Called before and after a job execution (override what you need)."""

    def before_job(self, job_execution: JobExecution) -> None:
        return None

    def after_job(self, job_execution: JobExecution) -> None:
        return None


class StepListener:
    """Called before and after a step execution; ``after_step`` may return an exit status that is
    combined (``and_``) with the step's own."""

    def before_step(self, step_execution: StepExecution) -> None:
        return None

    def after_step(self, step_execution: StepExecution) -> ExitStatus | None:
        return None


def call_listeners(listeners: list[Any], method: str, *args: Any) -> list[Any]:
    """Call ``method`` on every listener that has it; return the results."""
    results = []
    for listener in listeners:
        fn = getattr(listener, method, None)
        if fn is not None:
            results.append(fn(*args))
    return results
