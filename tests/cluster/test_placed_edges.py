"""Edges of placed runs (``dbcluster/cluster/placed.py``), found by a second review: a wake-up
naming more partitions than the idle node's slots (the rest are claimed once a slot frees, not
at the next idle poll); job parameters whose names the text form cannot carry; an unclear final
write judged by the partition row too (its step row's version alone is written by others); the
``claimed`` event told before the partition's end. PostgreSQL only (the only wake-ups that carry
executions)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dbcluster.batch import RepeatStatus
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import placed
from dbcluster.testing import points
from dbcluster.testing.app import FAST_SETTINGS
from dbcluster.testing.app import one_row_tasklet as write_row
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import record_events
from dbcluster.testing.waiting import in_thread, wait_for
from tests.cluster.test_placed_runs import listening_worker, placed_registry

pytestmark = pytest.mark.backends("postgresql")

SETTINGS = FAST_SETTINGS.with_overrides(work_stealing_delay=60_000)


class _Params:
    """A one-call body that writes its row and keeps the job parameters it was given."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def body(self, ctx: ChunkContext) -> RepeatStatus:
        self.seen.append(dict(ctx.step_execution.job_execution.parameters))
        return write_row(ctx)


@pytest.mark.parametrize("carried", [True, False], ids=["placed", "claimed"])
def test_a_placed_partition_gets_the_job_parameters_it_was_launched_with(
    backend: Backend, make_cluster: Any, carried: bool
) -> None:
    """The carried payload sends the job parameters as ``JobParameters.to_strings()`` and the
    node reads them back with ``JobParameters.parse``, which is not its inverse: a name that
    holds '=' or '(' , starts with '-' or ends in a space (all accepted by ``JobParameters``
    and stored as they are) comes back as another parameter, silently. The partition then
    commits work done with parameters its job was not launched with; the same partition
    claimed (carried wake-ups off) gets the stored ones. Expected: the same parameters on
    both paths."""
    settings = SETTINGS.with_overrides(carried_wakeups=carried)
    gate = _Params()
    registry = placed_registry(gate.body)
    master = make_cluster(settings, registry=registry, work=False)
    listening_worker(make_cluster, registry, settings)
    launched = {"run": 1, "a=b": 7, "-x": 3, "tail ": "t"}
    ran: list[int] = []

    def seen_placed(partitions: Any = (), **_: Any) -> None:
        ran.extend(partitions)

    points.install("node.placed_run", seen_placed)
    try:
        execution = master.launch("placed", launched)
    finally:
        points.remove("node.placed_run", seen_placed)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert bool(ran) is carried
    assert gate.seen == [launched], (
        f"the partition ran ({'placed' if ran else 'claimed'}) with job parameters "
        f"{gate.seen[0]}, not those it was launched with {launched}"
    )


