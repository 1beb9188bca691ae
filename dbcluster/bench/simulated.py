"""The simulated nodes of ``bench ceiling``: many nodes per process, not a thread each.

Each node is a small state machine (:class:`SimulatedNode`) with a connection of its own
(configured like a node's autocommit connection, on engines and a store that the nodes of its
process share: :mod:`dbcluster.bench.connections`) that issues the real coordination statements
through :class:`~dbcluster.cluster.store.CoordinationStore`, at a node's
cadence (:class:`Cadence`): the heartbeat every ``heartbeat_interval``, carrying the idle poll
where the database sends both in one round trip; the poll every ``task_polling_interval``, or
every ``wakeup_poll_interval`` where wake-ups arrive (PostgreSQL: the nodes are taken to listen
healthily; their listening connections are not opened), carrying the heartbeat when that is due
before the next poll; and the maintenance (sweeps, stranded-master scans) on every node or on one
(the lease holder's, node 0 of the first process). Where one node maintains, the others do what
a real node that holds no lease does: they read the leases, in their heartbeat's round trip
where the database sends them together (``CoordinationStore.beat_reading_leases``), else every
``sweep_interval`` on their own; the holder renews its lease every ``heartbeat_interval``.

A :class:`Scheduler` runs the due work of every node of the process on a fixed pool of threads
(``threads``), one call of a node at a time, from a heap of due times: a thousand nodes cost a
heap entry each, not a thread. How late a call starts against its due time (``lag``) is the
generator's own delay: with the pool's every thread busy and the lag growing, the generator (its
CPU or its threads), not the database, is the limit.
"""

from __future__ import annotations

import heapq
import itertools
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from dbcluster.bench.connections import NodeEngines, as_node
from dbcluster.cluster.maintenance.leases import SWEEP
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore
from dbcluster.cluster.worker import CARRY_MARGIN_S
from dbcluster.dialects import get_provider

#: Maintenance modes: ``every`` node sweeps and scans (as nodes without leased maintenance do),
#: or ``one`` node (the lease holder) does for all.
MAINTENANCE = ("every", "one")


@dataclass(frozen=True)
class Cadence:
    """What a simulated node sends, and how often (milliseconds)."""

    heartbeat_ms: int
    #: The idle poll of its own (the fallback where wake-ups arrive).
    poll_ms: int
    #: A heartbeat and a poll go as one round trip (``CoordinationStore.beat_and_poll``).
    together: bool
    #: The node's maintenance: (name, interval) of each (``renew``: the holder renews its
    #: lease; ``lease_read``: a node that holds none reads the leases on its own).
    maintenance: tuple[tuple[str, int], ...]
    #: The heartbeat carries the lease read (a node that holds no lease, where the database
    #: sends them together: ``CoordinationStore.beat_reading_leases``).
    carries_leases: bool = False

    @classmethod
    def of(
        cls,
        settings: ClusterSettings,
        engine: Engine,
        maintains: bool,
        listening: bool = True,
        leased: bool = False,
    ) -> Cadence:
        """A node's cadence on ``engine``'s database (``maintains``: it sweeps and scans;
        ``listening``: its wake-ups arrive, where the database has them; ``leased``: one node
        maintains for all, under the lease, which this one holds when it ``maintains`` and
        otherwise looks for lapsed)."""
        provider = get_provider(engine)
        listening = listening and provider.supports_listen_notify
        poll_ms = settings.task_polling_interval
        if listening:
            poll_ms = max(poll_ms, settings.wakeup_poll_interval)
        together = provider.supports_autocommit and (
            provider.heartbeat_and_poll("n", 0, 1, None, 1) is not None
            or provider.supports_statement_pairs
            and provider.read_then_write(
                provider.select_claimable("n", 1, None, 1),
                provider.heartbeat("n", 0),
                engine.dialect,
            )
            is not None
        )
        maintenance: tuple[tuple[str, int], ...] = (
            (
                ("sweep", settings.sweep_interval),
                ("stranded_scan", settings.stranded_master_scan_interval),
            )
            if maintains
            else ()
        )
        carries = False
        if leased and maintains:
            maintenance += (("renew", settings.heartbeat_interval),)
        elif leased:
            carries = provider.supports_autocommit and _carries_leases(provider, engine)
            if not carries:
                maintenance = (("lease_read", settings.sweep_interval),)
        return cls(settings.heartbeat_interval, poll_ms, bool(together), maintenance, carries)


def _carries_leases(provider: Any, engine: Engine) -> bool:
    """Whether a heartbeat can carry the lease read (and the poll) on this database."""
    for limit in (None, 1):
        read = provider.poll_and_leases("n", limit, None, 1, 1)
        if provider.heartbeat_and_read("n", 0, read) is not None:
            continue
        if not provider.supports_statement_pairs:
            return False
        if provider.read_then_write(read, provider.heartbeat("n", 0), engine.dialect) is None:
            return False
    return True


