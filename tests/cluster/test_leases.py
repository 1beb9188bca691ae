"""Leased maintenance on a live database (in-process nodes): one node at a time holds the sweep
lease and only it sweeps; a lapsed lease is taken within one interval; a holder frozen after its
check that wakes once another took over changes nothing twice; a node that leaves gives its
lease up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from dbcluster import points
from dbcluster.batch.registry import JobRegistry
from dbcluster.cluster.maintenance.leases import SWEEP
from dbcluster.cluster.membership import Heartbeat
from dbcluster.cluster.node import Node
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore
from dbcluster.testing.app import FAST_SETTINGS, TIME_SCALE
from dbcluster.testing.backends import Backend
from dbcluster.testing.waiting import wait_for

BACKENDS = pytest.mark.backends("sqlite", "postgresql", "mariadb")
#: The interval a node that holds no lease looks for a lapsed one at (``sweep_interval``).
INTERVAL_MS = 400
SETTINGS = FAST_SETTINGS.with_overrides(sweep_interval=INTERVAL_MS)
#: What a loaded machine may add to an interval: a read and an UPDATE, a thread's wake-up.
SLACK_S = 0.5 * TIME_SCALE


class Sweeps:
    """Every sweep a node makes: (node index, what it marked, what it removed)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.lock = threading.Lock()

    def watch(self, index: int, node: Node) -> None:
        sweep = node.store.sweep

        def counted(unreachable_ms: int, cleanup_ms: int) -> tuple[int, int]:
            marked, removed = sweep(unreachable_ms, cleanup_ms)
            with self.lock:
                self.calls.append((index, marked, removed))
            return marked, removed

        node.store.sweep = counted  # type: ignore[method-assign]

    def by(self, index: int) -> list[tuple[int, int, int]]:
        with self.lock:
            return [c for c in self.calls if c[0] == index]


@contextmanager
def nodes(
    backend: Backend, count: int, sweeps: Sweeps | None = None, settings: ClusterSettings = SETTINGS
) -> Iterator[list[Node]]:
    started: list[Node] = []
    try:
        for index in range(count):
            node = Node(backend.engine, None, settings, capacity=0)
            if sweeps is not None:
                sweeps.watch(index, node)
            started.append(node.start())
        yield started
    finally:
        for node in started:
            node.stop(drain_timeout_ms=1000)


def holder(backend: Backend) -> tuple[str, bool] | None:
    """The sweep lease's holder and whether it lapsed, as the database judges."""
    row = CoordinationStore(backend.engine).leases(SETTINGS.unreachable_threshold).get(SWEEP)
    return None if row is None else (row.holder, row.lapsed)


def holders(started: list[Node]) -> list[int]:
    """The nodes that act as the sweep lease's holder now (by their own clocks)."""
    return [i for i, node in enumerate(started) if node.leases.holding(SWEEP) is not None]


@contextmanager
def frozen(node: Node, service: str) -> Iterator[Callable[[], None]]:
    """Stop ``service`` of ``node`` at the top of its next turn until released (or the end)."""
    thaw = threading.Event()
    target = node.services.get(service)
    assert target is not None
    target.gate = lambda: thaw.wait()
    try:
        yield thaw.set
    finally:
        thaw.set()
        target.gate = None


@contextmanager
def renewals_stopped(node: Node) -> Iterator[Callable[[], None]]:
    """Nothing of ``node`` renews its leases until released (or the end): its lease service is
    frozen and its heartbeat carries no renewal (nor any lease read)."""
    heartbeat = node.services.get("heartbeat")
    assert isinstance(heartbeat, Heartbeat)
    rider = heartbeat.leases
    with frozen(node, "leases") as thaw:
        heartbeat.leases = None

        def release() -> None:
            heartbeat.leases = rider
            thaw()

        try:
            yield release
        finally:
            heartbeat.leases = rider


