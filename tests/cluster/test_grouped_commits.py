"""Grouped commits (docs/cluster.md): short partitions of a tasklet step declared
``transactional`` run several to one transaction on a slot, with one guarded final write that
must change exactly one partition row per member; anything that keeps one member from ending
there rolls the whole group back, and each member then runs alone.

Each interleaving parks a group just before its final write (``group.before_final_write``), so
the fault lands while the group's transaction is open and holds none of its partition rows."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from dbcluster.batch import Job, PartitionStep, TaskletStep
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import grouping
from dbcluster.cluster.grouping import Grouping
from dbcluster.cluster.store.claims import Claims
from dbcluster.schema import partitions
from dbcluster.states import PARTITION_CLAIMED, PARTITION_FAILED
from dbcluster.testing import points
from dbcluster.testing.app import (
    FAST_SETTINGS,
    RangePartitioner,
    build_registry,
    ledger,
    one_row_tasklet,
)
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import record_events
from dbcluster.testing.waiting import in_thread, wait_for

#: One slot: partitions wait for it, so a claim takes several for a group.
SETTINGS = FAST_SETTINGS.with_overrides(concurrency_limit=1, commit_group_size=4)
COUNT = 24
#: Interleavings that write beside a parked group: SQLite's one writer would wait for it (the
#: group holds the database's write lock, and so every partition row, until it ends).
SERVERS = pytest.mark.backends("postgresql", "mariadb", "mysql")


@pytest.fixture(autouse=True)
def _short_on_any_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions count as short however loaded the host is: these tests are about what a
    group does, not about when a node starts grouping."""
    monkeypatch.setattr(grouping, "GROUP_BELOW_MS", 60_000)


def _registry(body: Any, *, transactional: bool = True, transferable: bool = True) -> Any:
    registry = build_registry()
    worker = TaskletStep("grouped.worker", body, transactional=transactional)
    partitioner = RangePartitioner(transferable, COUNT, COUNT)
    registry.register(Job("grouped", [PartitionStep("grouped.master", worker, partitioner)]))
    return registry


def _written(backend: Backend, job_execution_id: int) -> list[Any]:
    with backend.engine.connect() as conn:
        return list(
            conn.execute(
                select(ledger.c.step_execution_id, ledger.c.node_id).where(
                    ledger.c.job_execution_id == job_execution_id
                )
            ).all()
        )


def _group_sizes() -> tuple[list[int], Any]:
    """The size of every group that reached its final write (a point handler, to remove)."""
    sizes: list[int] = []

    def seen(step_executions: Any, **_: Any) -> None:
        sizes.append(len(step_executions))

    points.install("group.before_final_write", seen)
    return sizes, seen


def _parked_group(**details: Any) -> bool:
    return len(details["step_executions"]) >= 2


def _launch_grouped(backend: Backend, make_cluster: Any, registry: Any, run: int) -> list[int]:
    """Launch ``grouped`` on a master and one worker; check it completed with each partition's
    row written once; the sizes of the groups that reached their final write."""
    master = make_cluster(SETTINGS, registry=registry, work=False)
    make_cluster(SETTINGS, registry=registry)
    sizes, handler = _group_sizes()
    try:
        execution = master.launch("grouped", {"run": run})
    finally:
        points.remove("group.before_final_write", handler)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    written = _written(backend, execution.id)
    assert len(written) == COUNT and len({r.step_execution_id for r in written}) == COUNT
    return sizes


def test_short_partitions_of_a_transactional_step_commit_in_groups(
    backend: Backend, make_cluster: Any
) -> None:
    def body(ctx: ChunkContext) -> None:
        one_row_tasklet(ctx)

    sizes = _launch_grouped(backend, make_cluster, _registry(body), 1)
    assert sizes and max(sizes) >= 2 and max(sizes) <= 4, sizes


def test_a_step_not_declared_transactional_is_never_grouped(
    backend: Backend, make_cluster: Any
) -> None:
    registry = _registry(one_row_tasklet, transactional=False)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    make_cluster(SETTINGS, registry=registry)
    sizes, handler = _group_sizes()
    try:
        execution = master.launch("grouped", {"run": 2})
    finally:
        points.remove("group.before_final_write", handler)
    assert execution.status is BatchStatus.COMPLETED
    assert sizes == []
    assert len(_written(backend, execution.id)) == COUNT


def test_non_transferable_partitions_of_a_transactional_step_take_effect_once(
    backend: Backend, make_cluster: Any
) -> None:
    sizes = _launch_grouped(
        backend, make_cluster, _registry(one_row_tasklet, transferable=False), 3
    )
    assert sizes and max(sizes) >= 2