@dataclass
class SimulatedNode:
    """One node: its connection (on the engines of its process, ``shared``, else of its own),
    its due times and what it did (call starts and durations)."""

    index: int
    url: str
    settings: ClusterSettings
    #: Connections without session settings and without server-side prepared statements (to
    #: reach PostgreSQL through PgBouncer in transaction mode, which carries neither).
    plain: bool = False
    #: The engines and stores of the process's nodes (None: the node makes its own).
    shared: NodeEngines | None = None
    #: Per call name: (wall-clock start, milliseconds, lag in milliseconds).
    calls: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: When a heartbeat found the node's row gone (declared dead while alive: ``time.time()``);
    #: it then joins again under a new id, as a real node does.
    fenced: list[float] = field(default_factory=list)
    joined: bool = False
    store: CoordinationStore | None = None
    cadence: Cadence | None = None
    node_id: str = ""
    due: dict[str, float] = field(default_factory=dict)
    _own: NodeEngines | None = None

    def join(self, cadence: Cadence) -> None:
        """Connect (an autocommit connection for single statements; a node with maintenance of
        its own also a transactional one) and register."""
        engines = self.shared
        if engines is None:
            engines = self._own = NodeEngines(self.url, self.settings, self.plain)
        self.store = engines.store(bool(cadence.maintenance))
        self.cadence = cadence
        with as_node(self.index):
            self._register()
            if any(name == "renew" for name, _ in cadence.maintenance):
                self._take_lease()
        self.joined = True

    def _take_lease(self) -> None:
        """The holder takes the sweep lease (lapsed, or never taken) before the nodes start."""
        assert self.store is not None
        term = self.settings.unreachable_threshold
        row = self.store.leases(term).get(SWEEP)
        if row is None or row.lapsed:
            self.store.take_lease(SWEEP, self.node_id, term, exists=row is not None)

    def _register(self) -> None:
        assert self.store is not None
        self.node_id = f"ceiling{self.index}-{uuid.uuid4().hex}"
        self.store.register(self.node_id, socket.gethostname(), self.settings.concurrency_limit)

    def start(self, now: float) -> None:
        """Due times from random phases, as nodes started at different moments."""
        c = self.cadence
        assert c is not None
        intervals = [("heartbeat", c.heartbeat_ms), ("poll", c.poll_ms), *c.maintenance]
        for name, ms in intervals:
            self.due[name] = now + random.uniform(0, ms / 1000)
            self.calls[name] = []

    def next_due(self) -> float:
        return min(self.due.values())

    def run_due(self, now: float) -> None:
        """The call due first (the heartbeat and the poll together where they coincide)."""
        with as_node(self.index):
            self._run_due(now)

    def _run_due(self, now: float) -> None:
        name = min(self.due, key=self.due.__getitem__)
        lag_ms = max(0.0, now - self.due[name]) * 1000
        c = self.cadence
        assert c is not None and self.store is not None
        s = self.settings
        started, wall = time.monotonic(), time.time()
        together: tuple[str, ...] = (name,)
        try:
            if name == "heartbeat" and c.together:
                together = ("heartbeat", "poll")  # the heartbeat carries the idle poll
            elif name == "poll" and c.together:
                margin = min(c.poll_ms / 2000, CARRY_MARGIN_S)
                if self.due["heartbeat"] - started <= c.poll_ms / 1000 + margin:
                    together = ("poll", "heartbeat")  # the poll carries the heartbeat
            if "heartbeat" in together and c.carries_leases:
                carried = self.store.beat_reading_leases(
                    self.node_id,
                    0,
                    2 * s.concurrency_limit if len(together) == 2 else None,
                    s.unreachable_threshold,
                    steal_after_ms=s.work_stealing_delay,
                    unreachable_ms=s.unreachable_threshold,
                )
                assert carried is not None
                if not carried[0]:
                    self._fenced()
            elif len(together) == 2:
                both = self.store.beat_and_poll(
                    self.node_id,
                    0,
                    2 * s.concurrency_limit,
                    steal_after_ms=s.work_stealing_delay,
                    unreachable_ms=s.unreachable_threshold,
                )
                assert both is not None
                if not both[0]:
                    self._fenced()
            elif name == "heartbeat":
                if not self.store.heartbeat(self.node_id, 0):
                    self._fenced()
            elif name == "poll":
                self.store.poll(
                    self.node_id,
                    2 * s.concurrency_limit,
                    steal_after_ms=s.work_stealing_delay,
                    unreachable_ms=s.unreachable_threshold,
                )
            elif name == "sweep":
                self.store.sweep(s.unreachable_threshold, s.cleanup_threshold)
            elif name == "stranded_scan":
                self.store.stranded_jobs()
            elif name == "renew":
                self.store.renew_leases([SWEEP], self.node_id, s.unreachable_threshold)
            elif name == "lease_read":
                self.store.leases(s.unreachable_threshold)
        except Exception as exc:  # noqa: BLE001 - counted and reported, the node goes on
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}".splitlines()[0])
        ended = time.monotonic()
        ms = (ended - started) * 1000
        intervals = {"heartbeat": c.heartbeat_ms, "poll": c.poll_ms, **dict(c.maintenance)}
        for done in together:
            self.calls[done].append((wall, ms, lag_ms))
            self.due[done] = ended + intervals[done] / 1000

    def _fenced(self) -> None:
        self.fenced.append(time.time())
        self._register()

    def beat(self) -> None:
        """One heartbeat now (the last thing before the nodes start: none is found silent for
        how long the others took to connect)."""
        assert self.store is not None
        with as_node(self.index):
            if not self.store.heartbeat(self.node_id, 0):
                self._fenced()

    def deregister(self) -> None:
        """Leave the cluster (the node's row goes)."""
        if self.store is not None and self.node_id:
            with as_node(self.index):
                self.store.deregister(self.node_id)

    def close(self) -> None:
        """Close the node's connections."""
        if self._own is not None:
            self._own.dispose()
        elif self.shared is not None:
            self.shared.release(self.index)