@BACKENDS
def test_one_holder_at_a_time_and_only_it_sweeps(backend: Backend) -> None:
    sweeps = Sweeps()
    with nodes(backend, 4, sweeps) as started:
        wait_for(lambda: holders(started), 10, "a node to take the sweep lease")
        first = holders(started)
        assert len(first) == 1
        (index,) = first
        wait_for(lambda: len(sweeps.by(index)) >= 5, 10, "the holder to sweep")
        # For ten intervals of everybody's services: still one holder, the same (it renews),
        # and no other node sweeps.
        deadline = time.monotonic() + 10 * INTERVAL_MS / 1000
        while time.monotonic() < deadline:
            assert holders(started) == [index]
            time.sleep(0.02)
        assert holder(backend) == (started[index].node_id, False)
        swept_by = {c[0] for c in sweeps.calls}
        assert swept_by == {index}, f"sweeps by nodes {sorted(swept_by)}, holder {index}"


@BACKENDS
def test_a_lapsed_lease_is_taken_within_one_interval(backend: Backend) -> None:
    with nodes(backend, 3) as started:
        wait_for(lambda: holders(started), 10, "a node to take the sweep lease")
        (index,) = holders(started)
        old = started[index].node_id
        with renewals_stopped(started[index]) as thaw:
            # Its heartbeat goes on (it is alive); its lease is not renewed.
            # Lapsed, or already taken (a taker may look a moment after the lapse, between two
            # of these reads).
            wait_for(
                lambda: (h := holder(backend)) is not None and (h[1] or h[0] != old),
                30,
                "the lease to lapse",
            )
            lapsed_at = time.monotonic()
            found = wait_for(
                lambda: (h := holder(backend)) is not None and h[0] != old and not h[1],
                INTERVAL_MS / 1000 + SLACK_S,
                "another node to take the lapsed lease within one interval",
            )
            taken_s = time.monotonic() - lapsed_at
            assert found
            # By its own clock the frozen holder stopped acting before the lease lapsed.
            assert started[index].leases.holding(SWEEP) is None
            thaw()
            # Awake again, its renewal is refused (the lease is another's now): one holder.
            new = holder(backend)
            assert new is not None
            wait_for(
                lambda: (
                    holders(started) == [i for i, n in enumerate(started) if n.node_id == new[0]]
                ),
                10,
                "exactly the new holder to act",
            )
        assert taken_s <= INTERVAL_MS / 1000 + SLACK_S


@BACKENDS
def test_a_holder_whose_lease_service_hangs_loses_the_lease_though_its_heartbeat_goes_on(
    backend: Backend,
) -> None:
    """Where the heartbeat carries the holder's renewal, it stops carrying it once the lease
    service stops keeping up (a hung thread): the lease lapses and another node takes it, as
    it did when only that service renewed. (Carried regardless, a holder whose lease service
    hung kept its lease, and the cluster's maintenance with it, for as long as it beat.)"""
    settings = SETTINGS
    with nodes(backend, 2) as started:
        wait_for(lambda: holders(started), 10, "a node to take the sweep lease")
        (index,) = holders(started)
        old = started[index].node_id
        leases = started[index].leases
        # The longest the heartbeat goes on renewing for a service that stopped, then the term.
        bound_s = (
            leases.renew_ms + leases.grace_ms + settings.unreachable_threshold + INTERVAL_MS
        ) / 1000 + SLACK_S
        with frozen(started[index], "leases"):
            wait_for(
                lambda: (h := holder(backend)) is not None and h[0] != old and not h[1],
                bound_s + settings.heartbeat_interval / 1000,
                "another node to take the lease of the hung service",
            )


