"""Tasklet steps: one callable, called until it says it is finished, one transaction per call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import Connection

from dbcluster.batch.domain import StepExecution
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.step import Step, commit_step

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime


class RepeatStatus(Enum):
    CONTINUABLE = "CONTINUABLE"
    FINISHED = "FINISHED"


TaskletResult = RepeatStatus | bool | None
Tasklet = Callable[[ChunkContext], TaskletResult]


def is_finished(result: TaskletResult) -> bool:
    """None, True and FINISHED finish; False and CONTINUABLE ask to be called again."""
    if result is None:
        return True
    if isinstance(result, RepeatStatus):
        return result is RepeatStatus.FINISHED
    return bool(result)


class TaskletStep(Step):
    """Calls ``tasklet(chunk_context)`` until it is finished; each call is one transaction in which
    the step's counters and context are committed (write through ``chunk_context.connection``).

    ``transactional=True`` declares that a call's every effect is in that transaction (it writes
    through ``chunk_context.connection`` only, and nothing outside the database): a call that
    rolls back left nothing behind. A cluster node may then run several partitions of this step
    in one transaction (grouped commits, docs/cluster.md): a group that fails rolls back and
    each of its partitions runs again alone, so its tasklet may be called twice for one
    partition, the first call's effects undone."""

    def __init__(
        self, name: str, tasklet: Tasklet, *, transactional: bool = False, **options: Any
    ) -> None:
        super().__init__(name, **options)
        self.tasklet = tasklet
        self.transactional = transactional

    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        se = step_execution

        def call(conn: Connection) -> TaskletResult:
            result = self.tasklet(ChunkContext(conn, se, runtime))
            se.commit_count += 1
            return result

        # Without after_step listeners nothing can change the outcome once the tasklet says it
        # is finished, so its last call also records the step's end (one transaction less).
        ends = None if self.listeners else is_finished
        while not se.should_stop:
            try:
                result = commit_step(se, runtime, call, ends=ends)
            except Exception:
                se.rollback_count += 1
                raise
            if is_finished(result):
                return


@overload
def tasklet(fn: Tasklet, /) -> TaskletStep: ...


@overload
def tasklet(
    *, name: str | None = None, listeners: Sequence[Any] = (), **options: Any
) -> Callable[[Tasklet], TaskletStep]: ...


def tasklet(fn: Tasklet | None = None, /, *, name: str | None = None, **options: Any) -> Any:
    """Make a :class:`TaskletStep` of a function (the step is named after it unless ``name``)::

    @tasklet
    def cleanup(ctx: ChunkContext) -> None:
        ctx.connection.execute(delete(staging))
    """

    def wrap(function: Tasklet) -> TaskletStep:
        return TaskletStep(name or function.__name__, function, **options)

    return wrap(fn) if fn is not None else wrap
