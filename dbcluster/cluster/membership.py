"""A node's membership of the cluster: the identity it acts under, fencing, and its heartbeat.

A node has an *identity* (a node id) per membership. When its row is removed, or it cannot
heartbeat for so long that the cluster may remove it at any moment, that identity is fenced: it
claims nothing more, starts nothing it claimed, and every transaction of its running partitions
and masters is refused (their fences check the identity before the database does). The node then
rejoins under a fresh id; nothing is ever written again under the old one.

:class:`Membership` holds the identities one after another and the node's stop signal (a
graceful stop began); :class:`Heartbeat` is the service that keeps the current one alive (started
first, stopped last) and rejoins after a fence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore

log = logging.getLogger("dbcluster.node")


class Membership:
    """The identities of one node, one after another, and its stop signal.

    ``on_fenced(identity)`` is told of each fence first (the node's worker stops what runs
    under that identity), before the log line and the ``fenced`` event.
    """

    def __init__(
        self,
        settings: ClusterSettings,
        events: ClusterEvents,
        on_fenced: Callable[[Identity], None] | None = None,
    ) -> None:
        self.settings = settings
        self.events = events
        self.on_fenced = on_fenced
        self._lock = threading.RLock()
        self._current: Identity | None = None
        self._stopping = threading.Event()
        #: Every id this node has joined under, oldest first.
        self.ids: list[str] = []

    # --- the identity -----------------------------------------------------------------------------

    @property
    def current(self) -> Identity | None:
        """The identity of the latest join (fenced or not), or None before the first."""
        return self._current

    @property
    def identity(self) -> Identity:
        identity = self._current
        if identity is None:
            raise RuntimeError("the node has not joined the cluster; call start()")
        return identity

    @property
    def is_fenced(self) -> bool:
        identity = self._current
        return identity is None or identity.is_fenced

    def usable_identity(self) -> Identity | None:
        """The identity this node may act under now, or None (not joined, fenced, leaving, or
        silent so long that the cluster may remove it at any moment)."""
        identity = self._current
        if identity is None or self.stopping or self.watchdog(identity):
            return None
        return identity

    def joined(self, node_id: str, capacity: int) -> Identity:
        """The node registered under ``node_id`` (with ``capacity``): its identity from now."""
        identity = Identity(node_id)
        with self._lock:
            self._current = identity
            self.ids.append(node_id)
        log.info("node %s joined the cluster (capacity %d)", node_id, capacity)
        self.events.joined(node_id)
        return identity

    def fence(self, identity: Identity, reason: str) -> None:
        """Stop acting under ``identity``: its claims, partitions and masters refuse to write."""
        with self._lock:
            if identity.fenced.is_set():
                return
            identity.fence_reason = reason
            identity.fenced.set()
        if self.on_fenced is not None:
            self.on_fenced(identity)
        log.warning("node %s fenced itself (%s)", identity.node_id, reason)
        self.events.fenced(identity.node_id, reason)

    def retire(self, identity: Identity) -> bool:
        """The node leaves the cluster under ``identity``: nothing writes under it any more (a
        master still monitoring stops). False when it was fenced already."""
        with self._lock:
            if identity.fenced.is_set():
                return False
            identity.fence_reason = "left the cluster"
            identity.fenced.set()
            return True

    def watchdog(self, identity: Identity) -> bool:
        """Fence when the last good heartbeat is so old that the cluster may remove this node at
        any moment, even if the heartbeat thread itself is stuck in a call that has not returned
        (a cut network) or the process was stopped. Shorter silences stay in the grace window:
        an UNREACHABLE node that beats again is ACTIVE again. True when fenced."""
        s = self.settings
        limit = max(s.unreachable_threshold, s.cleanup_threshold - s.heartbeat_interval)
        silent_ms = (time.monotonic() - identity.last_heartbeat_ok) * 1000
        if silent_ms >= limit and not identity.fenced.is_set():
            self.fence(identity, f"no heartbeat for {silent_ms:.0f} ms")
        return identity.fenced.is_set()

    # --- the stop signal --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether a graceful stop began (the node claims and starts nothing new)."""
        return self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()


