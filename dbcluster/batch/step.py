"""The step base class: lifecycle, listeners and the final persistence of every step kind."""

from __future__ import annotations

import logging
import traceback
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from dbcluster.batch.domain import StepExecution, utcnow
from dbcluster.batch.listeners import call_listeners
from dbcluster.batch.status import BatchStatus, ExitStatus

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)


def describe_failure(error: BaseException) -> str:
    """The exit description of a failure: the exception and its traceback (clipped on storage)."""
    return "".join(traceback.format_exception(error)).strip()


def persist_step(step_execution: StepExecution, runtime: BatchRuntime, conn: Connection) -> None:
    """Write the step's context (if changed) and row in ``conn``'s transaction."""
    repository = runtime.repository
    if step_execution.execution_context.dirty:
        repository.update_step_execution_context(step_execution, conn)
    repository.update_step_execution(step_execution, conn)


class Step(ABC):
    """A named unit of work in a job.

    ``allow_start_if_complete``: on a restart, run again even if it completed before.
    ``start_limit``: how many times this step may be started within one job instance.
    """

    def __init__(
        self,
        name: str,
        *,
        listeners: Sequence[Any] = (),
        allow_start_if_complete: bool = False,
        start_limit: int | None = None,
    ) -> None:
        if not name or ":" in name:
            raise ValueError(f"step names must be non-empty and contain no ':': {name!r}")
        self.name = name
        self.listeners = list(listeners)
        self.allow_start_if_complete = allow_start_if_complete
        self.start_limit = start_limit

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        """Run the step and persist its final status, counters and context.

        A failure inside the step ends it FAILED (it is recorded, not raised). What is raised is a
        failure to persist the outcome, e.g. ``OptimisticLockingFailureError`` when the execution's
        write guard no longer holds.
        """
        se = step_execution
        repository = runtime.repository
        se.start_time = utcnow()
        se.status = BatchStatus.STARTED
        se.exit_status = ExitStatus.EXECUTING
        repository.update_step_execution(se)
        log.debug("step %s (execution %s) started", se.step_name, se.id)
        try:
            call_listeners(self.listeners, "before_step", se)
            self.do_execute(se, runtime)
            if se.status.is_running:
                se.status = BatchStatus.STOPPED if se.terminate_only else BatchStatus.COMPLETED
            if se.exit_status.code == "EXECUTING":
                se.exit_status = ExitStatus.from_batch_status(se.status)
        except Exception as error:
            log.warning("step %s (execution %s) failed: %s", se.step_name, se.id, error)
            se.failure_exceptions.append(error)
            se.status = BatchStatus.FAILED
            se.exit_status = ExitStatus.FAILED.with_description(describe_failure(error))
        try:
            for exit_status in call_listeners(self.listeners, "after_step", se):
                if exit_status is not None:
                    se.exit_status = se.exit_status.and_(exit_status)
        except Exception as error:
            log.warning("after_step listener of %s failed: %s", se.step_name, error)
            se.failure_exceptions.append(error)
            se.status = BatchStatus.max(se.status, BatchStatus.FAILED)
            se.exit_status = se.exit_status.and_(
                ExitStatus.FAILED.with_description(describe_failure(error))
            )
        se.end_time = utcnow()
        with repository.engine.begin() as conn:
            se.execution_context.dirty = True
            persist_step(se, runtime, conn)
            if se.on_final_commit is not None:
                se.on_final_commit(conn)
        log.debug("step %s (execution %s) ended %s", se.step_name, se.id, se.status.value)

    @abstractmethod
    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        """The step's work. Raise to fail; set ``step_execution.status`` to end otherwise than
        COMPLETED; return at a boundary when ``step_execution.terminate_only`` is set."""

    def steps(self) -> list[Step]:
        """This step and every step nested in it (partition workers)."""
        return [self]
