"""Partitions run as their wake-up carried them (``dbcluster/cluster/placed.py``): an idle node
runs a partition of a transactional step before claiming it, and its first transaction claims
it. One that moved before that transaction commits leaves nothing of the run; one whose first
transaction runs long is claimed beside it; a failing one is recorded as any other.

PostgreSQL only: its wake-ups (LISTEN/NOTIFY) are the only ones that carry a payload."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select, update

from dbcluster.batch import Job, PartitionStep, RepeatStatus, TaskletStep
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import placed
from dbcluster.schema import partitions
from dbcluster.states import (
    PARTITION_CLAIMED,
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_PENDING,
)
from dbcluster.testing import points
from dbcluster.testing.app import FAST_SETTINGS, RangePartitioner, build_registry, ledger
from dbcluster.testing.app import one_row_tasklet as write_row
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import record_events
from dbcluster.testing.waiting import in_thread, wait_for

pytestmark = pytest.mark.backends("postgresql")

#: No stealing while a test holds a partition's first transaction open.
SETTINGS = FAST_SETTINGS.with_overrides(work_stealing_delay=60_000)


def placed_registry(
    body: Any, *, transactional: bool = True, count: int = 1, transferable: bool = True
) -> Any:
    """The test application's registry with the job ``placed``: ``count`` partitions of a
    tasklet step running ``body``."""
    registry = build_registry()
    worker = TaskletStep("placed.worker", body, transactional=transactional)
    partitioner = RangePartitioner(transferable, count, count)
    registry.register(Job("placed", [PartitionStep("placed.master", worker, partitioner)]))
    return registry


def _rows(backend: Backend, job_execution_id: int) -> list[Any]:
    with backend.engine.connect() as conn:
        return list(
            conn.execute(
                select(ledger.c.step_execution_id, ledger.c.attempt).where(
                    ledger.c.job_execution_id == job_execution_id
                )
            ).all()
        )


def partition_row(backend: Backend, step_execution_id: int) -> Any:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(partitions.c.status, partitions.c.assigned_node, partitions.c.attempt).where(
                partitions.c.step_execution_id == step_execution_id
            )
        ).one()


class _Seen:
    """The partitions that reached a point (a handler, removed by :meth:`remove`)."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.ids: list[int] = []
        points.install(point, self._seen)

    def _seen(self, partitions: Any = (), **_: Any) -> None:
        # Ids (a placed run's), or what a claim won (ClaimedPartition).
        for p in partitions:
            self.ids.append(int(p.partition.step_execution_id if hasattr(p, "partition") else p))

    def remove(self) -> None:
        points.remove(self.point, self._seen)


def listening_worker(make_cluster: Any, registry: Any, settings: Any = SETTINGS) -> Any:
    """A worker node that listens for wake-ups already (a placement made before would only be
    found by its poll, and claimed)."""
    worker = make_cluster(settings, registry=registry)
    listening = worker.node.worker.listening
    wait_for(lambda: listening is not None and listening(), what="the worker to listen")
    return worker


def _launch(master: Any, run: int) -> tuple[Any, list[int], list[int]]:
    """Launch ``placed``: the execution, the ids run before a claim, the ids claimed."""
    ran, claimed = _Seen("node.placed_run"), _Seen("node.claimed")
    try:
        execution = master.launch("placed", {"run": run})
    finally:
        ran.remove()
        claimed.remove()
    return execution, ran.ids, claimed.ids


@pytest.mark.parametrize("count", [1, 3])
def test_an_idle_node_runs_a_transactional_partition_as_its_wake_up_carried_it(
    backend: Backend, make_cluster: Any, count: int
) -> None:
    """A lone partition (placed by the statement that creates it) and three (placed together):
    each runs once, before any claim, and ends COMPLETED under its first attempt."""
    registry = placed_registry(write_row, count=count)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    listening_worker(make_cluster, registry)
    execution, ran, claimed = _launch(master, count)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = _rows(backend, execution.id)
    assert sorted(r.step_execution_id for r in rows) == sorted(ran), (rows, ran)
    assert len(ran) == count and claimed == []
    for sid in ran:
        assert tuple(partition_row(backend, sid))[0::2] == (PARTITION_COMPLETED, 1)


def test_a_step_not_declared_transactional_is_claimed_first(
    backend: Backend, make_cluster: Any
) -> None:
    registry = placed_registry(write_row, transactional=False)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    listening_worker(make_cluster, registry)
    execution, ran, claimed = _launch(master, 1)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert ran == [] and len(claimed) == 1
    assert len(_rows(backend, execution.id)) == 1


def test_with_carried_wakeups_off_a_transactional_partition_is_claimed_first(
    backend: Backend, make_cluster: Any
) -> None:
    """``carried_wakeups=False`` (job parameters with secrets): wake-ups name ids only."""
    off = SETTINGS.with_overrides(carried_wakeups=False)
    registry = placed_registry(write_row)
    master = make_cluster(off, registry=registry, work=False)
    listening_worker(make_cluster, registry, off)
    execution, ran, claimed = _launch(master, 1)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert ran == [] and len(claimed) == 1