class PollRider(Protocol):
    """The worker's idle poll, as the heartbeat carries it in its round trip where the two
    coincide (see :meth:`Heartbeat.beat`)."""

    def poll_to_carry(self, node_id: str) -> int | None:
        """How many partitions the worker's poll under ``node_id`` would ask for, while it is
        idle; else None."""

    def carried_poll(self, node_id: str, found: Sequence[tuple[int, int]]) -> None:
        """What that poll found (step and job execution ids), just now."""


class LeaseRider(Protocol):
    """The lease service's look for a lapsed lease and a holder's renewal of its leases, as the
    heartbeat carries them in its round trip where the database can send them together (see
    :meth:`Heartbeat.beat`)."""

    def lease_term_to_read(self, node_id: str) -> int | None:
        """The term (ms) to judge the leases by, while the node under ``node_id`` wants a
        lease it does not hold; else None (nothing to read)."""

    def leases_seen(self, node_id: str, rows: Mapping[str, Any]) -> None:
        """What that read found (lease name -> ``LeaseRow``), just now."""

    def leases_to_renew(self, node_id: str) -> tuple[list[str], int] | None:
        """The leases the node holds under ``node_id`` (the heartbeat renews them in its round
        trip) and the term (ms) they are judged by; None when it holds none."""

    def renewal_carried(
        self, node_id: str, names: Sequence[str], sent: float, renewed: Sequence[str]
    ) -> None:
        """A heartbeat sent at ``sent`` (``time.monotonic()``) renewed those of ``names`` in
        ``renewed``; the others did not land."""


