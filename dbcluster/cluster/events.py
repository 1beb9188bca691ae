"""What a node does, as typed events: subclass :class:`ClusterEvents`, override what you need, and
subscribe it with ``node.events.subscribe(listener)``.

Every method is a no-op here. Events fire after the fact (a claim committed, a partition moved);
an exception raised by a subscriber is logged and never reaches the node.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

log = logging.getLogger("dbcluster.events")


class ClusterEvents:
    """The events of a node, its worker, its maintainers and the masters it runs."""

    # --- membership -------------------------------------------------------------------------------

    def joined(self, node_id: str) -> None:
        """The node registered under ``node_id``."""

    def fenced(self, node_id: str, reason: str) -> None:
        """The node stopped acting under ``node_id`` (its row was removed, or it could not
        heartbeat for too long); it commits nothing more under that id."""

    def left(self, node_id: str) -> None:
        """The node left the cluster gracefully."""

    def heartbeat(self, node_id: str, seconds: float) -> None:
        """A heartbeat landed; ``seconds`` is its round trip to the database."""

    def coordination_error(self, node_id: str, kind: str) -> None:
        """A statement on the node's coordination connections failed: ``kind`` is
        ``connection`` (lost or refused), ``contention`` (deadlock, lock wait or serialization
        failure: repeated) or ``other``."""

    # --- worker -----------------------------------------------------------------------------------

    def claimed(self, node_id: str, partition: str, step_execution_id: int, attempt: int) -> None:
        """A partition was claimed (the claim committed)."""

    def completed(self, node_id: str, partition: str, step_execution_id: int) -> None:
        """A partition's step completed and its partition row says so (one transaction)."""

    def failed(self, node_id: str, partition: str, step_execution_id: int) -> None:
        """A partition's step failed and its partition row says so."""

    def released(self, node_id: str, partition: str | None, step_execution_id: int | None) -> None:
        """A partition (or, with None, every unclaimed one of the node) was handed back."""

    def withdrawn(self, node_id: str, reason: str, handed_back: int) -> None:
        """The node's claims kept failing (not on the database's passing trouble): it takes no
        partitions until one works again, and handed back ``handed_back`` unclaimed ones."""

    def lost(self, node_id: str, partition: str, step_execution_id: int, reason: str) -> None:
        """A running partition's fence broke: it moved, so this node commits nothing more for it."""

    def retried(self, node_id: str, partition: str, step_execution_id: int, attempt: int) -> None:
        """Try ``attempt`` of a transferable partition failed; it was put back for another."""

    def chunk_committed(
        self, node_id: str, step: str, read: int, written: int, skipped: int, seconds: float
    ) -> None:
        """A chunk (or tasklet call) of a step this node runs committed: ``step`` is the step's
        name (a partition's worker step, without the partition), the counts are the chunk's,
        ``seconds`` the time since the step's previous commit (reading, processing, writing)."""

    # --- maintenance ------------------------------------------------------------------------------

    def swept(self, node_id: str, marked: int, removed: int) -> None:
        """A sweep marked nodes UNREACHABLE and removed silent ones (their claims fenced)."""

    def pruned(self, node_id: str, counts: dict[str, int], seconds: float) -> None:
        """This node pruned finished executions: ``counts`` holds the rows deleted per table
        (``batch_job_execution``: the executions), ``seconds`` how long it took."""

    def abandoned(self, node_id: str, job_execution_id: int, lost_master: str) -> None:
        """A job whose master was lost was failed by this node, so it can be restarted."""

    def took_over(self, node_id: str, job_execution_id: int, lost_master: str, epoch: int) -> None:
        """This node became the master of a job whose master was lost, under ``epoch``."""

    def restarted(self, node_id: str, job_execution_id: int, new_execution_id: int) -> None:
        """This node restarted an execution that ended for cluster reasons (auto-restart)."""

    # --- launches and schedules -------------------------------------------------------------------

    def launch_claimed(self, node_id: str, request_id: int, job_name: str) -> None:
        """This node won the claim of a launch request; it launches the job as its master."""

    def launch_started(self, node_id: str, request_id: int, job_execution_id: int) -> None:
        """A claimed request's execution was created (the request is LAUNCHED)."""

    def launch_failed(self, node_id: str, request_id: int, error: str) -> None:
        """A claimed request could not be launched (the request is FAILED with the error)."""

    def schedule_fired(
        self, node_id: str, schedule: str, fire_time: datetime, request_id: int
    ) -> None:
        """This node fired a schedule's tick (naive UTC): it submitted its launch request."""

    # --- master -----------------------------------------------------------------------------------

    def placed(
        self,
        master: str,
        job_execution_id: int,
        master_step_execution_id: int,
        placement: dict[str, str],
    ) -> None:
        """A master placed a partitioned step's partitions (name -> node id)."""

    def reassigned(
        self, master: str, step_execution_id: int, partition: str, from_node: str | None, to: str
    ) -> None:
        """A master moved an orphaned partition to a live node."""

    def orphan_failed(self, master: str, step_execution_id: int, node: str | None) -> None:
        """A master failed a non-transferable partition lost with its node (never run twice)."""

    def timed_out(
        self, master: str, step_execution_id: int, partition: str, node: str, retried: bool
    ) -> None:
        """A master fenced a partition that made no progress within its step's timeout."""


class EventHub(ClusterEvents):
    """Fans each event out to its subscribers; a failing subscriber is logged and skipped."""

    def __init__(self) -> None:
        self._subscribers: list[ClusterEvents] = []

    def subscribe(self, listener: ClusterEvents) -> None:
        self._subscribers.append(listener)

    def unsubscribe(self, listener: ClusterEvents) -> None:
        if listener in self._subscribers:
            self._subscribers.remove(listener)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name not in _EVENT_NAMES:
            return object.__getattribute__(self, name)
        subscribers = object.__getattribute__(self, "_subscribers")

        def fire(*args: Any, **kwargs: Any) -> None:
            for listener in list(subscribers):
                try:
                    getattr(listener, name)(*args, **kwargs)
                except Exception:  # noqa: BLE001 - an observer must not break the node
                    log.exception("event listener %r failed on %s", listener, name)

        return fire


_EVENT_NAMES = frozenset(
    name
    for name, value in vars(ClusterEvents).items()
    if callable(value) and not name.startswith("_")
)