class _Gate:
    """A body that writes its row, then waits in its transaction (its first call only) until
    the test lets it go on."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.calls = 0
        self.step_execution_id: int | None = None

    def body(self, ctx: ChunkContext) -> RepeatStatus:
        self.calls += 1
        write_row(ctx)
        if self.calls == 1:
            self.step_execution_id = ctx.step_execution.id
            self.entered.set()
            assert self.go.wait(60), "the test never let the body go on"
        return RepeatStatus.FINISHED


def test_a_partition_that_moved_before_its_first_commit_leaves_nothing_of_the_run(
    backend: Backend, make_cluster: Any
) -> None:
    """While the run's first transaction is open, the partition is handed back (as a leaving or
    withdrawn node's are: unassigned, next attempt). The run's guard then finds neither its
    node nor its attempt: its row never commits, and the partition runs again under attempt 2,
    once."""
    gate = _Gate()
    registry = placed_registry(gate.body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = listening_worker(make_cluster, registry)
    recorder = record_events(worker.node)
    run = in_thread(lambda: master.launch("placed", {"run": 1}))
    try:
        assert gate.entered.wait(60), "the partition never started"
        sid = gate.step_execution_id
        assert sid is not None
        with backend.engine.begin() as conn:
            moved = conn.execute(
                update(partitions)
                .where(
                    partitions.c.step_execution_id == sid,
                    partitions.c.status == PARTITION_PENDING,
                    partitions.c.attempt == 1,
                )
                .values(assigned_node=None, attempt=partitions.c.attempt + 1)
            ).rowcount
        assert moved == 1, "the partition was claimed before its first transaction committed"
    finally:
        gate.go.set()
    run["thread"].join(60)
    assert not run["thread"].is_alive(), "the job did not end"
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = _rows(backend, execution.id)
    assert [(r.step_execution_id, r.attempt) for r in rows] == [(sid, 2)], rows
    lost = recorder.named("lost")
    assert [e["step_execution_id"] for e in lost if "moved" in e["reason"]] == [sid], lost


def test_a_long_first_transaction_is_claimed_beside_it(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition reads CLAIMED (no node may take it as unclaimed) while its first
    transaction is still open; that transaction then commits it COMPLETED."""
    monkeypatch.setattr(placed, "CLAIM_PLACED_AFTER_MS", 100)
    gate = _Gate()
    registry = placed_registry(gate.body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    listening_worker(make_cluster, registry)
    run = in_thread(lambda: master.launch("placed", {"run": 1}))
    try:
        assert gate.entered.wait(60), "the partition never started"
        sid = gate.step_execution_id
        assert sid is not None
        wait_for(
            lambda: partition_row(backend, sid).status == PARTITION_CLAIMED,
            timeout=30,
            what="the running partition claimed beside its transaction",
        )
    finally:
        gate.go.set()
    run["thread"].join(60)
    assert not run["thread"].is_alive(), "the job did not end"
    assert run["result"].status is BatchStatus.COMPLETED, run["result"].exit_status
    assert [(r.step_execution_id, r.attempt) for r in _rows(backend, run["result"].id)] == [
        (sid, 1)
    ]
    assert partition_row(backend, sid).status == PARTITION_COMPLETED


def test_a_failing_placed_partition_is_recorded_failed(backend: Backend, make_cluster: Any) -> None:
    """Its transaction rolls back (its row with it); its end is written from PENDING."""

    def body(ctx: ChunkContext) -> RepeatStatus:
        write_row(ctx)
        raise RuntimeError("the body failed")

    registry = placed_registry(body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    listening_worker(make_cluster, registry)
    execution, ran, claimed = _launch(master, 1)
    assert execution.status is BatchStatus.FAILED
    assert len(ran) == 1 and claimed == []
    assert _rows(backend, execution.id) == []
    assert tuple(partition_row(backend, ran[0]))[0::2] == (PARTITION_FAILED, 1)


def test_the_commit_order_check_accepts_a_placed_run_s_own_claim() -> None:
    """The fault harness's commit-order invariant: a transaction reads its partition row just
    before its COMMIT; a placed run whose final write goes with its COMMIT reads it still
    PENDING on its own node under its own attempt (its guard comes after, in the same flight).
    PENDING under another attempt, or on another node, is a partition that moved."""
    from types import SimpleNamespace

    from dbcluster.testing.invariants import commit_in_order

    def row(node: str, token: int, status: str) -> Any:
        return SimpleNamespace(
            kind="partition", node_id="n1", token=1, final=True,
            seen_node=node, seen_token=token, seen_status=status,
        )  # fmt: skip

    assert commit_in_order(row("n1", 1, PARTITION_PENDING))
    assert commit_in_order(row("n1", 1, PARTITION_CLAIMED))
    assert not commit_in_order(row("n1", 2, PARTITION_PENDING))
    assert not commit_in_order(row("n2", 1, PARTITION_PENDING))
