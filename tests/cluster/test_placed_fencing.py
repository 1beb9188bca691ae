"""Interleavings against the fencing of placed runs (``dbcluster/cluster/placed.py``), found
by a review: a node removed while it runs a partition as placed commits nothing of it; a
payload whose data spells the lone partition's placeholder is harmless; a poll that began
before a placed run claims no more than the slots left. PostgreSQL only (the only wake-ups
that carry executions)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select

from dbcluster.batch import RepeatStatus
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus
from dbcluster.testing import points
from dbcluster.testing.app import FAST_SETTINGS, ledger
from dbcluster.testing.app import one_row_tasklet as write_row
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import hold_services
from dbcluster.testing.waiting import in_thread, wait_for
from tests.cluster.test_fencing import registered, silence
from tests.cluster.test_placed_runs import listening_worker, partition_row, placed_registry

pytestmark = pytest.mark.backends("postgresql")

#: No stealing by delay while a test holds a partition's first transaction open; a master that
#: waits long enough for a live node.
SETTINGS = FAST_SETTINGS.with_overrides(work_stealing_delay=60_000, no_node_timeout=30_000)


def _ledger(backend: Backend, step_execution_id: int) -> list[Any]:
    with backend.engine.connect() as conn:
        return list(
            conn.execute(
                select(ledger.c.node_id, ledger.c.attempt).where(
                    ledger.c.step_execution_id == step_execution_id
                )
            ).all()
        )


class _TwoCalls:
    """A two-call tasklet: each call writes the partition's ledger row (with its node). On the
    ``victim`` node, the first call waits for ``first`` before it returns, the second for
    ``second``; elsewhere it just finishes."""

    def __init__(self) -> None:
        self.victim: str | None = None
        self.entered = threading.Event()
        self.first = threading.Event()
        self.second = threading.Event()
        self.step_execution_id: int | None = None

    def body(self, ctx: ChunkContext) -> RepeatStatus:
        from dbcluster.cluster.executor import current_node_id

        write_row(ctx)
        if current_node_id.get() != self.victim:
            return RepeatStatus.FINISHED
        if ctx.step_execution.commit_count == 0:
            self.step_execution_id = ctx.step_execution.id
            self.entered.set()
            assert self.first.wait(60), "the test never let the first call go on"
            return RepeatStatus.CONTINUABLE
        assert self.second.wait(60), "the test never let the second call go on"
        return RepeatStatus.FINISHED


def test_a_removed_node_commits_nothing_of_a_placed_partition(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The victim runs a non-transferable partition as placed; its watchdog's claim fails once
    (a blip: "its first commit claims it all the same"), and the victim stalls (as in
    test_fencing's removal tests) until the cluster removes it. Removal moves only CLAIMED
    partitions to their next attempt: this one is PENDING on the removed node at attempt 1.
    The master reads it as an orphan that never ran (PENDING), and moves it; between that read
    and the move, the removed node's first transaction commits: its guard accepts PENDING on
    (id, node, attempt), and nothing checks the node row, which a claim locks first.

    A non-transferable partition then runs on two nodes (the victim committed its first call,
    the backup runs it again). Expected: the removed node commits nothing; the partition runs on
    the backup only."""
    gate = _TwoCalls()
    registry = placed_registry(gate.body, transferable=False)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    victim = listening_worker(make_cluster, registry, SETTINGS)
    victim_id = victim.node.node_id
    gate.victim = victim_id

    def blip(*_: Any, **__: Any) -> bool:
        raise RuntimeError("the connection was lost")

    monkeypatch.setattr(victim.node.store, "claim_placed", blip)

    seen: dict[str, Any] = {}
    original = master.node.store.reassign

    def reassign(orphan: Any, to_node: str, fence: Any) -> bool:
        if orphan.step_execution_id == gate.step_execution_id and "status" not in seen:
            seen["status"] = orphan.status
            gate.first.set()  # the removed node's first call commits now, or never
            try:
                wait_for(
                    lambda: any(
                        r.node_id == victim_id for r in _ledger(backend, orphan.step_execution_id)
                    ),
                    timeout=5,
                )
            except TimeoutError:
                pass
            seen["moved"] = moved = original(orphan, to_node, fence)
            seen["after_move"] = tuple(partition_row(backend, orphan.step_execution_id))
            return moved
        return original(orphan, to_node, fence)

    monkeypatch.setattr(master.node.store, "reassign", reassign)

    ran: list[int] = []

    def seen_placed(partitions: Any = (), **_: Any) -> None:
        ran.extend(partitions)

    points.install("node.placed_run", seen_placed)
    run = in_thread(lambda: master.launch("placed", {"run": 1}))
    try:
        assert gate.entered.wait(60), "the partition never started"
        sid = gate.step_execution_id
        assert sid is not None and ran == [sid], "not run as placed"
        backup = listening_worker(make_cluster, registry, SETTINGS)
        with (
            points.parked(
                "node.between_poll_and_claim", lambda node_id, **_: node_id in backup.node.ids
            ) as backup_claim,
            hold_services(victim.node),
        ):
            silence(backend, victim_id)
            master.node.store.sweep(SETTINGS.unreachable_threshold, 1000)
            assert not registered(backend, victim_id), "the victim was not removed"
            assert tuple(partition_row(backend, sid)) == ("PENDING", victim_id, 1)
            wait_for(lambda: "moved" in seen, timeout=30, what="the master to move the orphan")
            gate.second.set()
            backup_claim.release()
    finally:
        points.remove("node.placed_run", seen_placed)
        gate.first.set()
        gate.second.set()
    run["thread"].join(60)
    assert not run["thread"].is_alive(), "the job did not end"
    assert seen["status"] == "PENDING"
    rows = _ledger(backend, sid)
    by = {r.node_id for r in rows}
    assert victim_id not in by, (
        f"removed node {victim_id} committed the non-transferable partition's first call after "
        f"its removal, and it ran again on {by - {victim_id}}: {rows}; the master moved it "
        f"({seen['moved']}) to {seen['after_move']}, job {run['result'].status}"
    )


