"""The chunk context handed to tasklets and writers: the transaction and the step execution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import StepExecution
from dbcluster.batch.parameters import JobParameters

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime


@dataclass
class ChunkContext:
    """One transaction of a step.

    ``connection`` is the transaction the step's counters and context commit in: write through it
    and your writes commit (or roll back, e.g. when fenced) together with them.
    """

    connection: Connection
    step_execution: StepExecution
    runtime: BatchRuntime

    @property
    def step_context(self) -> ExecutionContext:
        return self.step_execution.execution_context

    @property
    def job_context(self) -> ExecutionContext:
        return self.step_execution.job_execution.execution_context

    @property
    def job_parameters(self) -> JobParameters:
        return self.step_execution.job_execution.parameters
