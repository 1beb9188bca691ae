"""A lease holder's heartbeat renews its leases in its own round trip, where the database can
send the two together (PostgreSQL: one statement; MySQL and MariaDB: one UPDATE of the node's
row joined to its lease rows): the renewal costs no round trip of its own, its fence is
``renew_leases``' (a lease row changes only while this node holds it and it has not lapsed,
judged by the database), and a renewal that did not land gives the lease up at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import text

from dbcluster.bench.wire import CountingProxy
from dbcluster.cluster.maintenance.leases import SWEEP
from dbcluster.cluster.membership import Heartbeat
from dbcluster.cluster.node import Node
from dbcluster.cluster.store import CoordinationStore
from dbcluster.dialects import make_engine
from dbcluster.testing.app import FAST_SETTINGS, TIME_SCALE
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import hold_services
from dbcluster.testing.waiting import wait_for
from tests.cluster.test_leases import frozen, holder
from tests.dialects.test_round_trips import _counted

FOLDING = pytest.mark.backends("postgresql", "mariadb", "mysql")
#: Heartbeats every 100 ms; a term long enough that no lease lapses unless a test stops it.
SETTINGS = FAST_SETTINGS.with_overrides(
    sweep_interval=400, unreachable_threshold=10_000, cleanup_threshold=20_000
)
#: The fast settings' term (1.5 s at time scale 3): what tests that wait for a lapse use.
SHORT = FAST_SETTINGS.with_overrides(sweep_interval=400)


def _renewed_at(backend: Backend) -> datetime:
    with backend.engine.connect() as conn:
        return conn.execute(
            text("SELECT renewed_at FROM batch_leases WHERE lease_name = :n"), {"n": SWEEP}
        ).scalar_one()


def _heartbeat(node: Node) -> Heartbeat:
    found = node.services.get("heartbeat")
    assert isinstance(found, Heartbeat)
    return found


@contextmanager
def _started(engine: Any, count: int = 1, settings: Any = SETTINGS) -> Iterator[list[Node]]:
    started: list[Node] = []
    try:
        for _ in range(count):
            started.append(Node(engine, None, settings, capacity=0).start())
        yield started
    finally:
        for node in started:
            node.stop(drain_timeout_ms=1000)


class Carried:
    """Each renewal a node's heartbeat carried: (names sent, names the database renewed)."""

    def __init__(self, node: Node) -> None:
        self.calls: list[tuple[list[str], list[str]]] = []
        self.lock = threading.Lock()
        leases = node.leases
        carried = leases.renewal_carried

        def record(node_id: str, names: Sequence[str], sent: float, renewed: Sequence[str]) -> None:
            with self.lock:
                self.calls.append((list(names), list(renewed)))
            carried(node_id, names, sent, renewed)

        leases.renewal_carried = record  # type: ignore[method-assign]

    def of(self, name: str) -> list[list[str]]:
        """What the database renewed, for each carried renewal that sent ``name``."""
        with self.lock:
            return [renewed for names, renewed in self.calls if name in names]


@contextmanager
def _carrying_nothing(node: Node) -> Iterator[Callable[[], Carried]]:
    """``node``'s heartbeat carries no renewal (nor lease read) until the call it yields, which
    returns what the heartbeat carries from then on."""
    heartbeat = _heartbeat(node)
    rider, heartbeat.leases = heartbeat.leases, None

    def resume() -> Carried:
        carried = Carried(node)
        heartbeat.leases = rider
        return carried

    try:
        yield resume
    finally:
        heartbeat.leases = rider


def _keeping_up(node: Node) -> None:
    """The node's held or frozen lease service, and the services of its leases, still count as
    keeping up, so its heartbeat goes on carrying renewals: these tests are about the carried
    renewal. (A lease service that really stops keeping up gets no renewal from the heartbeat:
    test_leases.py.)"""
    node.leases.behind = lambda: 0.0  # type: ignore[method-assign]
    node.leases._lagging = lambda name: None  # type: ignore[method-assign]


def _one_beat(proxy: CountingProxy, heartbeat: Heartbeat) -> dict[str, int]:
    """What one heartbeat sends on a connection already open: measured again (up to three
    times) when the pool had to open one (a service still finishing its turn held the open
    one)."""
    for _ in range(3):
        opened = proxy.counts.snapshot().get("connections", 0)
        counted = _counted(proxy, heartbeat.beat)
        if proxy.counts.snapshot().get("connections", 0) == opened:
            break
    return counted


@FOLDING
def test_a_holders_heartbeat_renews_its_lease_in_one_round_trip(backend: Backend) -> None:
    """One heartbeat of a holder (its services held, so nothing else runs): one round trip on
    the wire, and the lease row renewed by it."""
    with CountingProxy.for_url(backend.url) as proxy:
        engine = make_engine(proxy.url_for(backend.url))
        try:
            with _started(engine) as (node,):
                wait_for(lambda: node.leases.holding(SWEEP), 10, "the node to take the lease")
                _keeping_up(node)
                with hold_services(node):
                    _heartbeat(node).beat()  # its statement built and its connection open
                    # The cheapest of a few beats: what one costs when nothing else of the
                    # process (a connection being opened, a straggling turn) shares the wire
                    # with it. A renewal of its own would make every beat cost two.
                    beats = []
                    for _ in range(5):
                        before = _renewed_at(backend)
                        counted = _one_beat(proxy, _heartbeat(node))
                        beats.append((counted, before, _renewed_at(backend)))
                        if counted.get("round_trips") == 1:
                            break
                assert not node.is_fenced
        finally:
            engine.dispose()
    counted, before, after = min(beats, key=lambda beat: beat[0].get("round_trips", 0))
    assert counted["round_trips"] == 1, beats
    assert after > before, "the heartbeat did not renew the lease"