@SERVERS
def test_a_member_moved_before_the_final_write_rolls_the_whole_group_back(
    backend: Backend, make_cluster: Any
) -> None:
    """One member of a parked group is failed by its master meanwhile (as after its node was
    judged dead): the group's final write changes one row fewer than it has members, so
    nothing of the group commits; each member then runs alone: the moved one is refused by its
    own fence (lost, its write not committed), the others complete."""
    registry = _registry(one_row_tasklet)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    recorder = record_events(worker.node)
    with points.parked("group.before_final_write", _parked_group) as park:
        run = in_thread(lambda: master.launch("grouped", {"run": 4}))
        members = park.wait(timeout=60)[0]["step_executions"]
        moved = members[-1].id
        with backend.engine.begin() as conn:
            changed = conn.execute(
                update(partitions)
                .where(
                    partitions.c.step_execution_id == moved,
                    partitions.c.status == PARTITION_CLAIMED,
                )
                .values(status=PARTITION_FAILED)
            ).rowcount
        assert changed == 1, "the member's row was held before the group's final write"
    run["thread"].join(60)
    assert not run["thread"].is_alive(), "the job did not end"
    assert run["result"].status is BatchStatus.FAILED
    written = {r.step_execution_id for r in _written(backend, run["result"].id)}
    assert moved not in written, "a group committed the write of a member that had moved"
    assert written == {se.id for se in members if se.id != moved} | (
        written - {se.id for se in members}
    )
    assert len(_written(backend, run["result"].id)) == COUNT - 1
    lost = recorder.named("lost")
    assert [e["step_execution_id"] for e in lost if "moved" in e["reason"]] == [moved], lost
    # Any other member lost is one whose own node fenced itself meanwhile (a loaded machine's
    # heartbeat stalled past the bound), never one the group's rollback cost.
    others = [e for e in lost if e["step_execution_id"] != moved]
    assert all("fenced" in e["reason"] for e in others), others


