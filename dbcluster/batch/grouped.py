"""Grouped commits: several executions of one transactional tasklet step in one transaction.

A tasklet step declared ``transactional=True`` has every effect of a call in that call's
transaction. Where such a step's runs end in one call each (small partitions), a cluster node
may run several of them in one transaction: one ``BEGIN``, each one's call, one guarded final
write for all of them (the owner rows, which must all still be held, then every step's row,
which must all be written), one ``COMMIT``. Anything that keeps one of them from ending there
(its call failed or asked to be called again, its job is stopping, an owner row moved) rolls the
whole group back: nothing of it commits, and each execution is restored to the state it had and
runs alone, as it would have without the group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from dbcluster import points
from dbcluster.batch.domain import StepExecution
from dbcluster.batch.observe import observers
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus
from dbcluster.batch.step import close_step, conclude_step
from dbcluster.batch.tasklet import TaskletStep, is_finished

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

#: The guard of a group's final write: in the group's transaction, take every execution's owner
#: row (a cluster node's partitions) and record their end, or raise
#: :class:`~dbcluster.batch.fence.FencedError` unless it took every one of them.
GroupGuard = Callable[[Connection, Sequence[StepExecution]], None]


class Ungrouped(Exception):
    """An execution of the group cannot end in the group's transaction (its call asked to be
    called again, or its job is stopping): the group rolls back and each runs alone."""


def groupable(step: Any) -> bool:
    """Whether executions of ``step`` may share a transaction: a tasklet step declared
    ``transactional`` with no listeners (a listener could change an outcome, or act outside
    the transaction)."""
    return isinstance(step, TaskletStep) and step.transactional and not step.listeners


def commit_group(
    step: TaskletStep,
    executions: Sequence[StepExecution],
    runtime: BatchRuntime,
    guard: GroupGuard,
    entering: Callable[[StepExecution], None] | None = None,
) -> None:
    """Run one call of ``step``'s tasklet for each execution (all STARTED, their start
    recorded), then ``guard``, then every execution's final write, in one transaction; commit.

    ``entering(se)`` is called before each execution's call (a cluster node sets the current
    partition's attempt there). Transient errors repeat the whole transaction from the state
    it started in; an unclear commit is judged from the step executions' versions. On any
    failure (:class:`Ungrouped`, the guard's refusal, the tasklet's own error) every execution
    is restored to the state it had and the error is raised: nothing of the group committed.
    """
    repository = runtime.repository
    befores = [se.snapshot() for se in executions]
    tries = 0

    def restore() -> None:
        for se, before in zip(executions, befores, strict=True):
            se.restore(before)

    def body(conn: Connection) -> None:
        nonlocal tries
        if tries:
            restore()
        tries += 1
        for se in executions:
            if se.should_stop:
                raise Ungrouped(f"step execution {se.id}: its job is stopping")
            if entering is not None:
                entering(se)
            result = step.tasklet(ChunkContext(conn, se, runtime))
            se.commit_count += 1
            if not is_finished(result):
                raise Ungrouped(f"step execution {se.id} asked to be called again")
            conclude_step(se)
            if se.status is not BatchStatus.COMPLETED:  # its job is stopping: it ends alone
                raise Ungrouped(f"step execution {se.id} ended {se.status.value}")
            close_step(se)
        points.reach("group.before_final_write", conn=conn, step_executions=executions)
        guard(conn, executions)
        repository.update_step_executions(executions, conn)
        # Each execution's points as its own one-call transaction reaches them (observers of
        # what a transaction holds at commit time see every member).
        for se in executions:
            details = {"conn": conn, "step_execution": se, "group": executions}
            points.reach("chunk.before_commit", **details)
            points.reach("step.before_final_commit", **details)
            points.reach("transaction.before_commit", **details)

    try:
        repository.transactions.run(
            body,
            verify=repository.step_versions_are(
                executions, [before["version"] + 1 for before in befores]
            ),
            what=f"group of {len(executions)} executions of step {step.name!r}",
            group=executions,
            final=True,
        )
    except BaseException:
        restore()
        raise
    for se in executions:
        se.end_recorded = True
        observers.step_started(se)
        observers.chunk_committed(se)
        observers.step_ended(se, None)