def test_a_placed_partitions_claim_is_told_before_its_end(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PlacedRuns.run submits the partitions to their slots, sleeps (HAND_OFF_S), then tells
    their ``claimed`` events (Announcer.took_placed). A one-INSERT partition ends within one
    round trip: if the thread that placed it is descheduled that long (here: its hand-off
    sleep made 300 ms, as a busy 2-core host does), ``completed`` is told first. NodeMetrics
    then pops nothing at ``completed`` and adds the partition to ``_running`` at ``claimed``,
    for good: ``dbcluster_partitions_running`` stays 1 on an idle node and the partition's
    duration is never observed. Expected: ``claimed`` before ``completed``; the gauge back to
    0."""
    from dbcluster.metrics import NodeMetrics

    monkeypatch.setattr(placed, "HAND_OFF_S", 0.3)
    registry = placed_registry(write_row)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = listening_worker(make_cluster, registry)
    recorder = record_events(worker.node)
    metrics = NodeMetrics()
    worker.node.events.subscribe(metrics)
    execution = master.launch("placed", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    time.sleep(0.6)
    told = [n for n in recorder.names() if n in ("claimed", "completed")]
    running = metrics.registry.get_sample_value("dbcluster_partitions_running")
    assert told == ["claimed", "completed"] and running == 0, (
        f"events in this order: {told}; dbcluster_partitions_running = {running} on a node "
        f"that runs nothing"
    )


@pytest.mark.parametrize("carried", [True, False], ids=["placed", "claimed"])
def test_partitions_a_carried_wake_up_names_beyond_the_free_slots_are_claimed_once_one_frees(
    backend: Backend, make_cluster: Any, carried: bool
) -> None:
    """An idle node with 2 slots is woken with 6 partitions of a one-call transactional step:
    it runs 2 as placed and hints the other 4 (Worker.offer). The poller, woken, finds no room
    and returns; nothing claimed, so ``_backlog`` stays False. Once the step is known to end in
    one call (any earlier job), Grouping.qualifies holds: a placed run's fence gets no hand-on
    (its final write claims nothing next). When the placed runs end, ``_slot_freed`` wakes the
    poller only on ``_backlog``, and the heartbeat carries no poll while offers wait
    (``poll_to_carry``): the 4 wait for the poller's idle interval (``wakeup_poll_interval``,
    10 s while listening) or for another node's steal. Before placed runs, the poller claimed
    them itself (and set ``_backlog``). Expected: the job ends in well under that interval."""
    settings = SETTINGS.with_overrides(carried_wakeups=carried)
    registry = placed_registry(write_row, count=6)
    master = make_cluster(settings, registry=registry, work=False)
    worker = listening_worker(make_cluster, registry, settings.with_overrides(concurrency_limit=2))
    poller = worker.node.worker
    warm = master.launch("placed", {"run": 1})  # the step ends in one call: it groups now
    assert warm.status is BatchStatus.COMPLETED, warm.exit_status
    # The node is idle: its polls (carried by its heartbeats) found nothing for a while.
    wait_for(
        lambda: not poller._backlog and poller.interval_ms >= poller.idle_poll_ms(),
        timeout=30,
        what="the node to settle idle",
    )
    began = time.monotonic()
    execution = master.launch("placed", {"run": 2})
    took = time.monotonic() - began
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert took < 3, (
        f"6 one-INSERT partitions on a 2-slot idle node took {took:.1f} s: those beyond the "
        f"slots waited for an idle poll"
    )


def test_a_placed_run_whose_refused_end_was_unclear_does_not_report_it_recorded(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unclear COMMIT is judged from the step execution's version (commit_step's verify:
    ``before + 1``). A claimed partition's step row is written only by its holder (and by
    masters that fence it); a placed one's is still at version 0 and others write it as a
    matter of course: a steal's claim (start_claimed: STARTED, version 1) or a job stop
    (stop_pending: STOPPED, version 1). Interleaving: the node runs P as placed; another node
    claims P (as a steal does, the owner looking silent); the node's final write (guard and
    COMMIT in one flight) is refused, and its answer is lost (the connection drops: here
    lose_sent_commit_acks; as well the server's idle-in-transaction kill). The verify reads
    version 1 and says the write took effect: the node reports P completed (INFO, a
    ``completed`` event) that it never completed, while the other node holds it. Expected: a
    ``lost`` partition, no ``completed``."""
    from sqlalchemy import select, text

    from dbcluster.batch.domain import utcnow
    from dbcluster.schema import partitions

    monkeypatch.setattr(placed, "CLAIM_PLACED_AFTER_MS", 60_000)  # no claim beside it
    entered, go = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def body(ctx: ChunkContext) -> RepeatStatus:
        seen["sid"] = ctx.step_execution.id
        write_row(ctx)
        entered.set()
        assert go.wait(30)
        return RepeatStatus.FINISHED

    registry = placed_registry(body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    victim = listening_worker(make_cluster, registry)
    other = make_cluster(SETTINGS.with_overrides(concurrency_limit=0), registry=registry)
    recorder = record_events(victim.node)
    killed: list[int] = []

    def lose_connection(conn: Any, sql: str, **_: Any) -> None:
        # The final write's flight (guard, step, COMMIT) is about to go out: its connection is
        # lost first (the server ends the session), so its outcome is unclear to the node.
        if conn.engine is victim.node.work_engine and "dbc_guard" in sql and not killed:
            pid = conn.connection.dbapi_connection.info.backend_pid
            killed.append(pid)
            with backend.engine.connect() as admin:
                admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    points.install("driver.execute", lose_connection)
    in_thread(lambda: master.launch("placed", {"run": 1}))
    try:
        assert entered.wait(30), "the partition never started"
        sid = seen["sid"]
        # Another node's claim (the statement a steal runs), while the placed run is open.
        won = other.node.store.claim(other.node.node_id, 0, [sid], utcnow())
        assert [w.partition.step_execution_id for w in won] == [sid]
    finally:
        go.set()
    try:
        wait_for(
            lambda: any(
                d.get("step_execution_id") == sid for n, d in recorder.events if n != "claimed"
            ),
            timeout=30,
            what="the placed run's outcome",
        )
    finally:
        points.remove("driver.execute", lose_connection)
    with backend.engine.connect() as conn:
        row = conn.execute(
            select(partitions.c.status, partitions.c.assigned_node).where(
                partitions.c.step_execution_id == sid
            )
        ).one()
    told = [n for n, d in recorder.events if d.get("step_execution_id") == sid]
    assert killed, "the fault was not injected"
    assert tuple(row) == ("CLAIMED", other.node.node_id)
    assert "completed" not in told, (
        f"node {victim.node.node_id} reported partition {sid} completed ({told}); it is "
        f"{tuple(row)}: its refused write was judged landed from a version another node wrote"
    )
