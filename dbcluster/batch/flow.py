"""Flows: steps, decisions, splits and nested flows joined by transitions on exit status.

A job runs a flow. ``Job(name, [a, b, c])`` is the flow ``a -> b -> c`` (each goes on when the one
before COMPLETED); a :class:`Flow` says more, as Spring Batch's flow builder does::

    flow = (
        Flow("nightly")
        .start(load)
        .on("FAILED").to(report)          # load's transitions, tried most specific first
        .from_(load).next(check)          # load COMPLETED: go on to the decider
        .from_(check).on("WEEKEND").to(Split("both", [summarize, archive]))
        .from_(check).on("*").end()
    )
    job = Job("nightly", flow)

**The path is persisted.** Each state a flow leaves is appended to the job execution's context
(key :data:`PATH_KEY`: per flow, the states in order with their exit code, batch status and step
execution), written in the same transaction that creates the next step's execution (which holds
the job's fence) and in the job's final write. A master that takes the execution over replays
that path and goes on where it was; a restart replays the previous execution's path (decisions
and handled failures included, so it resumes on the branch it took) and re-runs only the state
the flow ended on: a failed step, a decision that led to ``fail()``, or the failed branches of a
split. A ``stop_and_restart(step)`` end resumes at ``step``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from sqlalchemy import Connection

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, StepExecution
from dbcluster.batch.exceptions import BatchError, StartLimitExceededError
from dbcluster.batch.fence import hold
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step
from dbcluster.testing import points

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)

#: Job-context key of the persisted path: ``{flow name: {"states": [[state, exit code, batch
#: status, step execution id or None], ...], "end": {...}}}``.
PATH_KEY = "dbcluster.flow.path"


class FlowConfigurationError(BatchError, ValueError):
    """A flow that cannot run: an unknown state, a duplicate name, no start."""


class Decider:
    """A state that chooses the way on: ``fn(job_execution, last_step_execution)`` returns an exit
    code (a str, or an :class:`ExitStatus`) that the decider's transitions match."""

    def __init__(
        self, name: str, fn: Callable[[JobExecution, StepExecution | None], str | ExitStatus]
    ) -> None:
        if not name:
            raise FlowConfigurationError("a decider needs a name")
        self.name = name
        self.fn = fn

    def decide(self, job_execution: JobExecution, step_execution: StepExecution | None) -> str:
        made = self.fn(job_execution, step_execution)
        code = made.code if isinstance(made, ExitStatus) else made
        if not isinstance(code, str) or not code:
            raise BatchError(f"decider {self.name!r} returned {made!r}, not an exit code")
        return code

    def __repr__(self) -> str:
        return f"Decider({self.name!r})"


def decider(
    fn: Callable[[JobExecution, StepExecution | None], str | ExitStatus] | None = None,
    /,
    *,
    name: str | None = None,
) -> Any:
    """Decorator: ``@decider`` makes a :class:`Decider` named after the function."""

    def wrap(function: Callable[[JobExecution, StepExecution | None], Any]) -> Decider:
        return Decider(name or function.__name__, function)

    return wrap(fn) if fn is not None else wrap


class Split:
    """Flows run in parallel, each on a thread of the process running the job (the job's master
    on a cluster, whose partitioned steps spread over the nodes as usual). The split ends with the
    worst status of its branches, and its exit code is theirs combined (``ExitStatus.and_``).
    A step given as a branch is the flow of that one step. ``max_workers``: at most that many
    branches at once (default: all)."""

    def __init__(
        self, name: str, branches: Sequence[Flow | Step], *, max_workers: int | None = None
    ) -> None:
        if not name:
            raise FlowConfigurationError("a split needs a name")
        if not branches:
            raise FlowConfigurationError(f"split {name!r} needs at least one branch")
        self.name = name
        self.branches = [
            b if isinstance(b, Flow) else Flow(f"{name}/{b.name}").start(b) for b in branches
        ]
        self.max_workers = max_workers

    def __repr__(self) -> str:
        return f"Split({self.name!r}, {[b.name for b in self.branches]!r})"