class _InGroup:
    """Which member of its transaction a body is (1: the first, 2: the second of a group)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.transaction: Any = None
        self.count = 0

    def position(self, ctx: ChunkContext) -> int:
        with self.lock:
            transaction = ctx.connection.get_transaction()
            if transaction is not self.transaction:
                self.transaction, self.count = transaction, 0
            self.count += 1
            return self.count


def test_a_body_failing_in_one_member_rolls_the_group_back_and_each_runs_alone(
    backend: Backend, make_cluster: Any
) -> None:
    """The second member of the first group fails (every time): the group rolls back, each
    member runs alone: the failing one fails alone (its job FAILED), the others complete, each
    effect committed once although every member's body ran twice."""
    in_group = _InGroup()
    failing: list[int] = []
    calls: dict[int, int] = {}

    def body(ctx: ChunkContext) -> None:
        se = ctx.step_execution
        position = in_group.position(ctx)
        calls[se.id] = calls.get(se.id, 0) + 1
        one_row_tasklet(ctx)
        if position == 2 and not failing:
            failing.append(se.id)
        if se.id in failing:
            raise RuntimeError("this member's body fails")

    registry = _registry(body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    recorder = record_events(worker.node)
    execution = master.launch("grouped", {"run": 5})
    assert execution.status is BatchStatus.FAILED
    assert len(failing) == 1, "no group formed"
    written = [r.step_execution_id for r in _written(backend, execution.id)]
    assert failing[0] not in written
    assert len(written) == COUNT - 1 == len(set(written)), written
    assert calls[failing[0]] >= 2, "the failing member did not run again alone"
    failed = recorder.named("failed")
    assert [e["step_execution_id"] for e in failed] == failing, recorder.names()


@SERVERS
def test_a_stop_request_during_a_groups_bodies_ends_its_members_alone(
    backend: Backend, make_cluster: Any
) -> None:
    """A stop request that reaches the node while a group's second body runs: that member
    concludes STOPPED, so the group rolls back (nothing of it commits, the first member's
    write included) and each member ends alone, as a partition of a stopping job does."""
    in_group = _InGroup()
    parked = threading.Event()
    resume = threading.Event()
    members: list[Any] = []

    def body(ctx: ChunkContext) -> None:
        one_row_tasklet(ctx)
        if in_group.position(ctx) == 2 and not parked.is_set():
            members.append(ctx.step_execution)
            parked.set()
            resume.wait(30)

    registry = _registry(body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    make_cluster(SETTINGS, registry=registry)
    run = in_thread(lambda: master.launch("grouped", {"run": 6}))
    try:
        assert parked.wait(30), "no group formed"
        job = members[0].job_execution
        master.stop_execution(job.id)
        wait_for(lambda: job.stop_requested, 15, "the node to learn of the stop request")
    finally:
        resume.set()
    run["thread"].join(60)
    assert not run["thread"].is_alive(), "the job did not end"
    assert run["result"].status is BatchStatus.STOPPED, run["result"].status
    written = {r.step_execution_id for r in _written(backend, run["result"].id)}
    assert members[0].id not in written, "a stopped member's write committed"
    with backend.engine.connect() as conn:
        statuses = dict(
            conn.execute(
                select(partitions.c.step_execution_id, partitions.c.status).where(
                    partitions.c.job_execution_id == run["result"].id
                )
            ).all()
        )
    assert statuses[members[0].id] == PARTITION_FAILED, statuses


@SERVERS
def test_a_group_of_a_node_fenced_before_its_final_write_commits_nothing(
    backend: Backend, make_cluster: Any
) -> None:
    """The node fences itself while a group waits before its final write: nothing of the group
    commits under that identity; the partitions run again elsewhere once it is removed."""
    registry = _registry(one_row_tasklet)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    # Two workers: the other one takes the partitions over.
    workers = [make_cluster(SETTINGS, registry=registry) for _ in range(2)]
    with points.parked("group.before_final_write", _parked_group) as park:
        run = in_thread(lambda: master.launch("grouped", {"run": 7}))
        details = park.wait(timeout=60)[0]
        members = [se.id for se in details["step_executions"]]
        fence = details["step_executions"][0].fence
        identities = [w.node.context.membership.current for w in workers]
        (worker, identity), *_ = [
            (w, i)
            for w, i in zip(workers, identities, strict=True)
            if i is not None and i.node_id == fence.node_id
        ]
        worker.node.context.fence(identity, "a test fences it")
    run["thread"].join(90)
    assert not run["thread"].is_alive(), "the job did not end"
    assert run["result"].status is BatchStatus.COMPLETED, run["result"].exit_status
    written = _written(backend, run["result"].id)
    by_fenced = [r.step_execution_id for r in written if r.node_id == fence.node_id]
    assert not set(members) & set(by_fenced), "a fenced node's group committed"
    assert len(written) == COUNT and len({r.step_execution_id for r in written}) == COUNT


def test_the_grouping_needs_a_known_one_call_step_and_short_runs() -> None:
    class Executor:
        recent_run_ms: float | None = None
        registry = _registry(one_row_tasklet)

    chooser = Grouping(Executor(), 4)  # type: ignore[arg-type]
    assert not chooser.qualifies("grouped.worker")  # no run yet
    Executor.recent_run_ms = 5.0
    assert not chooser.qualifies("grouped.worker")  # not known to end in one call
    chooser._one_call["grouped.worker"] = True
    assert chooser.qualifies("grouped.worker")
    Executor.recent_run_ms = 120_000.0
    assert not chooser.qualifies("grouped.worker")
    Executor.recent_run_ms = 5.0
    assert not Grouping(Executor(), 1).qualifies("grouped.worker")


def test_a_slot_whose_group_committed_claims_its_next_group_itself(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll reads a group's worth more per slot than it claims; a slot whose group
    committed claims the next group from those with a claim of its own (on its own thread),
    instead of freeing up and waiting for the poller's next poll and claim. Every partition
    still takes effect once."""
    claimers: list[str] = []
    claim = Claims.claim

    def recorded(self: Claims, node_id: str, load: int, ids: Any, *args: Any, **kw: Any) -> Any:
        if ids:
            claimers.append(threading.current_thread().name)
        return claim(self, node_id, load, ids, *args, **kw)

    monkeypatch.setattr(Claims, "claim", recorded)
    sizes = _launch_grouped(backend, make_cluster, _registry(one_row_tasklet), 8)
    assert sizes and max(sizes) >= 2, sizes
    # The poller's claims run on its thread ("dbcluster-poll"); a slot's on the executor's.
    assert any(name.startswith("dbcluster-part") for name in claimers), claimers


def test_a_slots_claim_that_landed_but_failed_runs_what_it_won(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot's claim of its next group whose commit landed though the claim raised is read
    back, and what it won runs (else the job would hang on partitions CLAIMED by a live
    node that does not run them)."""
    landed: list[int] = []
    claim = Claims.claim

    def landing_then_failing(
        self: Claims, node_id: str, load: int, ids: Any, *args: Any, **kw: Any
    ) -> Any:
        won = claim(self, node_id, load, ids, *args, **kw)
        if won and len(landed) < 8 and threading.current_thread().name.startswith("dbcluster-part"):
            landed.extend(w.partition.step_execution_id for w in won)
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return won

    monkeypatch.setattr(Claims, "claim", landing_then_failing)
    run = in_thread(lambda: _launch_grouped(backend, make_cluster, _registry(one_row_tasklet), 9))
    run["thread"].join(timeout=60)
    assert not run["thread"].is_alive(), "partitions a failed slot claim won never ran"
    assert "error" not in run, run.get("error")
    assert landed, "no slot's claim landed and failed"
