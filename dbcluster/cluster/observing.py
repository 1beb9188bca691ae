"""What a node observes of its own work, as its events: chunks its steps commit (from the
process's batch observers) and errors of its coordination connections (from the engine).

The batch observers are one per process, and a process may run several nodes (tests do): a step
execution belongs to this node when its fence was issued to one of the node's ids (a
partition's :class:`~dbcluster.cluster.fencing.PartitionFence`, or a master's
:class:`~dbcluster.cluster.mastership.Mastership` for the steps it runs itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext

from dbcluster.batch.observe import BatchObserver, ChunkClock, observers

if TYPE_CHECKING:
    from dbcluster.batch.domain import StepExecution
    from dbcluster.cluster.context import NodeContext


def step_name_of(step_execution: StepExecution) -> str:
    """The step's name without a partition's suffix (``worker:partition`` -> ``worker``), so
    that it stays a low-cardinality label."""
    return step_execution.step_name.split(":", 1)[0]


def fence_node(step_execution: StepExecution) -> str | None:
    """The node id the step execution's fence was issued to, or None (not a cluster run)."""
    node_id = getattr(step_execution.fence, "node_id", None)
    return node_id if isinstance(node_id, str) else None


def error_kind(context: ExceptionContext, is_transient: Any) -> str:
    """``connection``, ``contention`` or ``other`` (see ``ClusterEvents.coordination_error``)."""
    if context.is_disconnect:
        return "connection"
    wrapped = context.sqlalchemy_exception or context.original_exception
    return "contention" if is_transient(wrapped) else "other"


class NodeObserving(BatchObserver):
    """Fires ``chunk_committed`` and ``coordination_error`` on a node's events; ``engines``: the
    engines its coordination statements run on (heartbeats, polls and reads go on the
    autocommit engine where the database has one)."""

    def __init__(self, context: NodeContext, engines: Sequence[Engine]) -> None:
        self.context = context
        self.membership = context.membership
        self.engines = list({id(e): e for e in engines}.values())
        self._clock = ChunkClock()

    def start(self) -> NodeObserving:
        observers.subscribe(self)
        for engine in self.engines:
            event.listen(engine, "handle_error", self._on_error)
        return self

    def stop(self) -> None:
        observers.unsubscribe(self)
        for engine in self.engines:
            if event.contains(engine, "handle_error", self._on_error):
                event.remove(engine, "handle_error", self._on_error)

    def _mine(self, step_execution: StepExecution) -> str | None:
        node_id = fence_node(step_execution)
        return node_id if node_id is not None and node_id in self.membership.ids else None

    # --- batch observer ---------------------------------------------------------------------

    def step_started(self, step_execution: StepExecution) -> None:
        if self._mine(step_execution) is not None:
            self._clock.started(step_execution)

    def chunk_committed(self, step_execution: StepExecution) -> None:
        node_id = self._mine(step_execution)
        chunk = None if node_id is None else self._clock.chunk(step_execution)
        if node_id is not None and chunk is not None:
            self.context.events.chunk_committed(
                node_id,
                step_name_of(step_execution),
                chunk.read,
                chunk.written,
                chunk.skipped,
                chunk.seconds,
            )

    def step_ended(self, step_execution: StepExecution, error: BaseException | None) -> None:
        if self._mine(step_execution) is not None:
            self._clock.ended(step_execution)

    # --- coordination engine ----------------------------------------------------------------

    def _on_error(self, failure: ExceptionContext) -> None:
        ids = self.membership.ids
        if ids:
            kind = error_kind(failure, self.context.store.provider.is_transient)
            self.context.events.coordination_error(ids[-1], kind)
