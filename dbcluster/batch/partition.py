"""Partitioned steps: a partitioner names the slices, a handler runs them, the results aggregate."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

from sqlalchemy import Connection

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import COUNTER_NAMES, PartitionsEnded, StepExecution
from dbcluster.batch.exceptions import BatchError, PartitionFailedError, StepConfigurationError
from dbcluster.batch.runtime import BatchRuntime, PartitionHandler
from dbcluster.batch.status import EXIT_NODE_LOST, BatchStatus, ExitStatus
from dbcluster.batch.step import Step

if TYPE_CHECKING:
    from dbcluster.batch.repository import InsertExtras

log = logging.getLogger(__name__)

#: Master step context key holding the partition names, in order (so a restart never re-partitions).
PARTITION_NAMES_KEY = "dbcluster.partition.names"


@runtime_checkable
class Partitioner(Protocol):
    """Splits a step's input into named slices.

    ``partition(grid_size)`` returns ``{name: context}``; names must derive from the slice (e.g.
    ``"id-1-125000"``), never from a thread index, because a restart finds partitions by name.
    ``grid_size`` is how many workers are available (a hint). ``is_transferable(name, context)``
    says whether the slice may safely run again on another node.
    """

    def partition(self, grid_size: int) -> Mapping[str, ExecutionContext | Mapping[str, Any]]: ...

    def is_transferable(self, name: str, context: ExecutionContext) -> bool: ...


class BasePartitioner:
    """Convenience base: every partition is transferable unless overridden."""

    def partition(self, grid_size: int) -> Mapping[str, ExecutionContext | Mapping[str, Any]]:
        raise NotImplementedError

    def is_transferable(self, name: str, context: ExecutionContext) -> bool:
        return True


class FunctionPartitioner(BasePartitioner):
    """A partitioner made of a function ``fn(grid_size) -> {name: context}``."""

    def __init__(
        self,
        fn: Callable[[int], Mapping[str, ExecutionContext | Mapping[str, Any]]],
        transferable: bool | Callable[[str, ExecutionContext], bool] = True,
    ) -> None:
        self.fn = fn
        self.transferable = transferable

    def partition(self, grid_size: int) -> Mapping[str, ExecutionContext | Mapping[str, Any]]:
        return self.fn(grid_size)

    def is_transferable(self, name: str, context: ExecutionContext) -> bool:
        if callable(self.transferable):
            return bool(self.transferable(name, context))
        return self.transferable


PartitionFn = Callable[[int], Mapping[str, ExecutionContext | Mapping[str, Any]]]


@overload
def partitioner(fn: PartitionFn, /) -> FunctionPartitioner: ...


@overload
def partitioner(
    *, transferable: bool | Callable[[str, ExecutionContext], bool] = True
) -> Callable[[PartitionFn], FunctionPartitioner]: ...


def partitioner(
    fn: PartitionFn | None = None,
    /,
    *,
    transferable: bool | Callable[[str, ExecutionContext], bool] = True,
) -> Any:
    """Decorator: a function ``fn(grid_size) -> {name: context}`` becomes a partitioner."""

    def wrap(function: PartitionFn) -> FunctionPartitioner:
        return FunctionPartitioner(function, transferable)

    return wrap(fn) if fn is not None else wrap


@dataclass
class PartitionWork:
    """One partition to run: its name, its (created) step execution, and whether it may move."""

    name: str
    step_execution: StepExecution
    transferable: bool


def _ms(value: float | timedelta) -> int:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return round(seconds * 1000)


def _as_context(value: ExecutionContext | Mapping[str, Any]) -> ExecutionContext:
    return value.copy() if isinstance(value, ExecutionContext) else ExecutionContext(value)


class PartitionStep(Step):
    """Runs ``worker_step`` once per partition, through a partition handler.

    Partition step executions are named ``<worker step name>:<partition name>``. On a restart only
    the partitions that did not complete run again, with the same names and contexts (including
    any reader position they committed); the step never re-partitions.

    On a cluster (the handler honours these; the in-process one ignores them):

    - ``max_attempts`` (default 3): a transferable partition whose try fails with an exception of
      ``retry_on`` types, or with a transient database error, is tried again, on any live node,
      resuming after its last commit, up to this many tries in all; the backoff before the next
      try is ``retry_backoff`` (seconds, or a timedelta) doubled after each failed try. A
      non-transferable partition is never tried again.
    - ``timeout`` (seconds, or a timedelta; None: none): a partition whose progress (its claim,
      or its last committed chunk) is older than this is fenced (its node commits nothing more
      for it), then tried again if transferable and tries remain, or failed.
    """

    def __init__(
        self,
        name: str,
        worker_step: Step,
        partitioner: Partitioner,
        *,
        grid_size: int | None = None,
        partition_handler: PartitionHandler | None = None,
        max_attempts: int = 3,
        retry_on: Sequence[type[BaseException]] = (),
        retry_backoff: float | timedelta = 1.0,
        timeout: float | timedelta | None = None,
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        if max_attempts < 1:
            raise StepConfigurationError(f"max_attempts must be at least 1, not {max_attempts}")
        self.worker_step = worker_step
        self.partitioner = partitioner
        self.grid_size = grid_size
        self.partition_handler = partition_handler
        self.max_attempts = max_attempts
        self.retry_on = tuple(retry_on)
        self.retry_backoff_ms = _ms(retry_backoff)
        self.timeout_ms = None if timeout is None else _ms(timeout)
        if self.timeout_ms is not None and self.timeout_ms < 1:
            raise StepConfigurationError(f"timeout must be positive, not {timeout!r}")

    def retry_backoff_for(self, attempt: int) -> int:
        """Milliseconds to wait before try ``attempt`` (2, 3, ...)."""
        return self.retry_backoff_ms * 2 ** max(0, attempt - 2)

    def retryable(self, error: BaseException) -> bool:
        """Whether a partition that failed with ``error`` is tried again (a transient database
        error is, too: the cluster asks its provider)."""
        return isinstance(error, self.retry_on) if self.retry_on else False

    def steps(self) -> list[Step]:
        return [self, *self.worker_step.steps()]

    def execution_name(self, partition_name: str) -> str:
        return f"{self.worker_step.name}:{partition_name}"

    def plan(
        self, master: StepExecution, worker_count: int
    ) -> Mapping[str, ExecutionContext | Mapping[str, Any]] | None:
        """The partitioner's slices for a first run, or None on a restart (which re-runs the
        earlier partitions and never re-partitions). Holds no transaction."""
        if master.execution_context.get(PARTITION_NAMES_KEY) is not None:
            return None
        return self.partitioner.partition(self.grid_size or max(1, worker_count))

    def split(
        self,
        master: StepExecution,
        worker_count: int,
        runtime: BatchRuntime,
        conn: Connection | None = None,
        planned: Mapping[str, ExecutionContext | Mapping[str, Any]] | None = None,
        riders_for: Callable[[list[tuple[str, ExecutionContext, bool]]], InsertExtras | None]
        | None = None,
    ) -> list[PartitionWork]:
        """Create the partition step executions (on a restart: only the not-COMPLETED ones, with
        their previous names and contexts) and return them.

        With ``conn``, every repository statement runs in that transaction and nothing is
        committed here. The partitioner is not given ``conn``: on SQLite, where a transaction holds
        the write lock, a partitioner that reads the database through its own connection waits
        for ``conn``'s transaction, so call :meth:`plan` first and pass its result as ``planned``.
        ``riders_for(partitions)``: what the statement that creates the step executions also
        writes and reads (see :class:`~dbcluster.batch.dao.combined.InsertExtras`), given each
        partition's name, context and transferability; or None.
        """
        repository = runtime.repository
        job_execution = master.job_execution
        names = master.execution_context.get(PARTITION_NAMES_KEY)
        pending: list[tuple[str, ExecutionContext]] = []
        if names is None:
            if planned is None:
                planned = self.plan(master, worker_count)
            for name, context in (planned or {}).items():
                if not isinstance(name, str) or not name:
                    raise BatchError(f"partitioner {self.partitioner!r} gave a bad name {name!r}")
                pending.append((name, _as_context(context)))
            if len(pending) != len({name for name, _ in pending}):
                raise BatchError(f"partitioner {self.partitioner!r} gave duplicate names")
            master.execution_context.put(PARTITION_NAMES_KEY, [name for name, _ in pending])
        else:
            previous = repository.get_last_step_executions(
                job_execution.job_instance,
                [self.execution_name(n) for n in names],
                conn,
                before_job_execution_id=job_execution.id,
            )
            for name in names:
                last = previous.get(self.execution_name(name))
                if last is None:
                    raise BatchError(
                        f"cannot restart partition {name!r} of step {self.name!r}: "
                        f"no earlier execution of {self.execution_name(name)!r} was found"
                    )
                if last.status is BatchStatus.COMPLETED:
                    continue
                pending.append((name, last.execution_context.copy()))
            log.info(
                "restarting %d of %d partitions of step %s", len(pending), len(names), self.name
            )
        transferable = [
            bool(
                self.partitioner.is_transferable(name, ctx)
                if hasattr(self.partitioner, "is_transferable")
                else True
            )
            for name, ctx in pending
        ]
        riders = None
        if riders_for is not None:
            riders = riders_for(
                [(name, ctx, t) for (name, ctx), t in zip(pending, transferable, strict=True)]
            )
        # The master's context (naming its partitions, on a first run) in the statement that
        # creates them where the database can.
        created = repository.create_step_executions(
            job_execution,
            [(self.execution_name(n), ctx) for n, ctx in pending],
            conn,
            context_of=master if master.execution_context.dirty else None,
            riders=riders,
        )
        return [
            PartitionWork(name=name, step_execution=se, transferable=t)
            for (name, _), se, t in zip(pending, created, transferable, strict=True)
        ]

    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        master = step_execution
        handler = self.partition_handler or runtime.partition_handler
        returned = handler.handle(self, master, runtime)
        if not getattr(handler, "returns_stored", False) and not isinstance(
            returned, PartitionsEnded
        ):
            returned = runtime.repository.get_step_executions_by_ids(
                master.job_execution, [se.id for se in returned]
            )
        self.aggregate(master, returned)

    def aggregate(
        self, master: StepExecution, partitions: list[StepExecution] | PartitionsEnded
    ) -> None:
        """Sum the counters into the master and take the worst status (a partition still running
        after its handler returned counts as FAILED)."""
        ended = (
            partitions
            if isinstance(partitions, PartitionsEnded)
            else PartitionsEnded.of(partitions)
        )
        for counter in COUNTER_NAMES:
            setattr(master, counter, ended.counters.get(counter, 0))
        status = BatchStatus.COMPLETED
        exit_status = ExitStatus.COMPLETED
        failed = []
        for name, p_status, exit_code in ended.unfinished:
            if p_status.is_running:
                p_status = BatchStatus.FAILED
            status = BatchStatus.max(status, p_status)
            failed.append(name)
            exit_status = exit_status.and_(ExitStatus(exit_code))
        if status.is_unsuccessful:
            lost = all(exit_code == EXIT_NODE_LOST for _, _, exit_code in ended.unfinished)
            raise PartitionFailedError(
                f"{len(failed)} of {ended.count} partitions of step {self.name!r} did not "
                f"complete: {', '.join(failed[:20])}{' ...' if len(failed) > 20 else ''}",
                EXIT_NODE_LOST if lost else "FAILED",
            )
        if status is not BatchStatus.COMPLETED:
            master.status = status
            master.exit_status = exit_status