@BACKENDS
def test_a_holder_that_wakes_after_losing_its_lease_removes_nobody_twice(backend: Backend) -> None:
    """The holder is frozen after its lease check, about to sweep; another node takes the lapsed
    lease and removes a dead node; the old holder wakes and sweeps: its guarded statements find
    nothing left to do."""
    sweeps = Sweeps()
    with nodes(backend, 1, sweeps) as (first,):
        wait_for(lambda: first.leases.holding(SWEEP), 10, "the first node to take the lease")
        me = first.node_id
        with (
            renewals_stopped(first),
            points.parked(
                "maintenance.leased", lambda service, node_id: service == "sweep" and node_id == me
            ) as parking,
        ):
            parking.wait(1, timeout=10)
            with sweeps.lock:
                sweeps.calls.clear()  # its sweeps before it froze
            CoordinationStore(backend.engine).register("dead-node", "nowhere", 1)
            with nodes(backend, 1, settings=SETTINGS) as (second,):
                # The second takes the lease once it lapses, then marks and removes the dead node.
                wait_for(lambda: second.leases.holding(SWEEP), 30, "the second to take the lease")
                wait_for(lambda: not _registered(backend, "dead-node"), 30, "the removal")
                parking.release()
                wait_for(lambda: sweeps.by(0), 10, "the woken holder's sweep")
        assert sweeps.by(0)[0][1:] == (0, 0), "the woken holder marked or removed a node"


def _registered(backend: Backend, node_id: str) -> bool:
    return any(n.node_id == node_id for n in CoordinationStore(backend.engine).nodes(None))


@BACKENDS
def test_a_node_that_leaves_gives_its_lease_up(backend: Backend) -> None:
    with nodes(backend, 2) as started:
        wait_for(lambda: holders(started), 10, "a node to take the sweep lease")
        (index,) = holders(started)
        other = started[1 - index]
        began = time.monotonic()
        started[index].stop(drain_timeout_ms=1000)
        # Not after the term (the lease's row went): at the other's next look.
        wait_for(
            lambda: other.leases.holding(SWEEP),
            INTERVAL_MS / 1000 + SLACK_S,
            "the other node to take the lease",
        )
        assert time.monotonic() - began < SETTINGS.unreachable_threshold / 1000


@BACKENDS
def test_a_holder_gives_its_lease_up_when_its_drain_begins(backend: Backend) -> None:
    """A leaving holder gives its leases up as soon as it stops acting, not at the end of its
    drain: a rolling restart must not leave the cluster without sweeps for the drain's length
    (the lease service forgot what it held when its node began to leave, so the stop had
    nothing left to give up, and the others waited for the term)."""
    settings = SETTINGS.with_overrides(unreachable_threshold=20_000, cleanup_threshold=40_000)
    with nodes(backend, 2, settings=settings) as started:
        wait_for(lambda: holders(started), 10, "a node to take the sweep lease")
        (index,) = holders(started)
        holder, other = started[index], started[1 - index]
        draining = threading.Event()
        release = threading.Event()
        masters = holder.context.masters
        drain = masters.wait

        def long_drain(deadline: float) -> None:
            # The drain: waiting for the node's running masters (and partitions) to finish.
            draining.set()
            release.wait(30)
            drain(deadline)

        masters.wait = long_drain  # type: ignore[method-assign]
        stopper = threading.Thread(target=holder.stop, kwargs={"drain_timeout_ms": 30_000})
        stopper.start()
        try:
            assert draining.wait(10), "the holder's drain did not begin"
            began = time.monotonic()
            # At its next look (a heartbeat and a sweep_interval away), however loaded the
            # host: well before the term, after which a lease lapses anyway (without the
            # give-up, the other node waited for exactly that).
            wait_for(
                lambda: other.leases.holding(SWEEP),
                settings.unreachable_threshold / 2000,
                "the other node to take the lease while the holder drains",
            )
            assert time.monotonic() - began < settings.unreachable_threshold / 2000
        finally:
            release.set()
            stopper.join(60)


