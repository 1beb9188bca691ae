"""The worker's poller: finds the partitions its node may run and claims them in batches; its
:class:`~dbcluster.cluster.executor.Executor` runs what was won.

How it polls, claims (its own partitions, offers from wake-ups, stolen ones, ahead of its free
slots), hands slots on and withdraws when its claims keep failing: docs/CONTRACTS.md, "Worker".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from dbcluster import points
from dbcluster.batch.domain import utcnow
from dbcluster.cluster.context import NodeContext
from dbcluster.cluster.executor import Executor
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.offers import PlacedPartition
from dbcluster.cluster.patience import is_passing
from dbcluster.cluster.service import Service
from dbcluster.cluster.store import ClaimedPartition, NodeRemovedError

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime
    from dbcluster.cluster.stopping import StopRequests

log = logging.getLogger("dbcluster.node")

#: The poll interval right after a poll that found work (milliseconds).
BUSY_POLL_MS = 25
#: A node claims ahead (see ``prefetch_multiplier``) only while its partitions ran shorter than
#: this on average (milliseconds): a longer one waiting behind another would hold back a job
#: that a free node elsewhere could have served.
PREFETCH_BELOW_MS = 500
#: A poll carries the heartbeat when that is due before the next poll plus this much (or half
#: an interval, if less): the next poll may start a little late (seconds).
CARRY_MARGIN_S = 0.25
#: Claims failing in a row (not on the database's passing trouble) that withdraw a node from
#: taking partitions.
CLAIM_FAILURES_TO_WITHDRAW = 3
#: A withdrawn node tries a claim every this many poll intervals (``task_polling_interval``),
#: twice as long after each withdrawal that followed its last claim of partitions that worked.
WITHDRAWN_PROBE_POLLS = 10
#: The longest pause between a withdrawn node's tries (milliseconds).
WITHDRAWN_PROBE_MAX_MS = 600_000


class BeatCarrier(Protocol):
    """The node's heartbeat, as the worker's poll carries it where the two coincide (see
    :class:`~dbcluster.cluster.membership.Heartbeat`)."""

    def due_within(self, seconds: float) -> bool:
        """Whether the next heartbeat is due within ``seconds``."""

    def carried(self, identity: Identity, alive: bool, began: float) -> None:
        """A poll carried a heartbeat of ``identity`` that began at ``began``."""

    def send_with_poll(
        self, node_id: str, load: int, limit: int | None
    ) -> tuple[bool, list[tuple[int, int]]] | None:
        """The heartbeat with the poll (and what else it carries) in one round trip: (whether
        the node's row was there, what the poll found); None where it cannot (nothing sent)."""


class Worker(Service):
    """The node's poller (this service) and its partition executor (``capacity`` threads
    running the steps of ``runtime``'s registry; the jobs they run are watched for stop
    requests by ``stop_requests``)."""

    name = "poll"

    def __init__(
        self,
        context: NodeContext,
        runtime: BatchRuntime,
        *,
        capacity: int,
        stop_requests: StopRequests,
    ) -> None:
        self.idle_interval_ms = context.settings.task_polling_interval
        super().__init__(self.idle_interval_ms)
        self.context = context
        self.store = context.store
        self.settings = context.settings
        self.capacity = capacity
        self.executor = Executor(
            context,
            runtime,
            capacity=capacity,
            stop_requests=stop_requests,
            on_free=self._slot_freed,
            next_partitions=self._next_partitions,
            on_claim=self._claimed,
        )
        #: Whether every partition of the last claim that won any was transferable.
        self._transferable = False
        self._backlog = False
        #: Partitions a wake-up named (placed on this node under ``_offered_to``), oldest
        #: first, not yet claimed: the next claims take them without a poll.
        self._offers: dict[int, None] = {}
        self._offered_to: str | None = None
        self._offers_lock = threading.Lock()
        #: Held by the poller while it polls and claims (until what it won is held): a
        #: partition run before its claim (see cluster/placed.py) starts only while no claim of
        #: this node's is in flight.
        self._claiming = threading.Lock()
        self._claim_failures = 0
        #: Withdrawals since a claim of partitions last worked.
        self._withdrawals = 0
        #: The node id under which a withdrawal's capacity 0 was written.
        self._withdrawn_as: str | None = None
        #: Why this node takes no partitions for now (its claims kept failing), or None.
        self.withdrawn: str | None = None
        #: Whether the node's wake-ups arrive now (its listener is up); None: it has none. While
        #: they do, an idle node polls every ``wakeup_poll_interval`` only.
        self.listening: Callable[[], bool] | None = None
        #: The node's heartbeat, carried by a poll where the two coincide (None: never).
        self.heartbeat: BeatCarrier | None = None

    def idle_poll_ms(self) -> int:
        """How often an idle node polls now: every ``task_polling_interval``, or every
        ``wakeup_poll_interval`` (the fallback for a lost wake-up) while wake-ups arrive."""
        s = self.settings
        if self.listening is not None and self.listening():
            return max(s.task_polling_interval, s.wakeup_poll_interval)
        return s.task_polling_interval

    def listener_changed(self) -> None:
        """The wake-up listener came up or went down: poll now (a wake-up may have been lost
        meanwhile), then at the pace that fits."""
        self.wake()

    @property
    def load(self) -> int:
        return self.executor.load

    def _slot_freed(self) -> None:
        if self._backlog:
            self.wake()

    def offer(
        self,
        node_id: str,
        step_execution_ids: Sequence[int],
        placed: Sequence[PlacedPartition] = (),
    ) -> None:
        """Partitions placed on this node as ``node_id``: claim them next, without a poll (a
        claim still checks each one; one taken or moved meanwhile is simply not won). Wakes
        the poller, unless the node runs every one of them at once: ``placed`` (the wake-up
        carried their executions) are run before they are claimed where the node may (see
        :mod:`dbcluster.cluster.placed`)."""
        if placed and self.settings.carried_wakeups:
            running = set(self._run_placed(node_id, placed))
            step_execution_ids = [sid for sid in step_execution_ids if sid not in running]
            if running and not step_execution_ids:
                return
        self._hint(node_id, step_execution_ids)
        self.wake()

    def _run_placed(self, node_id: str, placed: Sequence[PlacedPartition]) -> list[int]:
        """Those of ``placed`` the executor runs before claiming them: only while the node is
        usable as ``node_id``, takes work, and its poller is not claiming."""
        identity = self.context.usable_identity()
        if identity is None or identity.node_id != node_id or self.withdrawn is not None:
            return []
        if self.context.stopping or not self._claiming.acquire(blocking=False):
            return []
        try:
            return self.executor.placed_runs.run(identity, list(placed))
        finally:
            self._claiming.release()

    def _claimed(self, won: list[ClaimedPartition]) -> None:
        """A claim (the poller's, a slot's) won these: claiming ahead stops after one that won
        a non-transferable partition."""
        self._transferable = all(claimed.partition.transferable for claimed in won)

    def _next_partitions(self, identity: Identity, limit: int) -> list[int]:
        """For a slot whose partition (or group) ends: up to ``limit`` partitions known to be
        waiting (offered, or found by a poll beyond what it claimed), for it to claim next."""
        if self.context.usable_identity() is not identity:  # fenced, leaving, or silent too long
            return []
        return self._take_offers(identity.node_id, limit)

    def _hint(self, node_id: str, step_execution_ids: Sequence[int]) -> None:
        """Partitions a poll found beyond what it claimed: offers for the next claims (no
        wake-up: the slots that end take them)."""
        with self._offers_lock:
            if node_id != self._offered_to:
                self._offers.clear()
                self._offered_to = node_id
            self._offers.update(dict.fromkeys(step_execution_ids))

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
        identity = self.context.usable_identity()
        if identity is None:
            return
        try:
            # Its room read under the claim lock: a partition run before its claim (which
            # takes a slot under that lock) is not room any more.
            with self._claiming:
                if self._offers:
                    # Offered partitions wait (a wake-up named more than the slots, e.g. those
                    # a placed run left): a slot that frees up must wake the poll for them.
                    # Set before the room is read, so a slot freed after the read sees it.
                    self._backlog = True
                free = self._room()
                if free <= 0:
                    return  # a slot that frees up wakes the poll
                found = self._claim(identity, free)
        except Exception as error:
            self._claim_failed(identity, error)
            raise
        self._claim_failures = 0
        if self.withdrawn is not None:
            self._take_work_again(identity)
        if found:
            self.interval_ms = BUSY_POLL_MS
        else:
            self.interval_ms = min(self.idle_poll_ms(), self.interval_ms * 2)

    def claims_ahead(self) -> bool:
        """Whether this node holds more partitions than it has slots (docs/CONTRACTS.md,
        "Claiming ahead")."""
        recent = self.executor.recent_run_ms
        return (
            self.settings.prefetch_multiplier > 1
            and self._transferable
            and recent is not None
            and recent < PREFETCH_BELOW_MS
        )

    def _room(self) -> int:
        """How many partitions the next claim may take: the free slots; or, claiming ahead,
        enough to hold ``prefetch_multiplier`` per slot, once no more are waiting than there
        are slots (so that one claim serves several partitions)."""
        held = self.load
        group = self.executor.grouping.claim_size()
        if group > 1:  # a group per free slot (see cluster/grouping.py)
            return self.executor.free_slots() * group
        if not self.claims_ahead():
            return self.capacity - held
        if held > self.capacity:
            return 0  # enough are waiting: each slot that frees up starts one of them
        return self.capacity * self.settings.prefetch_multiplier - held

    def _claim_failed(self, identity: Identity, error: BaseException) -> None:
        if is_passing(self.store.provider, error):
            return
        self._claim_failures += 1
        withdrawing = self.withdrawn is None
        if withdrawing:
            if self._claim_failures < CLAIM_FAILURES_TO_WITHDRAW:
                return
            self.withdrawn = (
                f"its last {self._claim_failures} claims failed: {type(error).__name__}: {error}"
            )
            self._withdrawals += 1
            self.interval_ms = min(
                WITHDRAWN_PROBE_MAX_MS,
                self.idle_interval_ms * WITHDRAWN_PROBE_POLLS * 2 ** (self._withdrawals - 1),
            )
            log.error(
                "node %s takes no partitions until a claim works again (%s); what was placed "
                "on it goes back to its masters",
                identity.node_id,
                self.withdrawn,
            )
        # After each failed try, not only the first: capacity 0 until it is written under the
        # node's current id (a failed write, a rejoin under a new id), and what a master placed
        # before it saw the withdrawal goes back.
        try:
            if self._withdrawn_as != identity.node_id:
                self.store.set_capacity(identity.node_id, 0)
                self._withdrawn_as = identity.node_id
            handed = self.store.release_pending(identity.node_id)
        except Exception as exc:  # noqa: BLE001 - tried again after the next failed claim
            log.warning("node %s could not hand its partitions back: %s", identity.node_id, exc)
            return
        if withdrawing:
            self.context.events.withdrawn(identity.node_id, self.withdrawn, handed)

    def _take_work_again(self, identity: Identity) -> None:
        """A claim worked after the node withdrew: it takes partitions again (unless it is
        leaving, which withdrew its capacity for good)."""
        if self.context.stopping:
            return
        self.store.set_capacity(identity.node_id, self.capacity)
        if self.context.stopping:  # a graceful stop began meanwhile: its capacity 0 stands
            self.store.set_capacity(identity.node_id, 0)
            return
        log.info("node %s takes partitions again: a claim worked", identity.node_id)
        self.withdrawn = None
        self._withdrawn_as = None

    def _claim(self, identity: Identity, free: int) -> bool:
        """Claim once what a wake-up offered, else what a poll finds; True when anything was
        found."""
        polled = self._take_offers(identity.node_id, free)
        offered = bool(polled)
        # Offered partitions were just placed: maybe of a job this node has not read yet, which
        # the claim then reads back with them; so do polled ones of a job it does not know.
        with_jobs = offered
        if not offered:
            # One more per slot than it claims (a group's worth per slot, where partitions are
            # grouped): the partitions or groups ending meanwhile claim those next (see the
            # executor's "A slot hands itself on" and Grouping.refill).
            ahead = self.capacity * self.executor.grouping.claim_size()
            found = [
                (step_execution_id, job_execution_id)
                for step_execution_id, job_execution_id in self._poll(identity, free + ahead)
                if not self.executor.holds(step_execution_id)
            ]
            polled = [step_execution_id for step_execution_id, _ in found]
            if len(polled) > free:
                self._hint(identity.node_id, polled[free:])
                del polled[free:]
            with_jobs = not all(self.executor.knows_job(job) for _, job in found[:free])
        # More may be waiting: poll again as soon as a slot frees up.
        self._backlog = len(polled) >= free or bool(self._offers)
        if not polled:
            if self.withdrawn is not None:
                # The claim itself must work before the node takes work again.
                try:
                    self.store.claim(identity.node_id, self.load, [], utcnow())
                except NodeRemovedError as exc:
                    self.context.fence(identity, str(exc))
            return False
        points.reach("node.between_poll_and_claim", node_id=identity.node_id, partitions=polled)
        if identity.fenced.is_set() or self.context.stopping:
            return True
        try:
            won = self.store.claim(
                identity.node_id, self.load, polled, utcnow(), with_jobs=with_jobs
            )
        except NodeRemovedError as exc:
            self.context.fence(identity, str(exc))
            return True
        except Exception:
            # Its commit may have landed (its acknowledgement lost, the retries spent): what
            # it won runs, or it would stay CLAIMED here with no one to run it.
            self.executor.aftermath.run_read_back(identity, polled)
            raise
        self._withdrawals = 0
        points.reach("node.claimed", node_id=identity.node_id, partitions=won)
        if offered and len(won) < len(polled):
            self.wake()  # some offers were taken or moved meanwhile: poll for what else waits
        self.executor.submit(identity, won)
        return True

    def _poll(self, identity: Identity, limit: int) -> list[tuple[int, int]]:
        """The poll; carrying the heartbeat when that is due before the next poll, where the
        database can do both in one round trip."""
        s = self.settings
        beat = self.heartbeat
        # Due before the next poll ends (a poll takes a moment: a little margin), so that no
        # heartbeat goes alone; it comes at most that much early.
        interval_s = self.interval_ms / 1000
        if beat is not None and beat.due_within(interval_s + min(interval_s / 2, CARRY_MARGIN_S)):
            began = time.monotonic()
            both = beat.send_with_poll(identity.node_id, self.load, limit)
            if both is not None:
                alive, found = both
                beat.carried(identity, alive, began)  # fences the identity when not alive
                return found if alive else []
        return self.store.poll_jobs(
            identity.node_id,
            limit,
            steal_after_ms=s.work_stealing_delay,
            unreachable_ms=s.unreachable_threshold,
        )

    # --- the heartbeat's hooks (a heartbeat carries an idle poll) ---------------------------------

    def poll_to_carry(self, node_id: str) -> int | None:
        """How many partitions a poll under ``node_id`` would ask for, while the worker is idle
        (the heartbeat carries one on each beat: an idle node then polls every heartbeat
        interval at no round trip of its own); else None."""
        identity = self.context.usable_identity()
        if identity is None or identity.node_id != node_id or self.withdrawn is not None:
            return None
        if self._backlog or self._offers:
            return None  # not idle: the worker claims what waits
        free = self._room()
        if self.due_in() is None or free <= 0:
            return None  # polling now, or no room
        return free + self.capacity

    def carried_poll(self, node_id: str, found: Sequence[tuple[int, int]]) -> None:
        """A heartbeat carried the idle poll under ``node_id``: what it found is claimed next as
        if offered (the worker wakes for it); nothing found: the next poll is an interval
        away."""
        waiting = [sid for sid, _ in found if not self.executor.holds(sid)]
        if waiting:
            self.offer(node_id, waiting)
            return
        # An idle poll that found nothing, as the worker's own would be: it relaxes the pace.
        self.interval_ms = min(self.idle_poll_ms(), self.interval_ms * 2)
        self.postpone()

    # --- the node's hooks -----------------------------------------------------------------------

    def on_fenced(self, identity: Identity) -> None:
        self.executor.on_fenced(identity)

    def drain(self, deadline: float) -> None:
        self.executor.drain(deadline)
