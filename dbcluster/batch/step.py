"""The step base class: lifecycle, listeners and the final persistence of every step kind."""

from __future__ import annotations

import logging
import re
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection

from dbcluster.batch.domain import StepExecution, utcnow
from dbcluster.batch.fence import FencedError, FoldedGuard, met_outage
from dbcluster.batch.listeners import call_listeners
from dbcluster.batch.observe import observers
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.retry import brief

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)
T = TypeVar("T")


def describe_failure(error: BaseException) -> str:
    """The exit description of a failure: the exception and its traceback (clipped on storage)."""
    return "".join(traceback.format_exception(error)).strip()


#: The line a traceback ends its exception with: its (dotted) type, then ': ' and its message
#: or nothing.
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(: |$)")


def failure_line(description: str | None) -> str | None:
    """The line of an exit description that says why (None for none): a recorded traceback's
    (:func:`describe_failure`) last exception line, not what a driver's wrapper prints after
    it (SQLAlchemy's '[SQL: ...]', '(Background on this error at: ...)'); else its first."""
    text = (description or "").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if not lines[0].startswith("Traceback"):
        return lines[0]
    raised = [line for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
    return raised[-1].strip() if raised else lines[-1]


def persist_step(step_execution: StepExecution, runtime: BatchRuntime, conn: Connection) -> None:
    """Write the step's context (if changed) and row in ``conn``'s transaction."""
    runtime.repository.update_step_execution(
        step_execution, conn, context=step_execution.execution_context.dirty
    )


def fold_finish(step_execution: StepExecution, runtime: BatchRuntime) -> FoldedGuard | None:
    """The step's fence's final guard, for the step's final write to run in its own statement,
    where both the fence (``finish_guard``) and the repository (``folds_guards``) can."""
    offer = getattr(step_execution.fence, "finish_guard", None)
    if offer is None or not runtime.repository.folds_guards:
        return None
    folded: FoldedGuard | None = offer(step_execution)
    return folded


def conclude_step(step_execution: StepExecution) -> None:
    """The outcome of a step whose work returned: COMPLETED, or STOPPED when asked to stop."""
    se = step_execution
    if se.status.is_running:
        se.status = BatchStatus.STOPPED if se.should_stop else BatchStatus.COMPLETED
    if se.exit_status.code == "EXECUTING":
        se.exit_status = ExitStatus.from_batch_status(se.status)


def close_step(step_execution: StepExecution) -> None:
    """Ready a step's final write: its end time, and its context if the database does not hold
    it as it is (a value mutated in place leaves no dirty flag behind)."""
    se = step_execution
    se.end_time = utcnow()
    if se.execution_context.changed():
        se.execution_context.dirty = True


_CHUNK_POINTS = ("chunk.before_commit",)
_FINAL_POINTS = ("step.before_final_commit",)
_LAST_CHUNK_POINTS = ("chunk.before_commit", "step.before_final_commit")


def commit_step(
    step_execution: StepExecution,
    runtime: BatchRuntime,
    work: Callable[[Connection], T] | None = None,
    *,
    final: bool = False,
    ends: Callable[[T], bool] | None = None,
) -> T | None:
    """One transaction of a step: ``work(conn)`` (the step's own writes: a chunk, a tasklet
    call), then the step's fence, then its counters and context; committed together.

    The fence comes after the work and before the bookkeeping: it holds the owner row (a
    partition's, or the job's coordination row) from there to ``COMMIT`` and keeps the lock
    order every dbcluster transaction follows (owner row, then step execution rows). A final
    transaction records the step's end with its fence (``finish``) instead of only holding it.

    ``ends(result)`` is asked after ``work``: when it answers True, this transaction is also
    the step's last (its outcome concluded, its end recorded with its fence) and
    ``end_recorded`` is set once it commits: one transaction where there would be two. Only a
    step without ``after_step`` listeners may end so (they could change the outcome).

    Transient errors repeat the whole transaction from the state it started in; an unclear
    commit is judged from the step execution's version. On any other failure the in-memory
    state is restored and the error raised.
    """
    se = step_execution
    repository = runtime.repository
    before = se.snapshot()
    tries = 0
    ending = final
    #: The fence's final guard the last try's write carried (told once the commit landed).
    folded: FoldedGuard | None = None

    def body(conn: Connection) -> T | None:
        nonlocal tries, ending, folded
        if tries:
            se.restore(before)
        tries += 1
        ending = final
        folded = None
        result = work(conn) if work is not None else None
        if not final and ends is not None and ends(result):  # type: ignore[arg-type]
            conclude_step(se)
            close_step(se)
            ending = True
        if se.fence is not None:
            if ending:
                folded = fold_finish(se, runtime)
                if folded is not None:
                    # The fence's guard and the step's write in one statement (guard first;
                    # sent with the COMMIT where the driver can). The fence learns its outcome
                    # once the commit landed (below), never from a try that failed.
                    repository.update_step_execution(
                        se, conn, context=se.execution_context.dirty, guard=folded
                    )
                    return result
                se.fence.finish(conn, se)
            else:
                se.fence.hold(conn)
        persist_step(se, runtime, conn)
        return result

    def points() -> tuple[str, ...]:
        if final:
            return _FINAL_POINTS
        return _LAST_CHUNK_POINTS if ending else _CHUNK_POINTS

    try:
        result = repository.transactions.run(
            body,
            verify=_verified(repository.step_version_is(se, before["version"] + 1), se),
            point=points,
            what=f"step {se.step_name!r} (execution {se.id})",
            step_execution=se,
            final=final,
        )
    except BaseException:
        se.restore(before)
        raise
    if folded is not None:
        folded.done()
    if ending and not final:
        se.end_recorded = True
    if work is not None:
        observers.chunk_committed(se)
    return result


def _verified(
    version_is: Callable[[Connection], bool], se: StepExecution
) -> Callable[[Connection], bool]:
    """An unclear commit's check: the step row's version, and, where the step's fence can say
    (``landed``: a partition run before it was claimed), its owner row as the guard left it."""

    def verify(conn: Connection) -> bool:
        landed = getattr(se.fence, "landed", None)
        return version_is(conn) and (landed is None or bool(landed(conn)))

    return verify


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
        failure to persist the outcome, e.g. :class:`~dbcluster.batch.fence.FencedError` when the
        execution lost its fence (then nothing of it commits any more).
        """
        se = step_execution
        if not se.start_recorded:
            # A step resumed (by a master that took over its job, or a partition tried again)
            # keeps the time it first started.
            if se.start_time is None:
                se.start_time = utcnow()
            se.status = BatchStatus.STARTED
            se.exit_status = ExitStatus.EXECUTING
            commit_step(se, runtime)
        observers.step_started(se)
        log.debug("step %s (execution %s) started", se.step_name, se.id)
        try:
            call_listeners(self.listeners, "before_step", se)
            # A step that a stopping job has only just created does no work (it ends STOPPED; a
            # restart runs it). One resumed after a takeover still runs: its partitions placed
            # before must be seen to their end.
            if not (se.fresh and se.should_stop):
                self.do_execute(se, runtime)
            if se.end_recorded:
                observers.step_ended(se, None)
                log.debug("step %s (execution %s) ended %s", se.step_name, se.id, se.status.value)
                return
            conclude_step(se)
        except FencedError as lost:
            # The execution lost its fence on the way (its partition moved, its master was
            # fenced or taken over): it did not fail, and its end is not this process's to
            # record or to announce (its new owner does both). Nothing more is written for it.
            observers.step_ended(se, lost)
            raise
        except Exception as error:
            if met_outage(se.fence, error):
                # The database's passing trouble: the step's owner says so once per outage, and
                # announces the outcome (tried again, or failed) once it is recorded.
                log.info(
                    "step %s (execution %s) met a database outage: %s",
                    se.step_name,
                    se.id,
                    brief(error),
                )
            else:
                log.warning("step %s (execution %s) failed: %s", se.step_name, se.id, brief(error))
            se.failure_exceptions.append(error)
            se.status = BatchStatus.FAILED
            code = getattr(error, "exit_code", None)
            se.exit_status = ExitStatus(
                code if isinstance(code, str) else ExitStatus.FAILED.code,
                describe_failure(error),
            )
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
        close_step(se)
        try:
            commit_step(se, runtime, final=True)
        except BaseException as error:
            observers.step_ended(se, error)
            raise
        observers.step_ended(se, None)
        log.debug("step %s (execution %s) ended %s", se.step_name, se.id, se.status.value)

    @abstractmethod
    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        """The step's work. Raise to fail; set ``step_execution.status`` to end otherwise than
        COMPLETED; return at a boundary when ``step_execution.should_stop``."""

    def steps(self) -> list[Step]:
        """This step and every step nested in it (partition workers)."""
        return [self]
