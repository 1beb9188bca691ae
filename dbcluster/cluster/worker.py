"""The worker's poller: finds the partitions its node may run and claims them in batches.

A poll is one read (no transaction): the node's own PENDING partitions and those it may steal,
oldest first, up to its free capacity. A claim is one transaction for all of them (one
statement where the database can; see
:meth:`~dbcluster.cluster.store.CoordinationStore.claim`): it first locks the node's own
registry row (a node removed since it polled claims nothing), then moves the partitions still
PENDING to CLAIMED and records their step executions STARTED; the
:class:`~dbcluster.cluster.executor.Executor` runs what was won.

**Work stealing.** Placement is a preference: a PENDING partition never ran under its attempt, so
any live node may claim it through the same guarded claim (exactly one claim wins): at once when
its node has not heartbeaten for ``unreachable_threshold`` (or is gone), else once it waited
``work_stealing_delay`` unclaimed.

**Offers.** A wake-up names the partitions its placement put on this node (see
:mod:`dbcluster.cluster.notifier`; a master that is also a worker offers its own): those are
claimed first, without a poll; an offer another node took meanwhile is simply not won, and a
claim that won fewer than it was offered polls at once for the rest.

**When it polls.** At once when woken: a completion on this node while more work was waiting, a
notification that work was placed on it (see :mod:`dbcluster.cluster.notifier`), or a master on
this node that placed some. Otherwise the interval adapts: short after a poll that found work,
doubling after each empty one up to ``task_polling_interval``, so an idle node costs one read per
interval and a busy one picks up follow-on work within tens of milliseconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dbcluster.batch.domain import utcnow
from dbcluster.cluster.executor import Executor
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.service import Service
from dbcluster.cluster.store import NodeRemovedError
from dbcluster.testing import points

if TYPE_CHECKING:
    from dbcluster.cluster.node import Node

log = logging.getLogger("dbcluster.node")

#: The poll interval right after a poll that found work (milliseconds).
BUSY_POLL_MS = 25


class Worker(Service):
    """The node's poller (this service) and its partition executor (``concurrency_limit``
    threads)."""

    name = "poll"

    def __init__(self, node: Node) -> None:
        self.idle_interval_ms = node.settings.task_polling_interval
        super().__init__(self.idle_interval_ms)
        self.node = node
        self.store = node.store
        self.settings = node.settings
        self.capacity = node.capacity
        self.executor = Executor(node, self._slot_freed)
        self._backlog = False
        #: Partitions a wake-up named (placed on this node under ``_offered_to``), oldest
        #: first, not yet claimed: the next claims take them without a poll.
        self._offers: dict[int, None] = {}
        self._offered_to: str | None = None
        self._offers_lock = threading.Lock()

    @property
    def load(self) -> int:
        return self.executor.load

    def _slot_freed(self) -> None:
        if self._backlog:
            self.wake()

    def offer(self, node_id: str, step_execution_ids: Sequence[int]) -> None:
        """Partitions placed on this node as ``node_id``: claim them next, without a poll (a
        claim still checks each one; one taken or moved meanwhile is simply not won). Wakes
        the poller either way."""
        with self._offers_lock:
            if node_id != self._offered_to:
                self._offers.clear()
                self._offered_to = node_id
            self._offers.update(dict.fromkeys(step_execution_ids))
        self.wake()

    def _take_offers(self, node_id: str, limit: int) -> list[int]:
        with self._offers_lock:
            if node_id != self._offered_to:
                self._offers.clear()
                return []
            taken: list[int] = []
            while self._offers and len(taken) < limit:
                step_execution_id = next(iter(self._offers))
                del self._offers[step_execution_id]
                if not self.executor.holds(step_execution_id):
                    taken.append(step_execution_id)
            return taken

    # --- poll and claim -------------------------------------------------------------------------

    def run_once(self) -> None:
        identity = self.node.acting()
        if identity is None:
            return
        free = self.capacity - self.load
        if free <= 0:
            return  # a slot that frees up wakes the poll
        if self._claim(identity, free):
            self.interval_ms = BUSY_POLL_MS
        else:
            self.interval_ms = min(self.idle_interval_ms, self.interval_ms * 2)

    def _claim(self, identity: Identity, free: int) -> bool:
        """Claim once what a wake-up offered, else what a poll finds; True when anything was
        found."""
        s = self.settings
        polled = self._take_offers(identity.node_id, free)
        offered = bool(polled)
        if not offered:
            polled = [
                step_execution_id
                for step_execution_id in self.store.poll(
                    identity.node_id,
                    free,
                    steal_after_ms=s.work_stealing_delay,
                    unreachable_ms=s.unreachable_threshold,
                )
                if not self.executor.holds(step_execution_id)
            ]
        # More may be waiting: poll again as soon as a slot frees up.
        self._backlog = len(polled) >= free or bool(self._offers)
        if not polled:
            return False
        points.reach("node.between_poll_and_claim", node_id=identity.node_id, partitions=polled)
        if identity.fenced.is_set() or self.node.stopping:
            return True
        try:
            won = self.store.claim(identity.node_id, self.load, polled, utcnow())
        except NodeRemovedError as exc:
            self.node.fence(identity, str(exc))
            return True
        if offered and len(won) < len(polled):
            self.wake()  # some offers were taken or moved meanwhile: poll for what else waits
        events = self.node.events
        for claimed in won:
            p = claimed.partition
            log.info(
                "node %s claimed partition %s (%s, attempt %d)",
                identity.node_id,
                p.partition_name,
                p.step_execution_id,
                p.attempt,
            )
            events.claimed(identity.node_id, p.partition_name, p.step_execution_id, p.attempt)
        self.executor.submit(identity, won)
        return True

    # --- the node's hooks -----------------------------------------------------------------------

    def on_fenced(self, identity: Identity) -> None:
        self.executor.on_fenced(identity)

    def drain(self, deadline: float) -> None:
        self.executor.drain(deadline)