@BACKENDS
@pytest.mark.parametrize("fault", ["fails", "hangs"])
def test_a_holder_whose_sweeps_do_not_work_leaves_the_lease_to_another(
    backend: Backend, fault: str
) -> None:
    """The holder's sweep service raises every turn (or hangs in one) while its lease service
    is healthy: it stops renewing the lease, and another node takes it and sweeps, marking a
    dead node UNREACHABLE within the lease's usual bound (it renewed regardless, so nobody
    ever swept again and a dead node's jobs hung)."""
    sweeps = Sweeps()
    with nodes(backend, 2, sweeps) as started:
        wait_for(lambda: holders(started), 10, "a node to take the sweep lease")
        (index,) = holders(started)
        sweeper = started[index].services.get("sweep")
        assert sweeper is not None
        stuck = threading.Event()

        def broken() -> None:
            if fault == "hangs":
                stuck.wait(60)
            raise RuntimeError("this node's sweeps fail")

        sweeper.run_once = broken  # type: ignore[method-assign]
        try:
            broke = time.monotonic()
            CoordinationStore(backend.engine).register("dead-node", "nowhere", 1)
            # The holder's last good turn ends within one sweep interval; a term past its next
            # due time it gives up at its next renewal; the other takes it at its next look and
            # sweeps at once (the dead node is unreachable by then: it was silent a term).
            s = SETTINGS
            bound_s = (s.unreachable_threshold + 2 * INTERVAL_MS + s.heartbeat_interval) / 1000
            wait_for(
                lambda: any(marked for _, marked, _ in sweeps.by(1 - index)),
                bound_s + SLACK_S,
                "the other node to take the lease and mark the dead node unreachable",
            )
            assert time.monotonic() - broke <= bound_s + SLACK_S
            assert holders(started) == [1 - index]
            assert all(marked == 0 for _, marked, _ in sweeps.by(index)), "the broken holder swept"
        finally:
            stuck.set()


@pytest.mark.backends("postgresql", "mariadb")
def test_an_idle_non_holder_reads_the_leases_only_inside_its_heartbeats(backend: Backend) -> None:
    """Where the database can send them together, a node that holds no lease looks for a lapsed
    one in its heartbeat's round trip: its lease service sends no read of its own."""
    # Looks far apart beside the heartbeats (every 100 ms): a look finds a heartbeat's read
    # from within its interval on a loaded host too (else it reads itself, as it should).
    settings = SETTINGS.with_overrides(sweep_interval=1500)
    started: list[Node] = []
    try:
        for _ in range(2):
            started.append(Node(backend.engine, JobRegistry(), settings, capacity=2).start())
        wait_for(lambda: holders(started), 10, "a node to take the sweep lease")
        (index,) = holders(started)
        other = started[1 - index]
        reads: list[float] = []
        looks: list[float] = []
        read, run_once = other.store.leases, other.leases.run_once

        def counted_read(term_ms: int) -> dict[str, object]:
            reads.append(time.monotonic())
            return read(term_ms)  # type: ignore[return-value]

        def counted_look() -> None:
            run_once()
            looks.append(time.monotonic())

        other.store.leases = counted_read  # type: ignore[method-assign,assignment]
        other.leases.run_once = counted_look  # type: ignore[method-assign]
        # Six looks of the non-holder (one every sweep_interval), each after heartbeats.
        wait_for(lambda: len(looks) >= 6, 30, "six looks for a lapsed lease")
        assert holders(started) == [index]
        assert reads == [], f"{len(reads)} lease reads of its own in {len(looks)} looks"
    finally:
        for node in started:
            node.stop(drain_timeout_ms=1000)


@BACKENDS
def test_a_lease_the_database_away_kept_from_being_given_up_is_one_info_line(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """A fenced node gives its leases up in the outage that fenced it: each release fails and
    the lease lapses after its term. Galera bounce runs logged it at WARNING per lease, in two
    lines (SQLAlchemy's wrapper and its link), beside the outage's one WARNING per service."""
    from sqlalchemy.exc import OperationalError

    away = OperationalError(
        "DELETE FROM batch_leases ...", {}, ConnectionRefusedError(2003, "Can't connect")
    )

    def refused(name: str, holder: str) -> None:
        raise away

    with caplog.at_level("INFO"), nodes(backend, 1) as started:
        wait_for(lambda: holders(started), 10, "the node to take the sweep lease")
        started[0].store.release_lease = refused  # type: ignore[method-assign]
        started[0].stop(drain_timeout_ms=1000)
    (line,) = [r for r in caplog.records if "could not give up" in r.getMessage()]
    assert line.levelname == "INFO"
    assert "\n" not in line.getMessage() and "ConnectionRefusedError" in line.getMessage()
