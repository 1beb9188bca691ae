"""A job finishes through any single failure with nobody at the keyboard: master takeover,
partition retry and partition timeouts (in-process nodes; the process tests are in
test_takeover_processes.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select

from dbcluster.batch.domain import utcnow
from dbcluster.batch.status import BatchStatus
from dbcluster.monitor import job_detail
from dbcluster.schema import job_coordination, job_masters, partitions
from dbcluster.testing.app import FAST_SETTINGS, items_written, ledger, master_effects, runs
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import freeze, record_events
from dbcluster.testing.waiting import in_thread, wait_for

#: A master paused for longer than 4 s is removed; its job is taken over within a scan after.
SETTINGS = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)


def _rows(backend: Backend, table: Any, job_execution_id: int | None = None) -> list[Any]:
    with backend.engine.connect() as conn:
        stmt = select(table)
        if job_execution_id is not None:
            stmt = stmt.where(table.c.job_execution_id == job_execution_id)
        return conn.execute(stmt).all()


def _masters(backend: Backend, job_execution_id: int) -> list[tuple[int, str, str]]:
    return [
        (r.master_epoch, r.master_node, r.reason)
        for r in sorted(_rows(backend, job_masters, job_execution_id), key=lambda r: r.master_epoch)
    ]


def test_a_frozen_master_s_partitioned_step_is_taken_over_and_completes(
    backend: Backend, make_cluster: Any
) -> None:
    master = make_cluster(SETTINGS, work=False)
    workers = [make_cluster(SETTINGS), make_cluster(SETTINGS)]
    recorders = [record_events(w.node) for w in workers]
    run = in_thread(lambda: master.launch("ledger", {"run": 1, "delay_ms": 3000, "tick_ms": 50}))
    wait_for(lambda: len(_rows(backend, runs)) >= 4, what="the partitions to start")
    old_id = master.node.node_id
    with freeze(master.node):
        wait_for(
            lambda: any(r.named("took_over") for r in recorders),
            timeout=30,
            what="a survivor to take the job over",
        )
        job_id = next(d for r in recorders for d in r.named("took_over"))["job_execution_id"]
        wait_for(
            lambda: not workers[0].repository.get_job_execution(job_id).is_running,
            timeout=30,
            what="the job to end under its new master",
        )
    execution = workers[0].repository.get_job_execution(job_id)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    parts = _rows(backend, partitions, job_id)
    # Partitions running on live workers ran on, under their first attempt.
    assert {p.status for p in parts} == {"COMPLETED"} and {p.attempt for p in parts} == {1}
    effects = Counter(r.partition_name for r in _rows(backend, ledger, job_id))
    assert len(effects) == len(parts) and set(effects.values()) == {1}
    history = _masters(backend, job_id)
    assert history[0] == (1, old_id, "launched")
    assert history[1][0] == 2 and history[1][2] == "takeover"
    assert history[1][1] in {w.node.ids[0] for w in workers}
    with backend.engine.connect() as conn:
        coordination = conn.execute(select(job_coordination)).one()
    assert (coordination.status, coordination.master_epoch) == ("COMPLETED", 2)
    # The old master wakes up, writes nothing, and its launch follows the job to its end.
    run["thread"].join(30)
    assert not run["thread"].is_alive()
    assert run["result"].status is BatchStatus.COMPLETED
    detail = job_detail(backend.engine, job_id)
    assert [(m.epoch, m.reason) for m in detail.masters] == [(1, "launched"), (2, "takeover")]


def test_a_chunk_step_its_master_ran_resumes_after_its_last_commit(
    backend: Backend, make_cluster: Any
) -> None:
    master = make_cluster(SETTINGS, work=False)
    survivor = make_cluster(SETTINGS)
    recorder = record_events(survivor.node)
    run = in_thread(lambda: master.launch("ledger-chunks", {"run": 2, "item_ms": 6}))
    wait_for(lambda: len(_rows(backend, items_written)) >= 150, what="a few chunks to commit")
    with freeze(master.node):
        wait_for(lambda: recorder.named("took_over"), timeout=30, what="the takeover")
        job_id = recorder.named("took_over")[0]["job_execution_id"]
        wait_for(
            lambda: not survivor.repository.get_job_execution(job_id).is_running,
            timeout=60,
            what="the job to end under its new master",
        )
    assert survivor.repository.get_job_execution(job_id).status is BatchStatus.COMPLETED
    written = Counter(r.item for r in _rows(backend, items_written, job_id))
    assert set(written) == set(range(1000)) and set(written.values()) == {1}, (
        "a committed chunk was done again, or an item was lost"
    )
    by_epoch = Counter(r.epoch for r in _rows(backend, items_written, job_id))
    assert set(by_epoch) == {1, 2}, by_epoch
    assert len(_rows(backend, master_effects, job_id)) == 1
    run["thread"].join(30)
    assert run["result"].status is BatchStatus.COMPLETED


def test_a_partition_that_fails_twice_with_a_retryable_error_completes_on_its_third_try(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(SETTINGS)
    make_cluster(SETTINGS)
    execution = cluster.launch(
        "ledger-retry", {"run": 3, "flaky": "r-000000-000125", "flaky_until": 3}
    )
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    parts = {p.partition_name: p for p in _rows(backend, partitions, execution.id)}
    assert parts["r-000000-000125"].attempt == 3
    assert {p.attempt for n, p in parts.items() if n != "r-000000-000125"} == {1}
    effects = [r for r in _rows(backend, ledger, execution.id)]
    assert [(r.partition_name, r.attempt) for r in effects if r.attempt != 1] == [
        ("r-000000-000125", 3)
    ]
    assert len(effects) == len(parts)
    detail = job_detail(backend.engine, execution.id)
    assert {p.name: p.attempt for p in detail.partitions}["r-000000-000125"] == 3


def test_a_partition_that_keeps_failing_fails_its_job_after_its_last_try(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(SETTINGS)
    execution = cluster.launch(
        "ledger-retry", {"run": 4, "flaky": "r-000000-000250", "flaky_until": 9}
    )
    assert execution.status is BatchStatus.FAILED
    parts = {p.partition_name: p for p in _rows(backend, partitions, execution.id)}
    assert (parts["r-000000-000250"].status, parts["r-000000-000250"].attempt) == ("FAILED", 3)


def test_a_non_transferable_or_plainly_failing_partition_is_not_tried_again(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(SETTINGS)
    execution = cluster.launch("ledger-retry", {"run": 5, "fail": "r-000000-000250"})
    assert execution.status is BatchStatus.FAILED
    parts = {p.partition_name: p for p in _rows(backend, partitions, execution.id)}
    assert parts["r-000000-000250"].attempt == 1, "a RuntimeError is not declared retryable"


def test_a_partition_that_stalls_past_its_timeout_is_fenced_and_completes_elsewhere(
    backend: Backend, make_cluster: Any
) -> None:
    first = make_cluster(SETTINGS)
    make_cluster(SETTINGS)
    recorder = record_events(first.node)
    execution = first.launch(
        "ledger-retry",
        {"run": 6, "stall": "r-000000-000125", "stall_ms": 4000, "delay_ms": 100},
    )
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert recorder.named("timed_out"), "the master did not time the partition out"
    stalled = {p.partition_name: p for p in _rows(backend, partitions, execution.id)}
    assert stalled["r-000000-000125"].attempt == 2
    effects = Counter(r.partition_name for r in _rows(backend, ledger, execution.id))
    assert effects["r-000000-000125"] == 1, "the stalled try committed after it was fenced"


def test_an_execution_that_lost_a_partition_with_its_node_is_restarted_automatically(
    backend: Backend, make_cluster: Any
) -> None:
    master = make_cluster(SETTINGS, work=False)
    victim, _other = make_cluster(SETTINGS), make_cluster(SETTINGS)
    run = in_thread(
        lambda: master.launch("ledger-autorestart", {"run": 7, "delay_ms": 1500, "tick_ms": 50})
    )
    wait_for(
        lambda: any(r.node_id in victim.node.ids for r in _rows(backend, runs)),
        what="the victim to run a partition",
    )
    with freeze(victim.node):
        run["thread"].join(60)
        first = run["result"]
        assert first.status is BatchStatus.FAILED and first.exit_status.code == "NODE_LOST"
        wait_for(
            lambda: _latest(master, first).id != first.id and not _latest(master, first).is_running,
            timeout=60,
            what="a node to restart the execution and finish it",
        )
    restarted = _latest(master, first)
    assert restarted.status is BatchStatus.COMPLETED, restarted.exit_status
    assert restarted.execution_context.get("dbcluster.auto_restarts") == 1


def test_an_execution_that_failed_for_its_own_reason_is_not_restarted(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(SETTINGS)
    first = cluster.launch("ledger-autorestart", {"run": 8, "fail": "*"})
    assert first.status is BatchStatus.FAILED and first.exit_status.code == "FAILED"
    # Past its backoff, a restarter's scan leaves it alone.
    wait_for(lambda: (utcnow() - first.end_time).total_seconds() > 1.0, what="the backoff to pass")
    cluster.node.services.get("restarter").run_once()
    assert not cluster.background._relaunching
    assert _latest(cluster, first).id == first.id


def _latest(cluster: Any, execution: Any) -> Any:
    return cluster.repository.get_job_executions(execution.job_instance)[0]


def test_a_node_still_taking_a_job_over_leaves_its_next_recovery_to_another_node(
    backend: Backend, make_cluster: Any
) -> None:
    """A node whose earlier takeover of a job has not ended (an old identity's thread, still
    winding down) must not claim the job again: ``take_over`` ignores a job already under way,
    so the claim would leave the row RECOVERING under a live node that runs nothing, and the
    job would hang. Another node takes it over and finishes it."""
    master = make_cluster(SETTINGS, work=False)
    # The lingering node scans for stranded jobs ten times as often as the other, so without
    # the rule it would win the claim.
    lingering = make_cluster(SETTINGS.with_overrides(stranded_master_scan_interval=50))
    other = make_cluster(SETTINGS.with_overrides(stranded_master_scan_interval=500))
    run = in_thread(lambda: master.launch("ledger", {"run": 5, "delay_ms": 1500, "tick_ms": 50}))
    wait_for(lambda: len(_rows(backend, runs)) >= 4, what="the partitions to start")
    with backend.engine.connect() as conn:
        job_id = conn.execute(select(job_coordination.c.job_execution_id)).scalar_one()
    # As if an earlier identity's takeover of the job were still running:
    with lingering.background._lock:
        lingering.background._taking_over.add(job_id)
    with freeze(master.node):
        wait_for(
            lambda: len(_masters(backend, job_id)) >= 2,
            timeout=30,
            what="a survivor to claim the stranded job",
        )
        assert _masters(backend, job_id)[1][1] == other.node.node_id
        wait_for(
            lambda: not other.repository.get_job_execution(job_id).is_running,
            timeout=30,
            what="the job to end under its new master",
        )
    assert other.repository.get_job_execution(job_id).status is BatchStatus.COMPLETED
    with lingering.background._lock:
        lingering.background._taking_over.discard(job_id)
    run["thread"].join(30)
    assert not run["thread"].is_alive()