class Scheduler:
    """Runs the due calls of ``nodes`` on ``threads`` threads (see the module doc)."""

    def __init__(self, nodes: list[SimulatedNode], threads: int) -> None:
        self.nodes = nodes
        self.threads = threads
        self._heap: list[tuple[float, int, SimulatedNode]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        #: Seconds the pool's threads spent running calls (their busy time, summed).
        self.busy_s = 0.0
        self._busy_lock = threading.Lock()

    def start(self) -> None:
        now = time.monotonic()
        for node in self.nodes:
            node.start(now)
            heapq.heappush(self._heap, (node.next_due(), next(self._order), node))
        for k in range(self.threads):
            thread = threading.Thread(target=self._work, name=f"ceiling-{k}", daemon=True)
            thread.start()
            self._workers.append(thread)

    def _take(self) -> SimulatedNode | None:
        with self._ready:
            while not self._stop.is_set():
                if self._heap:
                    due = self._heap[0][0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        return heapq.heappop(self._heap)[2]
                    self._ready.wait(min(wait, 0.5))
                else:
                    self._ready.wait(0.5)
            return None

    def _work(self) -> None:
        while True:
            node = self._take()
            if node is None:
                return
            began = time.monotonic()
            node.run_due(began)
            with self._busy_lock:
                self.busy_s += time.monotonic() - began
            with self._ready:
                heapq.heappush(self._heap, (node.next_due(), next(self._order), node))
                self._ready.notify()

    def stop(self, timeout: float = 20.0) -> None:
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))


def join_all(
    nodes: list[tuple[SimulatedNode, Cadence]], at_once: int, stop: Callable[[], bool]
) -> list[SimulatedNode]:
    """Connect and register ``nodes``, ``at_once`` at a time (a start-up storm of thousands of
    connections would measure the server's connection handling); those that joined."""
    pending = list(nodes)
    lock = threading.Lock()

    def work() -> None:
        while not stop():
            with lock:
                if not pending:
                    return
                node, cadence = pending.pop()
            try:
                node.join(cadence)
            except Exception as exc:  # noqa: BLE001 - a node that cannot join is reported
                node.errors.append(f"register: {type(exc).__name__}: {exc}".splitlines()[0])
                node.close()

    def run(target: Callable[[], None]) -> None:
        workers = [threading.Thread(target=target, daemon=True) for _ in range(at_once)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()

    run(work)
    joined = [node for node, _ in nodes if node.joined]
    pending = [(node, cadence) for node, cadence in nodes if node.joined]

    def beat() -> None:
        while not stop():
            with lock:
                if not pending:
                    return
                node, _ = pending.pop()
            try:
                node.beat()
            except Exception as exc:  # noqa: BLE001 - reported; its first turn beats again
                node.errors.append(f"heartbeat: {type(exc).__name__}: {exc}".splitlines()[0])

    run(beat)
    return joined


def runqueue_wait_s() -> float | None:
    """Seconds this process's threads have waited for a CPU so far (Linux schedstat; None
    elsewhere): when it grows as fast as the clock, the machine, not the generator's code, held
    the generator back."""
    import os

    total = 0.0
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
    return total


def summary(nodes: list[SimulatedNode]) -> dict[str, Any]:
    """What a process hands back: every call (start, ms, lag) by name, the heartbeat and poll
    starts per node, errors, fences."""
    calls: dict[str, list[tuple[float, float, float]]] = {}
    for node in nodes:
        for name, made in list(node.calls.items()):
            calls.setdefault(name, []).extend(list(made))
    return {
        "calls": calls,
        "gaps": {
            name: [[c[0] for c in list(node.calls.get(name, []))] for node in nodes]
            for name in ("heartbeat", "poll")
        },
        "errors": [e for node in nodes for e in list(node.errors)],
        "fenced": [at for node in nodes for at in node.fenced],
    }