@dataclass(frozen=True)
class End:
    """An end state: the flow ends with ``status`` and ``exit_code``; ``restart`` (for STOPPED)
    is where a restart begins."""

    status: BatchStatus
    exit_code: str
    restart: Element | None = None

    @property
    def name(self) -> str:
        return f"<{self.status.value.lower()}>"


#: Where a flow ends when its last state COMPLETED and has no transition of its own.
_NATURAL_END = End(BatchStatus.COMPLETED, "COMPLETED")

Element = Union[Step, Decider, Split, "Flow"]  # noqa: UP007


def _pattern(pattern: str) -> re.Pattern[str]:
    """Spring's exit-code patterns: ``*`` any run of characters, ``?`` exactly one."""
    return re.compile(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    )


def _specificity(pattern: str) -> tuple[int, int, str]:
    """Most specific first: no wildcard before ``?`` before ``*``, then longer before shorter."""
    rank = 2 if "*" in pattern else 1 if "?" in pattern else 0
    return rank, -len(pattern.replace("*", "")), pattern


class _On:
    """The transitions of one state for one exit-code pattern (``flow.on(pattern)``)."""

    def __init__(self, flow: Flow, pattern: str) -> None:
        self.flow = flow
        self.pattern = pattern

    def to(self, element: Element) -> Flow:
        """Go on to ``element``, which becomes the current state."""
        self.flow._add(self.pattern, element)
        self.flow._current = self.flow._register(element)
        return self.flow

    def end(self, exit_code: str = "COMPLETED") -> Flow:
        """End the flow COMPLETED (the job cannot be restarted)."""
        return self._end(End(BatchStatus.COMPLETED, exit_code))

    def fail(self, exit_code: str = "FAILED") -> Flow:
        """End the flow FAILED; a restart re-runs the state that led here."""
        return self._end(End(BatchStatus.FAILED, exit_code))

    def stop(self, exit_code: str = "STOPPED") -> Flow:
        """End the flow STOPPED; a restart re-runs the state that led here."""
        return self._end(End(BatchStatus.STOPPED, exit_code))

    def stop_and_restart(self, element: Element, exit_code: str = "STOPPED") -> Flow:
        """End the flow STOPPED; a restart begins at ``element``."""
        self.flow._register(element)
        return self._end(End(BatchStatus.STOPPED, exit_code, element))

    def _end(self, end: End) -> Flow:
        self.flow._add(self.pattern, end)
        return self.flow


