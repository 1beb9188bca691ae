"""Quiet idle nodes (issue 35): wake-ups make polling a fallback, and a node's heartbeat and its
idle poll share one round trip where the database can send them together.

Each test watches the statements a worker node sends on its autocommit engine (polls,
heartbeats, both at once) and waits on conditions with deadlines."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, select, text

from dbcluster import points
from dbcluster.cluster.maintenance.leases import SWEEP
from dbcluster.cluster.notifier import Notifier
from dbcluster.schema import partitions
from dbcluster.testing.app import FAST_SETTINGS, TIME_SCALE
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import hold_services
from dbcluster.testing.waiting import in_thread, wait_for

#: Heartbeats every 100 ms, polls every 50 ms without wake-ups, every minute with them.
SETTINGS = FAST_SETTINGS.with_overrides(
    heartbeat_interval=100, task_polling_interval=50, wakeup_poll_interval=60_000
)


def _kind(sql: str) -> str | None:
    """What a statement of the autocommit engine is: a poll, a heartbeat, both, or else None."""
    polls = (
        sql.lstrip().startswith("SELECT batch_partitions.step_execution_id")
        or "dbc_poll" in sql
        # A lease holder's heartbeat (it renews its leases too) with its poll, on PostgreSQL.
        or ("dbc_renew" in sql and "FROM batch_partitions" in sql)
    )
    # A lease holder's heartbeat on MySQL and MariaDB: its node row joined to its lease rows.
    beats = "UPDATE batch_nodes SET status" in sql or "UPDATE batch_nodes LEFT OUTER JOIN" in sql
    if polls and beats:
        return "both"
    if polls:
        return "poll"
    if beats:
        return "heartbeat"
    return None


@contextmanager
def _watched(node: Any) -> Iterator[Counter[str]]:
    """Counts of the node's polls, heartbeats and the two together while inside."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def record(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        kind = _kind(sql)
        if kind is not None:
            with lock:
                seen[kind] += 1

    engine = node.engines.autocommit
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _window(seen: Counter[str], carried: int, what: str) -> Counter[str]:
    """The counts over the next ``carried`` statements that did both."""
    start = Counter(seen)
    wait_for(lambda: seen["both"] - start["both"] >= carried, timeout=15, what=what)
    return Counter({k: seen[k] - start[k] for k in ("poll", "heartbeat", "both")})


def _notifier(cluster: Any) -> Notifier:
    found = cluster.node.services.get("listen")
    assert isinstance(found, Notifier)
    return found


@pytest.mark.backends("postgresql")
def test_with_wake_ups_an_idle_node_polls_only_inside_its_heartbeats(
    backend: Backend, make_cluster: Any
) -> None:
    """While its listener is up, an idle node sends no poll of its own (its fallback is a
    minute away): each heartbeat carries one, in one statement."""
    worker = make_cluster(SETTINGS)
    notifier = _notifier(worker)
    wait_for(lambda: notifier.healthy, what="the worker to listen")
    assert worker.node.worker.idle_poll_ms() == 60_000
    with _watched(worker.node) as seen:
        # Past the polls of its start (the interval doubles from 50 ms up to the fallback,
        # with each empty poll, carried or not).
        wait_for(lambda: worker.node.worker.interval_ms >= 400, what="the poll to relax")
        counts = _window(seen, 10, "ten heartbeats carrying polls")
    assert counts["poll"] == 0, counts
    assert counts["heartbeat"] == 0, counts