def test_a_lone_partition_of_a_job_whose_parameters_hold_the_id_placeholder_runs(
    backend: Backend, make_cluster: Any
) -> None:
    """offers.split_around_id cuts the lone partition's payload at the first occurrence of
    its placeholder id (987654321987654321), which a job parameter (or the partition's
    context) may hold too: its assertion then fails inside the placement. Expected: the
    payload is harmless (at worst ids only), and the job completes."""
    registry = placed_registry(write_row, transferable=True)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    listening_worker(make_cluster, registry, SETTINGS)
    execution = master.launch("placed", {"run": 987654321987654321})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status


class _Gate:
    """A one-call body that writes its row and, on its first call, waits for ``go``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.calls = 0

    def body(self, ctx: ChunkContext) -> RepeatStatus:
        self.calls += 1
        write_row(ctx)
        if self.calls == 1:
            self.entered.set()
            assert self.go.wait(60), "the test never let the body go on"
        return RepeatStatus.FINISHED


def test_a_poll_that_began_before_a_placed_run_claims_no_more_than_the_free_slots(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker.run_once reads its room (free slots) before it takes the claim lock; a placed run
    that starts in between takes a slot the poller still counts as free. The poller then claims
    a partition (STARTED, CLAIMED) that waits in the pool's queue behind the placed run: no
    other node may take it, and a non-transferable one is failed if the node dies. Expected:
    no claim beyond the free slots (at most ``capacity`` slots busy)."""
    gate = _Gate()
    registry = placed_registry(gate.body, transferable=True, count=2)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS.with_overrides(concurrency_limit=1), registry=registry)
    poller = worker.node.worker
    listening = poller.listening
    wait_for(lambda: listening is not None and listening(), what="the worker to listen")

    at_room, go = threading.Event(), threading.Event()
    room = poller._room

    def stalled_room() -> int:
        free = room()
        if free > 0 and not at_room.is_set():
            at_room.set()
            go.wait(30)
        return free

    monkeypatch.setattr(poller, "_room", stalled_room)
    busy: list[tuple[int, int]] = []

    def claimed(node_id: str, partitions: Any = (), **_: Any) -> None:
        # What the poller's claim won, and the slots free for it (before it submits them).
        if node_id == worker.node.node_id and partitions:
            busy.append((len(partitions), poller.executor.free_slots()))

    points.install("node.claimed", claimed)
    run = None
    try:
        poller.wake()
        assert at_room.wait(30), "the poller never looked at its room"
        run = in_thread(lambda: master.launch("placed", {"run": 3}))
        assert gate.entered.wait(60), "no partition started"
        wait_for(lambda: poller._offers, timeout=30, what="the other partition offered")
        go.set()
        # The poller goes on with the room it read: give its claim (if any) time to land.
        wait_for(lambda: busy, timeout=3, what="a claim")
    except TimeoutError:
        pass
    finally:
        points.remove("node.claimed", claimed)
        go.set()
        gate.go.set()
    if run is not None:
        run["thread"].join(60)
    assert all(won <= free for won, free in busy), (
        f"the poller's claim won more than the free slots (won, free): {busy}; capacity 1, the "
        f"placed run holds the slot"
    )