class Flow:
    """States joined by transitions (see the module docstring). Build it with :meth:`start`,
    :meth:`next`, :meth:`on` and :meth:`from_`; a flow is also a state of another flow (its exit
    code is the one it ended with) and a branch of a :class:`Split`.

    A state's own ``on`` transitions are tried first, most specific pattern first. If none
    matches, a state that COMPLETED goes on to its :meth:`next` (or ends the flow COMPLETED), a
    decision fails the flow, and anything else ends the flow with the state's status, as a step
    of a plain job does."""

    def __init__(self, name: str) -> None:
        if not name:
            raise FlowConfigurationError("a flow needs a name")
        self.name = name
        self._start: Element | None = None
        self._current: Element | None = None
        self._states: dict[str, Element] = {}
        self._transitions: dict[str, list[tuple[str, re.Pattern[str], Element | End]]] = {}
        self._next: dict[str, Element] = {}

    def __repr__(self) -> str:
        return f"Flow({self.name!r}, states={list(self._states)!r})"

    # --- building ----------------------------------------------------------------------------

    def _register(self, element: Element) -> Element:
        if not isinstance(element, (Step, Decider, Split, Flow)):
            raise FlowConfigurationError(
                f"flow {self.name!r}: {element!r} is not a step, decider, split or flow"
            )
        known = self._states.get(element.name)
        if known is not None and known is not element:
            raise FlowConfigurationError(
                f"flow {self.name!r} has two different states named {element.name!r}"
            )
        self._states[element.name] = element
        return element

    def _need_current(self, what: str) -> Element:
        if self._current is None:
            raise FlowConfigurationError(f"flow {self.name!r}: call start() before {what}")
        return self._current

    def _add(self, pattern: str, target: Element | End) -> None:
        current = self._need_current(f"on({pattern!r})")
        found = self._transitions.setdefault(current.name, [])
        if any(p == pattern for p, _, _ in found):
            raise FlowConfigurationError(
                f"flow {self.name!r}: state {current.name!r} has two transitions on {pattern!r}"
            )
        found.append((pattern, _pattern(pattern), target))
        found.sort(key=lambda t: _specificity(t[0]))

    def start(self, element: Element) -> Flow:
        if self._start is not None:
            raise FlowConfigurationError(f"flow {self.name!r} already has a start")
        self._start = self._current = self._register(element)
        return self

    def next(self, element: Element) -> Flow:
        """When the current state COMPLETED (and none of its ``on`` patterns matched), go on to
        ``element``, which becomes the current state."""
        current = self._need_current("next()")
        if current.name in self._next and self._next[current.name] is not element:
            raise FlowConfigurationError(
                f"flow {self.name!r}: state {current.name!r} already goes on to "
                f"{self._next[current.name].name!r}"
            )
        self._next[current.name] = self._register(element)
        self._current = element
        return self

    def on(self, pattern: str) -> _On:
        """Transitions of the current state when its exit code matches ``pattern``."""
        if not pattern:
            raise FlowConfigurationError("an exit-code pattern must not be empty")
        self._need_current(f"on({pattern!r})")
        return _On(self, pattern)

    def from_(self, element: Element) -> Flow:
        """Make a state already in the flow the current one (Spring's ``from``)."""
        known = self._states.get(getattr(element, "name", ""))
        if known is not element:
            raise FlowConfigurationError(f"flow {self.name!r}: {element!r} is not in the flow yet")
        self._current = element
        return self

    # --- reading -----------------------------------------------------------------------------

    @property
    def start_state(self) -> Element:
        if self._start is None:
            raise FlowConfigurationError(f"flow {self.name!r} has no start state")
        return self._start

    def states(self) -> list[Element]:
        return list(self._states.values())

    def flows(self) -> list[Flow]:
        """This flow and every flow nested in it (states and split branches)."""
        found = [self]
        for state in self._states.values():
            if isinstance(state, Flow):
                found += state.flows()
            elif isinstance(state, Split):
                for branch in state.branches:
                    found += branch.flows()
        return found

    def steps(self) -> list[Step]:
        """Every step of the flow, nested ones (partition workers, split branches) included."""
        found: list[Step] = []
        for flow in self.flows():
            for state in flow._states.values():
                if isinstance(state, Step):
                    found += state.steps()
        return found

    def validate(self) -> None:
        """Refuse a flow without a start, two flows of one name, or two states (steps, deciders,
        splits) of one name: the persisted path names them."""
        flows: dict[str, Flow] = {}
        states: dict[str, object] = {}
        for flow in self.flows():
            flow.start_state  # noqa: B018 - raises without one
            if flows.setdefault(flow.name, flow) is not flow:
                raise FlowConfigurationError(f"two different flows are named {flow.name!r}")
            for state in flow._states.values():
                if (
                    not isinstance(state, Flow)
                    and states.setdefault(state.name, state) is not state
                ):
                    raise FlowConfigurationError(
                        f"two different flow states are named {state.name!r}"
                    )

    def transition(
        self, state: Element, exit_code: str, status: BatchStatus
    ) -> Element | End | None:
        """Where the flow goes from ``state`` that ended with ``exit_code`` and ``status``: a
        state, an end, or None (end the flow with the state's own status)."""
        for _, compiled, target in self._transitions.get(state.name, ()):
            if compiled.fullmatch(exit_code):
                return target
        if status is BatchStatus.COMPLETED:
            return self._next.get(state.name) or _NATURAL_END
        return None


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
        if end is _NATURAL_END:
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