@FOLDING
def test_while_heartbeats_carry_the_renewal_the_lease_service_sends_none(
    backend: Backend,
) -> None:
    with _started(backend.engine) as (node,):
        wait_for(lambda: node.leases.holding(SWEEP), 10, "the node to take the lease")
        carried = Carried(node)
        # From the first heartbeat that renewed it (until then the service renews on its own).
        wait_for(lambda: carried.of(SWEEP), 10, "a heartbeat renewing")
        own: list[int] = []
        renew = node.store.renew_leases

        def counted(names: list[str], holder: str, term_ms: int) -> int:
            own.append(len(names))
            return renew(names, holder, term_ms)

        node.store.renew_leases = counted  # type: ignore[method-assign]
        wait_for(lambda: len(carried.of(SWEEP)) >= 20, 30, "twenty heartbeats renewing")
        assert node.leases.holding(SWEEP) is not None
        assert all(SWEEP in renewed for renewed in carried.of(SWEEP))
    # One of its own at most: a heartbeat that comes later than the grace (a stalled machine)
    # leaves the renewal to the service, as it must.
    assert len(own) <= 1, f"{len(own)} renewals of its own beside 20 carried"


@FOLDING
def test_a_lapsed_lease_is_not_renewed_by_the_heartbeat(backend: Backend) -> None:
    """The holder's lease lapses (nothing renewed it for its term); its heartbeat then carries
    a renewal, which the fence refuses: the row stays lapsed and the node gives it up. (With the
    renewal's "not lapsed" test dropped, the heartbeat renews it.)"""
    with _started(backend.engine, settings=SHORT) as (node,):
        wait_for(lambda: node.leases.holding(SWEEP), 10, "the node to take the lease")
        with frozen(node, "leases"), _carrying_nothing(node) as resume_heartbeats:
            _keeping_up(node)
            wait_for(lambda: holder(backend) == (node.node_id, True), 30, "the lapse")
            lapsed_at = _renewed_at(backend)
            # Only the heartbeat may renew now (the lease service stays frozen).
            carried = resume_heartbeats()
            wait_for(lambda: carried.of(SWEEP), 10, "a heartbeat carrying the renewal")
            assert carried.of(SWEEP)[0] == [], "the lapsed lease was renewed"
            assert _renewed_at(backend) == lapsed_at
            assert holder(backend) == (node.node_id, True)
            assert node.leases.leases_to_renew(node.node_id) is None


@FOLDING
def test_a_lease_another_node_took_is_not_renewed_by_the_heartbeat(backend: Backend) -> None:
    """The holder's lease lapses and another node takes it; the old holder's heartbeat then
    carries a renewal: refused (the row is another's), the old holder gives the lease up and
    never acts for it. (With the renewal's holder test dropped, it would renew the new
    holder's row and believe it its own: two holders.)"""
    with _started(backend.engine, 2, SHORT) as started:
        wait_for(lambda: any(n.leases.holding(SWEEP) for n in started), 10, "a holder")
        old, new = started if started[0].leases.holding(SWEEP) else started[::-1]
        with frozen(old, "leases"), _carrying_nothing(old) as resume_heartbeats:
            _keeping_up(old)
            wait_for(lambda: holder(backend) == (new.node_id, False), 30, "the takeover")
            carried = resume_heartbeats()
            wait_for(lambda: carried.of(SWEEP), 10, "a heartbeat carrying the renewal")
            assert carried.of(SWEEP)[0] == [], "another node's lease was renewed"
            assert old.leases.holding(SWEEP) is None
            assert old.leases.leases_to_renew(old.node_id) is None
            assert holder(backend) == (new.node_id, False)
            assert new.leases.holding(SWEEP) is not None


@FOLDING
def test_a_renewal_that_did_not_land_gives_the_lease_up_at_once(backend: Backend) -> None:
    """The lease row moves to another node behind the holder's back while the holder's own
    clock still says it holds it for seconds: its next heartbeat's renewal does not land, and
    it stops acting for the lease then, not when its term runs out."""
    with _started(backend.engine) as (node,):
        wait_for(lambda: node.leases.holding(SWEEP), 10, "the node to take the lease")
        store = CoordinationStore(backend.engine)
        with frozen(node, "leases"):
            _keeping_up(node)
            # Taken away: given up in its name, and taken by a registered node.
            store.register("thief", "nowhere", 0)
            assert store.release_lease(SWEEP, node.node_id)
            assert store.take_lease(SWEEP, "thief", SETTINGS.unreachable_threshold, exists=False)
            wait_for(
                lambda: node.leases.holding(SWEEP) is None,
                1 + TIME_SCALE,  # a few heartbeats; the node's own clock gives it ~10 s more
                "the holder to give the lease up",
            )
            assert node.leases.leases_to_renew(node.node_id) is None
        assert holder(backend) == ("thief", False)
