"""Several nodes in one process, on every reachable backend, with short thresholds."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from sqlalchemy import select

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import Cluster, LeastLoaded
from dbcluster.schema import job_coordination, nodes, partitions
from dbcluster.testing.app import FAST_SETTINGS, expected_total, ledger
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import freeze, record_events
from dbcluster.testing.waiting import in_thread, wait_for


def ledger_rows(backend: Backend, execution_ids: list[int] | None = None) -> list[Any]:
    with backend.engine.connect() as conn:
        stmt = select(ledger)
        if execution_ids:
            stmt = stmt.where(ledger.c.job_execution_id.in_(execution_ids))
        return conn.execute(stmt).all()


def partition_rows(backend: Backend, job_execution_id: int) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(partitions).where(partitions.c.job_execution_id == job_execution_id)
        ).all()


#: The fast settings with liveness thresholds a loaded machine cannot trip: for tests of the
#: normal path, where a node fencing itself after a starved heartbeat would only move work.
STEADY = replace(FAST_SETTINGS, unreachable_threshold=5000, cleanup_threshold=10000)


def launch_in_thread(cluster: Cluster, job: str, params: dict[str, Any]) -> dict[str, Any]:
    run = in_thread(lambda: cluster.launch(job, params))
    return run


def test_three_nodes_run_a_twelve_partition_job_once_each(backend: Backend, make_cluster) -> None:
    a, b, c = make_cluster(STEADY), make_cluster(STEADY), make_cluster(STEADY)
    execution = a.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = ledger_rows(backend)
    assert len(rows) == 12, "the split was not sized to 3 nodes x 4"
    assert Counter(r.partition_name for r in rows).most_common(1)[0][1] == 1
    assert sum(r.total for r in rows) == expected_total()
    parts = partition_rows(backend, execution.id)
    assert {p.status for p in parts} == {"COMPLETED"} and {p.attempt for p in parts} == {1}
    by_node = Counter(p.assigned_node for p in parts)
    assert set(by_node) == {a.node.node_id, b.node.node_id, c.node.node_id}
    assert set(by_node.values()) == {4}
    # Results aggregate from the repository into the master step.
    master = [s for s in execution.step_executions if s.step_name == "ledger.master"][0]
    assert master.status is BatchStatus.COMPLETED
    with backend.engine.connect() as conn:
        coord = conn.execute(select(job_coordination)).one()
    assert coord.status == "COMPLETED" and coord.master_node == a.node.node_id


def test_least_loaded_keeps_work_off_a_busy_node(backend: Backend, make_cluster) -> None:
    a = make_cluster(strategy=LeastLoaded())
    busy = make_cluster()
    make_cluster()
    # The busy node publishes a high load (as if running another job's partitions).
    with backend.engine.begin() as conn:
        from sqlalchemy import update

        conn.execute(
            update(nodes).where(nodes.c.node_id == busy.node.node_id).values(current_load=50)
        )
    with freeze(busy.node):  # keep its heartbeat from overwriting the load
        execution = a.launch("ledger", {"run": 2})
    assert execution.status is BatchStatus.COMPLETED
    assigned = {p.assigned_node for p in partition_rows(backend, execution.id)}
    assert busy.node.node_id not in assigned


def test_frozen_worker_transferable_move_non_transferable_fail_and_it_rejoins(
    backend: Backend, make_cluster
) -> None:
    # Thresholds a loaded machine does not trip before the freeze: a node that fenced itself
    # for a late heartbeat (SQLite's writer lock can hold one back for most of a second) would
    # lose its partitions before the victim ever held three.
    patient = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)
    master, victim = make_cluster(patient), make_cluster(patient)
    _other = make_cluster(patient)
    recorder = record_events(victim.node)
    old_id = victim.node.node_id
    run = launch_in_thread(master, "ledger-mixed", {"run": 3, "delay_ms": 400})

    def victim_claimed() -> bool:
        mine = [p for p in _all_partitions(backend) if p.assigned_node == old_id]
        return len([p for p in mine if p.status == "CLAIMED"]) >= 3

    wait_for(victim_claimed, what="the victim to claim its partitions")
    frozen = freeze(victim.node)
    time.sleep(0.15)  # a commit already past its checkpoint lands; the rest are parked
    held = {
        p.step_execution_id: p
        for p in _all_partitions(backend)
        if p.assigned_node == old_id and p.status in ("CLAIMED", "PENDING")
    }
    assert any(p.transferable for p in held.values())
    assert any(not p.transferable for p in held.values())
    run["thread"].join(timeout=30)
    assert not run["thread"].is_alive(), "job did not end"
    execution = run["result"]
    parts = {p.partition_name: p for p in partition_rows(backend, execution.id)}
    after_freeze = {p.step_execution_id: p for p in parts.values()}
    moved, lost = [], []
    for sid, before in held.items():
        now = after_freeze[sid]
        if now.attempt == 1 and now.assigned_node == old_id and now.status == "COMPLETED":
            continue  # its last commit was already under way when the node froze
        if before.status == "PENDING":
            # Never claimed: it moves under the same attempt (the removed node cannot claim it).
            assert now.status == "COMPLETED" and now.attempt == 1, now
            assert now.assigned_node != old_id
            moved.append(now)
        elif before.transferable:
            # Claimed: the removal fenced it (next attempt), then it ran elsewhere.
            assert now.status == "COMPLETED" and now.attempt == 2, now
            assert now.assigned_node != old_id
            moved.append(now)
        else:
            assert now.status == "FAILED" and now.attempt == 2 and now.assigned_node == old_id
            lost.append(now)
    assert moved and lost, (moved, lost)
    assert execution.status is BatchStatus.FAILED
    # The victim wakes after it was removed: its writes change nothing, it rejoins anew.
    before = Counter(r.partition_name for r in ledger_rows(backend, [execution.id]))
    frozen.thaw()
    wait_for(lambda: victim.node.node_id != old_id, what="the victim to rejoin")
    executor = victim.node.worker.executor

    def parked_ended() -> bool:  # each parked partition tried its (fenced) commit and ended
        return not any(executor.holds(sid) for sid in held)

    wait_for(parked_ended, what="the victim's parked partitions to end")
    after = Counter(r.partition_name for r in ledger_rows(backend, [execution.id]))
    assert after == before and max(after.values()) == 1
    for p in lost:
        assert p.partition_name not in after, "a non-transferable partition ran after failing"
    with backend.engine.connect() as conn:
        assert (
            conn.execute(select(nodes.c.node_id).where(nodes.c.node_id == old_id)).first() is None
        )
        parts_after = {
            p.partition_name: (p.status, p.assigned_node, p.attempt)
            for p in partition_rows(backend, execution.id)
        }
    assert parts_after == {n: (p.status, p.assigned_node, p.attempt) for n, p in parts.items()}
    kinds = recorder.names()
    assert "fenced" in kinds and kinds.index("fenced") < len(kinds) - 1
    assert not any(
        e == "claimed" and d["node_id"] == old_id
        for e, d in recorder.events[kinds.index("fenced") :]
    )


def _all_partitions(backend: Backend) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(select(partitions)).all()


def test_frozen_master_is_abandoned_once_and_restart_reruns_only_unfinished(
    backend: Backend, make_cluster
) -> None:
    # Thresholds a loaded machine does not trip before the freeze (a node fenced for a late
    # heartbeat would put the job's partitions through moves the test does not expect).
    abandon = FAST_SETTINGS.with_overrides(
        master_failover="abandon", unreachable_threshold=2000, cleanup_threshold=4000
    )
    master, s1, s2 = make_cluster(abandon), make_cluster(abandon), make_cluster(abandon)
    recorders = [record_events(survivor.node) for survivor in (s1, s2)]

    def abandoned() -> list[str]:
        return [d["node_id"] for r in recorders for d in r.named("abandoned")]

    run = launch_in_thread(master, "ledger", {"run": 4, "delay_ms": 700})
    wait_for(
        lambda: (
            len([p for p in _all_partitions(backend) if p.status == "COMPLETED"]) >= 1
            or len([p for p in _all_partitions(backend) if p.status == "CLAIMED"]) >= 6
        ),
        what="the job to be under way",
    )
    frozen = freeze(master.node)
    wait_for(abandoned, what="a survivor to abandon the job")
    with backend.engine.connect() as conn:
        coord = conn.execute(select(job_coordination)).one()
    assert coord.status == "ABANDONED" and coord.master_node in (s1.node.node_id, s2.node.node_id)
    execution_id = coord.job_execution_id
    execution = s1.repository.get_job_execution(execution_id)
    assert execution.status is BatchStatus.FAILED
    assert "lost" in execution.exit_status.description
    time.sleep(0.5)
    assert len(abandoned()) == 1, f"abandoned by {abandoned()}"
    frozen.thaw()
    run["thread"].join(timeout=20)
    assert not run["thread"].is_alive()
    first_run = Counter(r.partition_name for r in ledger_rows(backend, [execution_id]))
    restarted = s1.restart(execution_id)
    assert restarted.status is BatchStatus.COMPLETED, restarted.exit_status
    again = Counter(r.partition_name for r in ledger_rows(backend, [restarted.id]))
    assert not set(again) & set(first_run), "a completed partition ran again"
    total = first_run + again
    assert len(total) == 12 and max(total.values()) == 1
    assert sum(r.total for r in ledger_rows(backend)) == expected_total()


def test_graceful_stop_hands_over_unstarted_partitions_quickly(
    backend: Backend, make_cluster
) -> None:
    from dbcluster.testing.app import FAST_SETTINGS

    slow = FAST_SETTINGS.with_overrides(unreachable_threshold=3000, cleanup_threshold=6000)
    master = make_cluster(slow)
    leaver = make_cluster(slow.with_overrides(concurrency_limit=1))
    run = launch_in_thread(master, "ledger", {"run": 5, "delay_ms": 300})
    wait_for(
        lambda: any(
            p.assigned_node == leaver.node.node_id and p.status == "CLAIMED"
            for p in _all_partitions(backend)
        ),
        what="the leaver to start a partition",
    )
    leaver_id = leaver.node.node_id
    unstarted = [
        p.step_execution_id
        for p in _all_partitions(backend)
        if p.assigned_node == leaver_id and p.status == "PENDING"
    ]
    assert unstarted
    stopped = threading.Thread(target=leaver.node.stop, daemon=True)
    t0 = time.monotonic()
    stopped.start()

    def handed_over() -> bool:
        rows = {p.step_execution_id: p for p in _all_partitions(backend)}
        return all(
            rows[i].assigned_node not in (None, leaver_id) and rows[i].status != "PENDING"
            for i in unstarted
        )

    wait_for(handed_over, timeout=10, what="the unstarted partitions to run elsewhere")
    elapsed_ms = (time.monotonic() - t0) * 1000
    assert elapsed_ms < slow.unreachable_threshold / 2, f"handoff took {elapsed_ms:.0f} ms"
    stopped.join(timeout=10)
    run["thread"].join(timeout=30)
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED
    counts = Counter(r.partition_name for r in ledger_rows(backend, [execution.id]))
    assert len(counts) == 8 and max(counts.values()) == 1
