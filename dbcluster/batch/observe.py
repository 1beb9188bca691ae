"""Observers of every job, step and chunk this process runs: the hook metrics and traces use.

Unlike a job's or step's ``listeners`` (part of its definition, chosen by the application), an
observer is attached to the process: ``observers.subscribe(observer)``. It sees every job and
step execution that runs here, whichever job defines it, the way a metrics registry or a tracer
provider is one per process. The cluster attaches its own (node events, spans) and tells its
executions apart by their fence.

Every method is a no-op here; an observer overrides what it needs. Observers run on the thread
of the execution, after the fact (a start or a chunk has committed), and an exception one
raises is logged, never passed to the job.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dbcluster.batch.domain import JobExecution, StepExecution

log = logging.getLogger(__name__)


class BatchObserver:
    """What a process can observe of the executions it runs (override what you need)."""

    def job_started(self, job_execution: JobExecution) -> None:
        """The job execution's STARTED write committed (also when a master resumes it)."""

    def job_ended(self, job_execution: JobExecution, error: BaseException | None) -> None:
        """The job's final write committed (``error`` None), or failed with ``error`` (then
        nothing of its end was recorded here)."""

    def step_started(self, step_execution: StepExecution) -> None:
        """The step execution's STARTED write committed (a partition too: its name is
        ``<worker step>:<partition>``)."""

    def chunk_committed(self, step_execution: StepExecution) -> None:
        """A transaction of the step's work committed: a chunk, or a tasklet call. The chunk's
        own counts are the differences of the step's counters (``read_count``, ...) from those
        at its previous commit, or at ``step_started`` (a chunk step reads before its
        transaction begins)."""

    def step_ended(self, step_execution: StepExecution, error: BaseException | None) -> None:
        """The step's final write committed (``error`` None), or failed with ``error`` (a
        partition whose fence broke: nothing of its end was recorded here)."""

    def trace_context(self, step_execution: StepExecution) -> str | None:
        """A query, not an event: the serialized trace context that work started on behalf of
        ``step_execution`` elsewhere should continue (a master placing partitions), or None."""
        return None


class Observers(BatchObserver):
    """Fans each call out to the subscribed observers; a failing observer is logged and
    skipped. With none subscribed (the usual case) a call costs one empty loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribed: tuple[BatchObserver, ...] = ()

    @property
    def tracing(self) -> bool:
        """Whether a subscribed observer gives steps a trace context (see
        :meth:`BatchObserver.trace_context`)."""
        return any(
            type(o).trace_context is not BatchObserver.trace_context for o in self._subscribed
        )

    def subscribe(self, observer: BatchObserver) -> None:
        with self._lock:
            self._subscribed = (*self._subscribed, observer)

    def unsubscribe(self, observer: BatchObserver) -> None:
        with self._lock:
            self._subscribed = tuple(o for o in self._subscribed if o is not observer)

    def _each(self, method: str, *args: Any) -> None:
        for observer in self._subscribed:
            try:
                getattr(observer, method)(*args)
            except Exception:  # noqa: BLE001 - an observer must not break the job
                log.exception("batch observer %r failed on %s", observer, method)

    def job_started(self, job_execution: JobExecution) -> None:
        self._each("job_started", job_execution)

    def job_ended(self, job_execution: JobExecution, error: BaseException | None) -> None:
        self._each("job_ended", job_execution, error)

    def step_started(self, step_execution: StepExecution) -> None:
        self._each("step_started", step_execution)

    def chunk_committed(self, step_execution: StepExecution) -> None:
        self._each("chunk_committed", step_execution)

    def step_ended(self, step_execution: StepExecution, error: BaseException | None) -> None:
        self._each("step_ended", step_execution, error)

    def trace_context(self, step_execution: StepExecution) -> str | None:
        for observer in self._subscribed:
            try:
                found = observer.trace_context(step_execution)
            except Exception:  # noqa: BLE001 - no context is better than a failed placement
                log.exception("batch observer %r failed on trace_context", observer)
                continue
            if found:
                return found
        return None


#: The process's observers.
observers = Observers()


_SKIPS = ("read_skip_count", "process_skip_count", "write_skip_count")


@dataclass(frozen=True)
class Chunk:
    """One committed chunk: its counts, and when it began (the step's previous commit, or its
    start) and ended (its commit), as ``time.time_ns()``."""

    read: int
    written: int
    skipped: int
    began_ns: int
    ended_ns: int

    @property
    def seconds(self) -> float:
        return max(0, self.ended_ns - self.began_ns) / 1e9


class ChunkClock:
    """Turns a step's running counters into per-chunk counts and times, for an observer:
    ``started`` at ``step_started``, ``chunk`` at each ``chunk_committed``, ``ended`` at
    ``step_ended``. Thread-safe (partitions run on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, tuple[int, int, int, int]] = {}

    @staticmethod
    def _now(se: StepExecution) -> tuple[int, int, int, int]:
        skipped = sum(getattr(se, name) for name in _SKIPS)
        return se.read_count, se.write_count, skipped, time.time_ns()

    def started(self, step_execution: StepExecution) -> None:
        with self._lock:
            self._last[step_execution.id] = self._now(step_execution)

    def chunk(self, step_execution: StepExecution) -> Chunk | None:
        """The chunk that just committed; None for a step not ``started`` here."""
        now = self._now(step_execution)
        with self._lock:
            last = self._last.get(step_execution.id)
            if last is None:
                return None
            self._last[step_execution.id] = now
        return Chunk(now[0] - last[0], now[1] - last[1], now[2] - last[2], last[3], now[3])

    def ended(self, step_execution: StepExecution) -> None:
        with self._lock:
            self._last.pop(step_execution.id, None)