class Heartbeat(Service):
    """Every ``heartbeat_interval``: one statement that says the current identity is alive and
    how loaded the node is; a fenced (or not yet joined) node rejoins instead.

    Where the database can do both in one statement, every heartbeat carries a poll while the
    worker is idle (``poll``), and the worker's poll carries the heartbeat when the heartbeat
    is due before its next poll (:meth:`carried`): an idle node's heartbeats and polls share
    their round trips. Either way the heartbeat's own timer keeps running, so a stuck worker
    never delays it."""

    name = "heartbeat"
    #: Every turn that raises nothing wrote a heartbeat (or joined): the database answers.
    proves_database = True

    def __init__(
        self,
        membership: Membership,
        store: CoordinationStore,
        load: Callable[[], int],
        rejoin: Callable[[], object],
    ) -> None:
        super().__init__(membership.settings.heartbeat_interval)
        self.membership = membership
        self.store = store
        self.load = load
        self.rejoin = rejoin
        #: The worker's idle poll, carried where the two coincide (None: never).
        self.poll: PollRider | None = None
        #: The leases' look for a lapsed one and a holder's renewal, carried where the
        #: database can (None: never).
        self.leases: LeaseRider | None = None

    def run_once(self) -> None:
        self.beat()

    def due_within(self, seconds: float) -> bool:
        """Whether the next heartbeat is due within ``seconds`` (the worker's poll may carry
        it)."""
        due = self.due_in()
        return due is not None and due <= seconds

    def carried(self, identity: Identity, alive: bool, began: float) -> None:
        """The worker's poll carried a heartbeat of ``identity`` that began at ``began``
        (``time.monotonic()``): judged as this service judges its own; the next one is due an
        interval from now."""
        if identity is not self.membership.current or identity.fenced.is_set():
            return
        self._judge(identity, alive, began)
        if alive:
            # This service's work, done: it ends an outage the heartbeat met (its own turns,
            # postponed by every carried beat, may not come while the worker stays busy).
            self.last_good = time.monotonic()
            self.outage.ended()
        self.postpone()

    def _beat(self, identity: Identity) -> bool:
        """One heartbeat of ``identity``, carrying the worker's poll while it is idle and the
        leases' read while the node wants one it does not hold, where the database can send
        them in one round trip."""
        node_id = identity.node_id
        load = self.load()
        rider = self.poll
        limit: int | None = None
        if rider is not None:
            try:
                limit = rider.poll_to_carry(node_id)
            except Exception as exc:  # noqa: BLE001 - the worker's trouble: beat alone
                log.debug("node %s beats without its poll: %s", node_id, exc)
        both = self.send_with_poll(node_id, load, limit)
        if both is None:
            return self.store.heartbeat(node_id, load)
        alive, found = both
        if alive and rider is not None and limit is not None:
            try:
                rider.carried_poll(node_id, found)
            except Exception as exc:  # noqa: BLE001 - the worker polls on its own
                log.debug("node %s: a carried poll was dropped: %s", node_id, exc)
        return alive

    def send_with_poll(
        self, node_id: str, load: int, limit: int | None
    ) -> tuple[bool, list[tuple[int, int]]] | None:
        """A heartbeat under ``node_id`` with a poll for ``limit`` partitions (none when None),
        the renewal of the leases the node holds and, while it wants a lease it does not hold,
        the leases' read (both handed to :attr:`leases`), in one round trip: (whether the
        node's row was there, what the poll found). None where the database cannot send them
        together (nothing was sent; a holder's lease service then renews on its own)."""
        s = self.membership.settings
        leases = self.leases
        term_ms = None if leases is None else leases.lease_term_to_read(node_id)
        held = None if leases is None else leases.leases_to_renew(node_id)
        if leases is not None and held is not None:
            # A holder: the heartbeat renews its leases too.
            names, renew_term_ms = held
            sent = time.monotonic()
            beat = self.store.beat_renewing(
                node_id,
                load,
                names,
                renew_term_ms,
                limit=limit,
                read_leases=term_ms is not None,
                steal_after_ms=s.work_stealing_delay,
                unreachable_ms=s.unreachable_threshold,
            )
            if beat is not None:
                leases.renewal_carried(node_id, names, sent, beat.renewed)
                if beat.alive and beat.leases is not None:
                    leases.leases_seen(node_id, beat.leases)
                return beat.alive, beat.found
        if leases is not None and term_ms is not None:
            all_three = self.store.beat_reading_leases(
                node_id,
                load,
                limit,
                term_ms,
                steal_after_ms=s.work_stealing_delay,
                unreachable_ms=s.unreachable_threshold,
            )
            if all_three is not None:
                alive, found, rows = all_three
                if alive:
                    leases.leases_seen(node_id, rows)
                return alive, found
        if limit is None:
            return None
        return self.store.beat_and_poll(
            node_id,
            load,
            limit,
            steal_after_ms=s.work_stealing_delay,
            unreachable_ms=s.unreachable_threshold,
        )

    def beat(self) -> None:
        membership = self.membership
        identity = membership.current
        if identity is None or identity.fenced.is_set():
            if not membership.stopping:
                self._rejoin()
            return
        began = time.monotonic()
        try:
            alive = self._beat(identity)
        except Exception as exc:  # noqa: BLE001 - judged by how long it has lasted
            silent_ms = (time.monotonic() - identity.last_heartbeat_ok) * 1000
            if not self.unavailable(exc):  # an outage: one WARNING for all of it
                log.warning(
                    "node %s cannot heartbeat (%d ms): %s", identity.node_id, silent_ms, exc
                )
            if silent_ms >= membership.settings.unreachable_threshold:
                membership.fence(identity, f"no heartbeat for {silent_ms:.0f} ms")
            return
        self._judge(identity, alive, began)

    def _judge(self, identity: Identity, alive: bool, began: float) -> None:
        membership = self.membership
        # A heartbeat that only lands after the unreachable threshold may have revived a row
        # that others already judged; we still hold it, so it counts as alive.
        if alive:
            identity.last_heartbeat_ok = time.monotonic()
            membership.events.heartbeat(identity.node_id, identity.last_heartbeat_ok - began)
        else:
            membership.fence(identity, "its registry row was removed")

    def _rejoin(self) -> None:
        try:
            self.rejoin()
        except Exception as exc:  # noqa: BLE001 - try again on the next beat
            if not self.unavailable(exc):
                log.warning("node could not rejoin the cluster: %s", exc)