@pytest.mark.backends("postgresql")
def test_with_the_listener_down_polling_resumes_at_the_normal_interval(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cut listener (that cannot reconnect for now): the node polls every
    ``task_polling_interval`` again, at once; back up, the fallback pace returns."""
    # Heartbeats (which carry a poll each) once a second: the polls counted below are the
    # worker's own.
    # (The thresholds stay above that heartbeat at every DBCLUSTER_TEST_TIME_SCALE: at 2 the fast
    # settings' unreachable_threshold is exactly 1000 ms, which the settings refuse.)
    worker = make_cluster(
        SETTINGS.with_overrides(
            heartbeat_interval=1000,
            unreachable_threshold=max(SETTINGS.unreachable_threshold, 3000),
            cleanup_threshold=max(SETTINGS.cleanup_threshold, 6000),
        )
    )
    notifier = _notifier(worker)
    wait_for(lambda: notifier.healthy, what="the worker to listen")

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the test refuses the listener")

    monkeypatch.setattr(notifier.provider, "open_listener", refused)
    with _watched(worker.node) as seen:
        with backend.engine.begin() as conn:
            killed = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN dbcluster_%' AND datname = current_database()"
                )
            ).scalar_one()
        assert killed >= 1
        wait_for(lambda: not notifier.healthy, timeout=10, what="the listener to be found down")
        assert worker.node.worker.idle_poll_ms() == SETTINGS.task_polling_interval
        start = seen["poll"] + seen["both"]
        # Polls of its own at the normal interval (50 ms): ten within a few heartbeats.
        wait_for(
            lambda: seen["poll"] + seen["both"] - start >= 10,
            timeout=4,
            what="the node to poll every task_polling_interval",
        )
    monkeypatch.undo()
    wait_for(lambda: notifier.healthy, timeout=10, what="the listener to come back")
    assert worker.node.worker.idle_poll_ms() == 60_000


@pytest.mark.backends("postgresql", "mariadb", "mysql")
def test_an_idle_nodes_heartbeats_ride_on_its_polls(backend: Backend, make_cluster: Any) -> None:
    """Where the heartbeat and the poll can go as one request, an idle node sends no heartbeat
    on its own: each rides with a poll (or carries one)."""
    # Polls every 250 ms everywhere, heartbeats every second: a poll carries each heartbeat
    # (which may then come up to one poll interval and a margin early).
    settings = SETTINGS.with_overrides(
        heartbeat_interval=1000,
        task_polling_interval=250,
        wakeup_poll_interval=250,
        unreachable_threshold=5000,
        cleanup_threshold=10_000,
    )
    worker = make_cluster(settings)
    with _watched(worker.node) as seen:
        wait_for(lambda: seen["both"] >= 1, what="a poll with its heartbeat")
        counts = _window(seen, 4, "four polls with their heartbeats")
    # One alone at most: a poll that starts more than the margin late (a stalled machine)
    # leaves the heartbeat to go on its own, as it must.
    assert counts["heartbeat"] <= 1, counts
    assert counts["poll"] > 0, counts  # the polls between heartbeats
    assert not worker.node.is_fenced


def _partitions(backend: Backend) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(select(partitions)).all()


@pytest.mark.backends("postgresql")
def test_a_dead_nodes_unstarted_partitions_are_claimed_within_the_unreachable_threshold(
    backend: Backend, make_cluster: Any
) -> None:
    """With wake-ups healthy (idle polls a minute apart), a node that dies holding placed,
    unclaimed partitions: the sweep that marks it UNREACHABLE wakes the survivors, which claim
    them within ``unreachable_threshold + task_polling_interval`` (and a sweep interval), not
    at the survivor's next heartbeat (which carries its idle poll)."""
    base = SETTINGS.with_overrides(
        unreachable_threshold=3000,
        cleanup_threshold=60_000,
        sweep_interval=200,
        task_polling_interval=100,
        work_stealing_delay=600_000,  # no stealing from a live node: only from the dead one
    )
    # The sweep lease's holder, which runs no partitions.
    sweeper = make_cluster(base.with_overrides(concurrency_limit=0))
    wait_for(lambda: sweeper.node.leases.holding(SWEEP) is not None, what="the sweep lease")
    # Its heartbeat (which carries its idle poll) every 2.8 s: just inside the threshold.
    survivor = make_cluster(base.with_overrides(heartbeat_interval=2800))
    victim = make_cluster(base.with_overrides(concurrency_limit=1))
    wait_for(lambda: _notifier(survivor).healthy, what="the survivor to listen")
    victim_id, survivor_id = victim.node.node_id, survivor.node.node_id
    poller = victim.node.services.get("poll")
    assert poller is not None
    thaw = threading.Event()
    poller.gate = lambda: thaw.wait()  # the victim claims nothing: its partitions wait
    try:
        run = in_thread(lambda: survivor.launch("ledger", {"run": 1, "delay_ms": 20}))

        def victim_waits() -> bool:
            rows = _partitions(backend)
            mine = [p for p in rows if p.assigned_node == victim_id]
            others = [p for p in rows if p.assigned_node != victim_id]
            return (
                bool(mine)
                and all(p.status in ("PENDING", "CLAIMED") for p in mine)
                and all(p.status not in ("PENDING", "CLAIMED") for p in others)
            )

        wait_for(victim_waits, timeout=20, what="the survivor idle, the victim's work waiting")
        unstarted = [p.step_execution_id for p in _partitions(backend) if p.status == "PENDING"]
        assert unstarted
        # The victim dies just after a heartbeat of the survivor: its next one comes before the
        # victim has been silent for the threshold, the one after 2.8 s later.
        identity = survivor.node.membership.current
        assert identity is not None
        last = identity.last_heartbeat_ok
        wait_for(lambda: identity.last_heartbeat_ok != last, timeout=10, what="a heartbeat")
        with hold_services(victim.node):
            died = time.monotonic()

            def claimed_by_survivor() -> bool:
                rows = {p.step_execution_id: p for p in _partitions(backend)}
                return all(
                    rows[i].assigned_node == survivor_id and rows[i].status != "PENDING"
                    for i in unstarted
                )

            wait_for(claimed_by_survivor, timeout=30, what="the survivor to claim them")
            taken_s = time.monotonic() - died
        bound_ms = base.unreachable_threshold + base.task_polling_interval + base.sweep_interval
        assert taken_s <= bound_ms / 1000 + 0.2 * TIME_SCALE, f"claimed after {taken_s:.2f} s"
    finally:
        thaw.set()
        poller.gate = None
    run["thread"].join(timeout=60)


@pytest.mark.backends("postgresql")
def test_a_woken_worker_reaches_offered_then_claimed_with_the_partition_placed_on_it(
    backend: Backend, make_cluster: Any
) -> None:
    """The points the latency benchmark times a launch by (dbcluster/bench/stages.py): the
    listener's wake-up names the partitions placed on the node (``node.offered``), and the
    poller's claim wins them (``node.claimed``), on that node. (Which comes first is not
    asserted: a heartbeat's poll may find them before the wake-up arrives.)"""
    master = make_cluster(SETTINGS, work=False)
    worker = make_cluster(SETTINGS)
    wait_for(lambda: _notifier(worker).healthy, what="the worker to listen")
    seen: list[tuple[str, str, list[int]]] = []

    def recorder(point: str) -> Any:
        def record(node_id: str, partitions: Any) -> None:
            ids = [getattr(p, "partition", p) for p in partitions]
            seen.append((point, node_id, [getattr(i, "step_execution_id", i) for i in ids]))

        return record

    handlers = [(p, recorder(p)) for p in ("node.offered", "node.claimed")]
    for point, handler in handlers:
        points.install(point, handler)
    try:
        execution = master.launch("ledger", {"run": 1})
    finally:
        for point, handler in handlers:
            points.remove(point, handler)
    with backend.engine.connect() as conn:
        placed = {
            int(r.step_execution_id)
            for r in conn.execute(
                select(partitions.c.step_execution_id).where(
                    partitions.c.job_execution_id == execution.id
                )
            )
        }
    node_id = worker.node.identity.node_id
    offered = {i for point, node, ids in seen if point == "node.offered" for i in ids}
    claimed = {i for point, node, ids in seen if point == "node.claimed" for i in ids}
    assert claimed == placed, seen
    assert offered & placed, seen  # the wake-up named what it placed
    assert {node for _, node, _ in seen} == {node_id}, seen
