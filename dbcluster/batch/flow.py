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
split. A ``stop_and_restart(step)`` end resumes at ``step``. This module builds flows;
:mod:`dbcluster.batch.flowrun` runs them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from dbcluster.batch.domain import JobExecution, StepExecution
from dbcluster.batch.exceptions import BatchError
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step

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
NATURAL_END = End(BatchStatus.COMPLETED, "COMPLETED")

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
            return self._next.get(state.name) or NATURAL_END
        return None
