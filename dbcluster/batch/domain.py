"""The recorded entities: job instances, job executions and step executions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.status import EXIT_EXECUTING, EXIT_UNKNOWN, BatchStatus, ExitStatus

COUNTER_NAMES: tuple[str, ...] = (
    "read_count",
    "write_count",
    "filter_count",
    "commit_count",
    "rollback_count",
    "read_skip_count",
    "process_skip_count",
    "write_skip_count",
)


def utcnow() -> datetime:
    """Now as a naive UTC datetime (what the repository stores)."""
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class JobInstance:
    id: int
    job_name: str
    job_key: str
    version: int = 0


@dataclass(eq=False)
class JobExecution:
    id: int
    job_instance: JobInstance
    parameters: JobParameters
    status: BatchStatus = BatchStatus.STARTING
    exit_status: ExitStatus = EXIT_UNKNOWN
    create_time: datetime = field(default_factory=utcnow)
    start_time: datetime | None = None
    end_time: datetime | None = None
    last_updated: datetime | None = None
    version: int = 0
    execution_context: ExecutionContext = field(default_factory=ExecutionContext)
    step_executions: list[StepExecution] = field(default_factory=list)
    failure_exceptions: list[BaseException] = field(default_factory=list)

    @property
    def job_name(self) -> str:
        return self.job_instance.job_name

    @property
    def is_running(self) -> bool:
        return self.status.is_running

    def __repr__(self) -> str:
        return (
            f"JobExecution(id={self.id}, job={self.job_name!r}, status={self.status.value}, "
            f"exit={self.exit_status.code})"
        )


@dataclass(eq=False)
class StepExecution:
    id: int
    step_name: str
    job_execution: JobExecution
    status: BatchStatus = BatchStatus.STARTING
    exit_status: ExitStatus = EXIT_EXECUTING
    create_time: datetime = field(default_factory=utcnow)
    start_time: datetime | None = None
    end_time: datetime | None = None
    last_updated: datetime | None = None
    version: int = 0
    read_count: int = 0
    write_count: int = 0
    filter_count: int = 0
    commit_count: int = 0
    rollback_count: int = 0
    read_skip_count: int = 0
    process_skip_count: int = 0
    write_skip_count: int = 0
    execution_context: ExecutionContext = field(default_factory=ExecutionContext)
    #: Set (by anyone) to make the step end STOPPED at its next chunk / tasklet boundary.
    terminate_only: bool = False
    #: In memory only: an extra predicate every step-execution UPDATE must also satisfy (fencing).
    write_guard: ColumnElement[bool] | None = None
    #: In memory only: called with the connection of the step's final transaction, after its
    #: final status is written and before it commits (the cluster records the partition's
    #: outcome there, atomically with the step's). Raising rolls the final write back.
    on_final_commit: Callable[[Connection], None] | None = None
    failure_exceptions: list[BaseException] = field(default_factory=list)

    @property
    def job_execution_id(self) -> int:
        return self.job_execution.id

    @property
    def skip_count(self) -> int:
        return self.read_skip_count + self.process_skip_count + self.write_skip_count

    def counters(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTER_NAMES}

    def snapshot(self) -> dict[str, Any]:
        """What a rolled-back transaction must restore: counters, version, context."""
        state: dict[str, Any] = self.counters()
        state["version"] = self.version
        state["execution_context"] = self.execution_context.copy()
        return state

    def restore(self, state: dict[str, Any]) -> None:
        for name in (*COUNTER_NAMES, "version"):
            setattr(self, name, state[name])
        self.execution_context.reset_to(state["execution_context"])

    def __repr__(self) -> str:
        return (
            f"StepExecution(id={self.id}, step={self.step_name!r}, status={self.status.value}, "
            f"read={self.read_count}, write={self.write_count}, commit={self.commit_count})"
        )
