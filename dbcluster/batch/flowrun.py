"""Running a flow: one job execution's walk through its :class:`~dbcluster.batch.flow.Flow`.

:class:`FlowRun` replays the path a job execution persisted (see :mod:`dbcluster.batch.flow`),
starts and runs each step the job runs itself (:func:`start_step`: its execution created under
the job's fence, the path written in the same transaction), runs deciders and splits, and records
the path it takes.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from dbcluster import points
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, StepExecution
from dbcluster.batch.exceptions import StartLimitExceededError
from dbcluster.batch.fence import hold
from dbcluster.batch.flow import NATURAL_END, PATH_KEY, Decider, Element, End, Flow, Split
from dbcluster.batch.runtime import BatchRuntime
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step

log = logging.getLogger(__name__)


@dataclass
class FlowResult:
    """How a flow (or one state of it) ended."""

    status: BatchStatus
    exit_status: ExitStatus


class FlowRun:
    """One job execution's walk through its flow: replays the persisted path, runs the rest,
    records the path (see the module docstring). Splits run their branches on threads; every
    step they run writes under the job's fence, as any step the job runs itself."""

    def __init__(
        self,
        job_execution: JobExecution,
        runtime: BatchRuntime,
        *,
        restarting: bool,
        resume: bool,
        previous: JobExecution | None,
        own: Sequence[StepExecution],
    ) -> None:
        self.je = job_execution
        self.runtime = runtime
        self.restarting = restarting
        self.resume = resume
        self.lock = threading.Lock()
        self._first_step = True
        # The path this execution has taken so far, per flow, and what it may replay.
        self.path: dict[str, dict[str, Any]] = {}
        self.replay: dict[str, list[list[Any]]] = {}
        if resume:
            self.replay = _settled(job_execution.execution_context.get(PATH_KEY), ended=False)
        elif restarting and previous is not None:
            self.replay = _settled(previous.execution_context.get(PATH_KEY), ended=True)
        referenced = {
            entry[3]
            for entries in self.replay.values()
            for entry in entries
            if entry[3] is not None
        }
        # Step executions of this execution (a resumed one) not yet on its path: a step left
        # running, or one that ended just before its master was lost.
        self.unrecorded: dict[str, list[StepExecution]] = {}
        for se in own:
            if se.id not in referenced:
                self.unrecorded.setdefault(se.step_name, []).append(se)

    # --- the path ----------------------------------------------------------------------------

    def _record(self, flow: Flow, state: Element, result: FlowResult, se_id: int | None) -> None:
        with self.lock:
            entry = [state.name, result.exit_status.code, result.status.value, se_id]
            self.path.setdefault(flow.name, {"states": []})["states"].append(entry)

    def _record_end(
        self, flow: Flow, state: Element | None, result: FlowResult, end: End | None
    ) -> None:
        with self.lock:
            found = self.path.setdefault(flow.name, {"states": []})
            found["end"] = {
                "at": None if state is None else state.name,
                "status": result.status.value,
                "restart": None if end is None or end.restart is None else end.restart.name,
            }

    def snapshot(self) -> dict[str, Any]:
        """The path to persist: what this run took, and what it has yet to replay (a branch
        not entered yet keeps the path it had). Called under :attr:`lock`."""
        merged = {name: {"states": list(entries)} for name, entries in self.replay.items()}
        for name, taken in self.path.items():
            merged[name] = {**taken, "states": list(taken["states"])}
        return merged

    def save_path(self) -> None:
        """Put the path into the job execution's context (its next write persists it). Called
        under :attr:`lock`."""
        self.je.execution_context.put(PATH_KEY, self.snapshot())

    # --- running -----------------------------------------------------------------------------

    def run(self, flow: Flow) -> FlowResult:
        entries = deque(self.replay.get(flow.name, ()))
        state: Element | End = flow.start_state
        last: StepExecution | int | None = None
        while True:
            assert not isinstance(state, End)
            if isinstance(state, Step):
                self._arrive(state)
            replayed: list[Any] | None = None
            if entries and entries[0][0] == state.name:
                replayed = entries.popleft()
                if self.restarting and not self.resume and _reruns(state):
                    replayed = None  # allow_start_if_complete: it runs again on a restart
            elif entries:
                log.info("flow %s left its recorded path at %s", flow.name, state.name)
                entries.clear()
            if replayed is not None:
                result = FlowResult(BatchStatus(replayed[2]), ExitStatus(replayed[1]))
                se_id = replayed[3]
                if se_id is not None:
                    last = se_id
            else:
                result, se = self._run_state(flow, state, last)
                se_id = se.id if se is not None else None
                if se is not None:
                    last = se
            target = flow.transition(state, result.exit_status.code, result.status)
            if isinstance(target, End) and target.restart is not None and replayed is not None:
                # The previous execution stopped here; its restart begins at the given state.
                self._record(flow, state, result, se_id)
                state = target.restart
                continue
            if target is None or isinstance(target, End):
                self._record(flow, state, result, se_id)
                ended = self._ending(state, result, target)
                self._record_end(flow, state, ended, target)
                return ended
            self._record(flow, state, result, se_id)
            state = target

    @staticmethod
    def _ending(state: Element, result: FlowResult, end: End | None) -> FlowResult:
        if end is NATURAL_END:
            return FlowResult(BatchStatus.COMPLETED, ExitStatus.COMPLETED)
        if end is not None:
            return FlowResult(end.status, ExitStatus(end.exit_code, result.exit_status.description))
        if isinstance(state, Decider):
            return FlowResult(
                BatchStatus.FAILED,
                ExitStatus(
                    "FAILED",
                    f"decider {state.name!r} returned {result.exit_status.code!r}, which no "
                    f"transition matches",
                ),
            )
        if isinstance(state, Step):
            reason = result.exit_status.description.strip().splitlines()
            return FlowResult(
                BatchStatus.max(BatchStatus.STOPPED, result.status),
                ExitStatus(
                    result.exit_status.code,
                    f"step {state.name!r} ended {result.status.value}"
                    + (f": {reason[-1]}" if reason else ""),
                ),
            )
        return FlowResult(BatchStatus.max(BatchStatus.STOPPED, result.status), result.exit_status)

    def _run_state(
        self, flow: Flow, state: Element, last: StepExecution | int | None
    ) -> tuple[FlowResult, StepExecution | None]:
        if isinstance(state, Step):
            se = self._run_step(state)
            return FlowResult(se.status, se.exit_status), se
        if isinstance(state, Decider):
            if isinstance(last, int):  # a step replayed from the path: read it back
                last = self.runtime.repository.get_step_execution(last)
            code = state.decide(self.je, last)
            log.info("decider %s chose %s", state.name, code)
            status = {
                "COMPLETED": BatchStatus.COMPLETED,
                "FAILED": BatchStatus.FAILED,
                "STOPPED": BatchStatus.STOPPED,
            }.get(code, BatchStatus.UNKNOWN)
            return FlowResult(status, ExitStatus(code)), None
        if isinstance(state, Split):
            return self._run_split(state), None
        return self.run(state), None

    def _run_split(self, split: Split) -> FlowResult:
        workers = min(split.max_workers or len(split.branches), len(split.branches))
        with ThreadPoolExecutor(workers, thread_name_prefix=f"dbcluster-{split.name}") as pool:
            futures = [pool.submit(self.run, branch) for branch in split.branches]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]
        results = [f.result() for f in futures]
        status = BatchStatus.COMPLETED
        exit_status = results[0].exit_status
        for result in results:
            status = BatchStatus.max(status, result.status)
        for result in results[1:]:
            exit_status = exit_status.and_(result.exit_status)
        return FlowResult(status, exit_status)

    def _arrive(self, step: Step) -> None:
        """Between two steps of the job (replayed ones too, as a plain job always did), the
        fault point tests and the chaos harness park a master at."""
        with self.lock:
            first, self._first_step = self._first_step, False
        if not first:
            points.reach("master.between_steps", job_execution=self.je, next_step=step.name)

    def _run_step(self, step: Step) -> StepExecution:
        je, runtime = self.je, self.runtime
        with self.lock:
            waiting = self.unrecorded.get(step.name)
            se = waiting.pop(0) if waiting else None
        if se is not None:
            if se.status.is_running:
                # Left running by the master before: it goes on after its last commit.
                se.fence = je.fence
                log.info("step %s (execution %s) resumed", step.name, se.id)
                step.execute(se, runtime)
            # else: it ended just before the master was lost; its outcome stands.
        else:
            with self.lock:
                self.save_path()
                started, earlier = start_step(step, je, runtime, self.restarting, save_context=True)
            if started is None:
                assert earlier is not None
                return earlier
            se = started
            step.execute(se, runtime)
        with self.lock:
            je.step_executions.append(se)
        return se


