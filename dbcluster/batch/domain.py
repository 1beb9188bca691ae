"""The recorded entities: job instances, job executions and step executions."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.status import EXIT_EXECUTING, EXIT_UNKNOWN, BatchStatus, ExitStatus

if TYPE_CHECKING:
    from dbcluster.batch.fence import Fence

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


@dataclass(frozen=True)
class PartitionsEnded:
    """What a partitioned step aggregates of its partitions once they have all ended: how many,
    each counter's sum, and the name, status and exit code of each one that did not complete
    (in step execution order). A partition handler may return this instead of the partitions'
    step executions: the cluster's reads it with one statement per IN list, not every
    partition's row and context."""

    count: int
    counters: dict[str, int]
    unfinished: tuple[tuple[str, BatchStatus, str], ...] = ()

    @classmethod
    def of(cls, partitions: list[StepExecution]) -> PartitionsEnded:
        return cls(
            len(partitions),
            {name: sum(getattr(p, name) for p in partitions) for name in COUNTER_NAMES},
            tuple(
                (p.step_name, p.status, p.exit_status.code)
                for p in partitions
                if p.status is not BatchStatus.COMPLETED
            ),
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
    #: In memory only: the ownership every job-level write must hold at commit time (a cluster
    #: master's coordination row); the steps the job runs itself inherit it. None: no fence.
    fence: Fence | None = None
    #: In memory only: the execution was created STARTED (its start is in the database).
    start_recorded: bool = False
    #: In memory only: the instance's other executions, newest first, as read when this one was
    #: created (None: not known; the job reads them).
    earlier: list[JobExecution] | None = None
    #: In memory only: step executions created (STARTED) with this execution, by step name, for
    #: the job to take instead of creating them (its first step, on a first launch).
    prepared_steps: dict[str, StepExecution] = field(default_factory=dict)
    #: In memory only: a stop was requested (the execution is STOPPING in the database, or its
    #: launcher asked): every step of it ends STOPPED at its next boundary and no further step
    #: does any work. Set by whoever learns of the request (a cluster node's periodic check).
    stop_requested: bool = False

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


#: Besides the counters, what :meth:`StepExecution.restore` puts back.
_RESTORED = ("version", "status", "exit_status", "end_time")


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
    #: In memory only: the ownership every transaction of this step holds at commit time (a
    #: partition's row on the worker running it; the job's mastership for a step the master
    #: runs). Its ``finish`` records the step's end with it (a partition's outcome).
    fence: Fence | None = None
    failure_exceptions: list[BaseException] = field(default_factory=list)
    #: In memory only: the step's start (STARTED, its start time) is already in the database,
    #: written by whoever handed the execution over (a worker's claim transaction).
    start_recorded: bool = False
    #: In memory only: the step's end is already in the database (its last transaction of work
    #: also recorded its end: see :func:`~dbcluster.batch.step.commit_step`).
    end_recorded: bool = False
    #: In memory only: created moments ago by this process for this run (nothing can have
    #: been written under it by anyone else, e.g. no partitions placed).
    fresh: bool = False
    #: In memory only: what its creating transaction already did for it (a cluster launch that
    #: placed a partitioned step's partitions with the job's creation; or the partitioner's
    #: error there), for the step's handler to take up instead of doing it again.
    prepared: Any = None

    @property
    def job_execution_id(self) -> int:
        return self.job_execution.id

    @property
    def should_stop(self) -> bool:
        """Whether the step ends STOPPED at its next chunk / tasklet boundary: it was told to
        (``terminate_only``), or its job execution is being stopped."""
        return self.terminate_only or self.job_execution.stop_requested

    @property
    def skip_count(self) -> int:
        return self.read_skip_count + self.process_skip_count + self.write_skip_count

    def counters(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTER_NAMES}

    def snapshot(self) -> dict[str, Any]:
        """What a rolled-back transaction must restore: counters, version, status, exit status,
        end time, context."""
        state: dict[str, Any] = self.counters()
        for name in _RESTORED:
            state[name] = getattr(self, name)
        state["execution_context"] = self.execution_context.state()
        return state

    def restore(self, state: dict[str, Any]) -> None:
        for name in (*COUNTER_NAMES, *_RESTORED):
            setattr(self, name, state[name])
        self.execution_context.restore_state(state["execution_context"])

    def __repr__(self) -> str:
        return (
            f"StepExecution(id={self.id}, step={self.step_name!r}, status={self.status.value}, "
            f"read={self.read_count}, write={self.write_count}, commit={self.commit_count})"
        )
