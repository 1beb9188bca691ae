"""Leased maintenance: the work that any node can do for all (sweeps, the stranded-master scan,
automatic restarts, pruning, schedule firing, putting back lost launch requests) runs on the one
node that holds its lease, never on every node. A thousand nodes that each swept every interval
sent a sweep every few milliseconds over the node rows their heartbeats update; now one does.

A lease is a row of ``batch_leases`` (:mod:`dbcluster.dialects.leases`), judged by the database
clock:

- its holder renews it every ``heartbeat_interval``, with a guarded UPDATE (one for all the
  leases it holds) that changes a row only while this node still holds it and it has not
  lapsed (a fence: a holder that was silent past its term, or removed, must take it again like
  anyone). Where the database can send them together (PostgreSQL: one more data-modifying CTE
  of the heartbeat's statement; MySQL and MariaDB: the heartbeat's UPDATE joined to the lease
  rows), the heartbeat carries that renewal in its own round trip
  (:meth:`Leases.leases_to_renew`, :meth:`Leases.renewal_carried`) and this service renews
  on its own only when no heartbeat did for ``heartbeat_interval`` plus a grace (half of the
  rest of the term); elsewhere it renews every ``heartbeat_interval`` itself. Either way a
  lease is held until its renewal's send time plus the term, and one whose renewal did not
  land is given up at once;
- it lapses ``unreachable_threshold`` after its last renewal (a holder is trusted exactly as
  long as a node is: it lapses as its silent holder turns UNREACHABLE), or as soon as its holder
  is no longer a registered node (it left, or was removed);
- every node that wants it and does not hold it reads the leases (one read for all of them)
  and takes a lapsed one with a guarded UPDATE that exactly one taker wins. Where the database
  can send them together (a data-modifying CTE on PostgreSQL, a multi-statement request on
  MySQL and MariaDB), the heartbeat carries that read, every ``heartbeat_interval``, in its
  own round trip (:meth:`Leases.lease_term_to_read`, :meth:`Leases.leases_seen`): the look
  costs no round trip of its own and a lapse found wakes the service to take it at once.
  Elsewhere, or when no heartbeat brought the leases within ``sweep_interval`` (the worker's
  poll carried the heartbeat instead), the service reads them itself every
  ``sweep_interval``. Either way a lapsed lease is taken within one ``sweep_interval``, and
  its new holder runs the lease's services at once. A dead holder is then marked UNREACHABLE
  by its successor at ``unreachable_threshold`` plus at most one ``sweep_interval``, the bound
  a single sweeper always had.

A holder renews a lease only while the services it holds it for keep up: once one of them has
not done its work for a term past its turn's due time (its turns keep failing, or one hangs:
:meth:`Service.behind`), the holder gives the lease up instead of renewing it and leaves it to
the other nodes for a term, so a node whose sweeps fail does not keep the lease, and the
cluster's sweeps, for as long as it lives. Another node then takes it within the usual bound
(at most ``heartbeat_interval`` after the term, plus one ``sweep_interval``). A healthy holder
never gives up: its services' turns end well inside their interval. A database outage fails
every node's turns alike; a holder that gives up after one changes nothing but who holds the
lease (the lease is guarded, and the outage stops renewals anyway).

A node acts for a lease only while it holds it by its own clock too: until ``term`` after it
sent its last renewal that landed (the database set ``renewed_at`` no earlier), so normally
no two nodes act at once. Correctness never depends on it: a holder frozen after its check that
wakes after another took over runs the same guarded statements every maintenance action always
ran (a removal changes only rows still to remove, a tick's fire row has a primary key, a
stranded job's claim moves its epoch), which is what two holders at once would do.

Only the maintenance is leased. What a node does for itself stays on every node: its heartbeat,
its polls and claims, its stop requests, its own unfinished recoveries, fencing itself.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from dbcluster.cluster.identity import Identity
from dbcluster.cluster.patience import is_connectivity_error
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore, LeaseRow
from dbcluster.retry import brief

log = logging.getLogger("dbcluster.node")

#: The sweeps (mark UNREACHABLE, remove) and putting back the launch requests of removed nodes.
SWEEP = "sweep"
#: Pruning (``prune_after``); a long prune checks between its transactions that it still holds it.
PRUNE = "prune"


def named_for(kind: str, names: Iterable[str]) -> str:
    """The lease of ``kind`` for nodes that know exactly ``names`` (their registry's jobs, or
    schedules): nodes of one application share it, nodes of another hold their own (a job only
    a node of its application can take over, a schedule only its registry fires)."""
    digest = hashlib.sha1("\n".join(sorted(set(names))).encode()).hexdigest()[:12]
    return f"{kind}:{digest}"


class Leases(Service):
    """The node's leases: :meth:`want` a lease before the node starts; the service then keeps
    it (renewing what it holds, taking what lapsed) and gives it up when the node stops."""

    name = "leases"

    def __init__(
        self,
        store: CoordinationStore,
        settings: ClusterSettings,
        usable_identity: Callable[[], Identity | None],
    ) -> None:
        super().__init__(settings.sweep_interval)
        self.store = store
        self.usable_identity = usable_identity
        #: A holder silent this long loses the lease (database clock).
        self.term_ms = settings.unreachable_threshold
        #: How often the holder renews (well inside the term).
        self.renew_ms = settings.heartbeat_interval
        #: How late past ``renew_ms`` a renewal carried by the heartbeat may come before this
        #: service renews on its own: half of what is left of the term (a heartbeat late by
        #: a stalled machine's moment leaves it to the heartbeat; one stuck, to this service,
        #: well before the lease lapses).
        self.grace_ms = (self.term_ms - self.renew_ms) // 2
        #: How often a node that holds none of its leases looks for a lapsed one.
        self.check_ms = settings.sweep_interval
        #: Lease name -> the services that act for it (woken when it is taken; it is renewed
        #: only while they keep up).
        self._wanted: dict[str, list[Service]] = {}
        #: Lease name -> (the identity holding it, monotonic time until which it does).
        self._held: dict[str, tuple[Identity, float]] = {}
        #: Lease name -> when this node took it (monotonic): its services are judged from then.
        self._taken: dict[str, float] = {}
        #: Lease name -> monotonic time before which this node does not take it again (it
        #: stepped down).
        self._resting: dict[str, float] = {}
        #: The leases as a heartbeat last brought them: (monotonic time, node id, rows).
        self._seen: tuple[float, str, Mapping[str, LeaseRow]] | None = None
        #: The heartbeat's last renewal: (node id, monotonic time it was sent).
        self._carried: tuple[str, float] | None = None
        self._lock = threading.Lock()

    def want(self, name: str, service: Service | None = None) -> None:
        """Contend for lease ``name`` (before the node starts) for ``service``: it is woken each
        time this node takes the lease (it acts at once), and the lease is renewed only while
        it keeps up (see the module doc)."""
        services = self._wanted.setdefault(name, [])
        if service is not None:
            services.append(service)

    def acting(self, name: str) -> Callable[[], Identity | None]:
        """What a service leased by ``name`` acts under: the node's usable identity while it
        holds the lease, else None."""
        return lambda: self.holding(name)

    def holding(self, name: str) -> Identity | None:
        """The identity under which this node holds lease ``name`` now, or None."""
        identity = self.usable_identity()
        held = self._held.get(name)
        if identity is None or held is None or held[0] is not identity:
            return None
        return identity if time.monotonic() < held[1] else None

    def step_down(self, name: str, why: str = "") -> None:
        """Give lease ``name`` up now and leave it to the other nodes for one term: its holder
        met work it must not do itself (a stranded job an earlier identity of this node is
        still taking over), or its services do not keep up (``why``), and another node then
        does the work."""
        with self._lock:
            held = self._held.pop(name, None)
            self._resting[name] = time.monotonic() + self.term_ms / 1000
        if held is None:
            return
        if why:
            log.warning("node %s gives the %s lease up for a while: %s", held[0].node_id, name, why)
        else:
            log.info("node %s gives the %s lease up for a while", held[0].node_id, name)
        try:
            self.store.release_lease(name, held[0].node_id)
        except Exception as exc:  # noqa: BLE001 - it lapses after its term instead
            _not_given_up(held[0].node_id, name, exc)

    def _missing(self) -> list[str]:
        """The leases this node wants, does not hold and may take now."""
        now = time.monotonic()
        return [
            name
            for name in self._wanted
            if name not in self._held and self._resting.get(name, 0.0) <= now
        ]

    # --- the heartbeat's hooks (a heartbeat carries the read) ------------------------------------

    def lease_term_to_read(self, node_id: str) -> int | None:
        """The term to judge the leases by, while the node under ``node_id`` wants a lease it
        does not hold (the heartbeat then reads them in its round trip); else None."""
        identity = self.usable_identity()
        if identity is None or identity.node_id != node_id or not self._missing():
            return None
        return self.term_ms

    def leases_seen(self, node_id: str, rows: Mapping[str, LeaseRow]) -> None:
        """A heartbeat under ``node_id`` read the leases just now: the service's next look uses
        them instead of a read of its own, and comes at once when one it wants may be taken."""
        self._seen = (time.monotonic(), node_id, rows)
        for name in self._missing():
            row = rows.get(name)
            if row is None or row.lapsed or row.holder == node_id:
                self.wake()
                return

    def leases_to_renew(self, node_id: str) -> tuple[list[str], int] | None:
        """The leases this node holds under ``node_id`` and the term they are judged by (the
        heartbeat renews them in its round trip, where the database can); None when it holds
        none (or ``node_id`` is not the identity it acts under)."""
        identity = self.usable_identity()
        if identity is None or identity.node_id != node_id:
            return None
        if self.behind() * 1000 > self.renew_ms + self.grace_ms:
            # This service has stopped keeping up (it hangs): the heartbeat renews nothing for
            # it, so what it holds lapses after the term, as it would without the heartbeat.
            return None
        with self._lock:
            names = sorted(n for n, held in self._held.items() if held[0] is identity)
        # Nor a lease whose services do not keep up (this service gives it up at its turn).
        names = [name for name in names if self._lagging(name) is None]
        return (names, self.term_ms) if names else None

    def renewal_carried(
        self, node_id: str, names: Sequence[str], sent: float, renewed: Sequence[str]
    ) -> None:
        """A heartbeat under ``node_id`` sent at ``sent`` (``time.monotonic()``) renewed those of
        ``names`` in ``renewed``: each is held until ``sent`` plus the term; the others did not
        land and are given up here at once (the service then looks for them again)."""
        self._carried = (node_id, sent)
        if self._settle(node_id, names, sent, renewed):
            self.wake()

    def _settle(
        self, node_id: str, names: Sequence[str], sent: float, renewed: Sequence[str]
    ) -> list[str]:
        """After a renewal under ``node_id`` sent at ``sent``: those of ``names`` in ``renewed``
        are held until ``sent`` plus the term, the others are dropped; the names dropped."""
        until = sent + self.term_ms / 1000
        lost: list[str] = []
        with self._lock:
            for name in names:
                held = self._held.get(name)
                if held is None or held[0].node_id != node_id:
                    continue  # given up, or held under another identity, meanwhile
                if name in renewed:
                    self._held[name] = (held[0], max(held[1], until))
                else:
                    del self._held[name]
                    lost.append(name)
        for name in lost:
            log.info("node %s lost the %s lease", node_id, name)
        return lost

    def _rows(self, identity: Identity) -> Mapping[str, LeaseRow]:
        """The leases as a heartbeat of ``identity`` brought them within ``sweep_interval``,
        else as a read of their own finds them."""
        seen = self._seen
        if (
            seen is not None
            and seen[1] == identity.node_id
            and time.monotonic() - seen[0] <= self.check_ms / 1000
        ):
            self._seen = None  # used once: a take changes them
            return seen[2]
        return self.store.leases(self.term_ms)

    def held(self) -> list[str]:
        """The leases this node holds now."""
        return sorted(name for name in self._wanted if self.holding(name) is not None)

    def run_once(self) -> None:
        identity = self.usable_identity()
        if identity is None:
            # A fenced or leaving identity acts no more: what it held is given up now (each
            # release is guarded by the holder's id), so another node takes it at its next look
            # rather than after the term; a release that fails lapses after the term instead.
            self._release_held()
            self.interval_ms = self.check_ms
            return
        renew_ms = self._renew(identity)
        missing = self._missing()
        if missing:
            self._take(identity, missing)
        if not self._held:
            self.interval_ms = self.check_ms
        else:
            self.interval_ms = min(renew_ms, self.renew_ms) if missing else renew_ms

    def _lagging(self, name: str) -> str | None:
        """Why this node must not renew lease ``name`` (a service of it has not done its work
        for a term past its due time, judged from when the node took the lease), or None."""
        term_s = self.term_ms / 1000
        held_for = time.monotonic() - self._taken.get(name, 0.0)
        for service in self._wanted.get(name, ()):
            behind = min(service.behind(), held_for - service.interval_ms / 1000)
            if behind > term_s:
                return f"its {service.name} service has done no work for {behind:.1f} s past due"
        return None

    def _renew(self, identity: Identity) -> int:
        """Renew every lease held, in one statement (a read more when one was lost), unless the
        heartbeat renews them (it renewed them lately); a lease whose services do not keep up is
        given up instead, whoever renews. How long until the next renewal is due (ms)."""
        with self._lock:
            # Held under an earlier identity of this node: it lapses once that id is gone.
            self._held = {n: h for n, h in self._held.items() if h[0] is identity}
            names = sorted(self._held)
        for name in names:
            why = self._lagging(name)
            if why is not None:
                self.step_down(name, why)
        with self._lock:
            names = sorted(self._held)
        if not names:
            return self.renew_ms
        me = identity.node_id
        carried = self._carried
        if carried is not None and carried[0] == me:
            # The heartbeat renews them: this service does only when the heartbeat's renewal
            # is late past the grace (a heartbeat stuck, or one that carried none).
            late_s = carried[1] + (self.renew_ms + self.grace_ms) / 1000 - time.monotonic()
            if late_s > 0:
                return max(1, round(late_s * 1000))
        sent = time.monotonic()
        kept = names
        if self.store.renew_leases(names, me, self.term_ms) != len(names):
            # Which were renewed: those still this node's and not lapsed.
            kept = self.store.still_held(names, me, self.term_ms)
        self._settle(me, names, sent, kept)
        return self.renew_ms

    def _take(self, identity: Identity, names: list[str]) -> None:
        me = identity.node_id
        rows = self._rows(identity)
        for name in names:
            row = rows.get(name)
            if row is not None and not row.lapsed and row.holder != me:
                continue
            sent = time.monotonic()
            if row is not None and not row.lapsed:
                # This node holds it already (a take whose answer was lost): renew it.
                took = self.store.renew_leases([name], me, self.term_ms) == 1
            else:
                took = self.store.take_lease(name, me, self.term_ms, exists=row is not None)
            if not took:
                continue
            with self._lock:
                self._held[name] = (identity, sent + self.term_ms / 1000)
                self._taken[name] = sent
            was = "" if row is None or row.holder == me else f" from {row.holder}"
            log.info("node %s holds the %s lease%s", me, name, was)
            for service in self._wanted[name]:
                service.wake()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop, and give up what this node holds, so that another node takes it at its next
        look rather than after the term."""
        super().stop(timeout)
        self._release_held()

    def _release_held(self) -> None:
        """Give up every lease held (each delete guarded by the holder's id)."""
        with self._lock:
            held, self._held = self._held, {}
        for name, (identity, _) in held.items():
            try:
                self.store.release_lease(name, identity.node_id)
            except Exception as exc:  # noqa: BLE001 - it lapses after its term instead
                _not_given_up(identity.node_id, name, exc)


def _not_given_up(node_id: str, name: str, error: BaseException) -> None:
    """A release that failed: the lease lapses after its term instead. The database away (a
    fenced node gives its leases up in the outage that fenced it) is INFO, in one line: the
    outage has its WARNING from each service; anything else is a WARNING."""
    level = logging.INFO if is_connectivity_error(error) else logging.WARNING
    log.log(level, "node %s could not give up the %s lease: %s", node_id, name, brief(error))