def start_step(
    step: Step,
    job_execution: JobExecution,
    runtime: BatchRuntime,
    restarting: bool,
    *,
    save_context: bool = False,
) -> tuple[StepExecution | None, StepExecution | None]:
    """Create the execution of a step the job runs itself (its context resumed from an earlier
    one that did not complete), holding the job's fence; with ``save_context``, the job
    execution's context (the flow's path) is written in the same transaction. Returns (the new
    execution, None), or (None, the earlier execution) for a step that completed before and is
    skipped."""
    je = job_execution
    repository = runtime.repository
    prepared = je.prepared_steps.pop(step.name, None)
    if prepared is not None and not restarting:
        # Created with the execution, in the launch's transaction (see Job.first_step).
        prepared.fence = je.fence
        return prepared, None
    context = ExecutionContext()
    if restarting:
        last = repository.get_last_step_execution(je.job_instance, step.name)
        if last is not None:
            if last.status is BatchStatus.COMPLETED and not step.allow_start_if_complete:
                log.info("step %s already completed; skipped on restart", step.name)
                return None, last
            if last.status is not BatchStatus.COMPLETED:
                context = last.execution_context.copy()
    if step.start_limit is not None:
        count = repository.count_step_executions(je.job_instance, step.name)
        if count >= step.start_limit:
            raise StartLimitExceededError(
                f"step {step.name!r} has been started {count} times in this job instance; "
                f"its start_limit is {step.start_limit}"
            )
    created: list[StepExecution] = []

    def create(conn: Connection) -> StepExecution:
        hold(je.fence, conn)
        # Created STARTED: the step writes no start of its own.
        created[:] = [repository.create_step_execution(je, step.name, context, conn, started=True)]
        if save_context:
            repository.update_job_execution_context(je, conn)
        return created[0]

    se = repository.transactions.run(
        create,
        verify=lambda conn: repository.step_execution_exists(created[0].id, conn),
        what=f"start of step {step.name!r} (job execution {je.id})",
    )
    # The steps a job runs itself write under the job's fence (a partition's workers get
    # their own from the node that runs them).
    se.fence = je.fence
    return se, None


def _reruns(state: Element) -> bool:
    return isinstance(state, Step) and state.allow_start_if_complete


def _settled(path: Any, *, ended: bool) -> dict[str, list[list[Any]]]:
    """The entries of a persisted path that a run may replay. Of a path that ended (a restart
    reads its previous execution's), the state a flow ended on is run again, unless the flow
    completed or stopped to restart elsewhere."""
    if not isinstance(path, dict):
        return {}
    found: dict[str, list[list[Any]]] = {}
    for name, taken in path.items():
        states = [list(e) for e in taken.get("states", []) if isinstance(e, list) and len(e) == 4]
        end = taken.get("end")
        if ended and isinstance(end, dict) and states and end.get("at") == states[-1][0]:
            if end.get("status") != BatchStatus.COMPLETED.value and not end.get("restart"):
                states.pop()
        found[name] = states
    return found
