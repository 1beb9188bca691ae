"""Pruning: what goes, what stays, in what order, one node at a time (every backend)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy import func, select

from dbcluster import schema
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.maintenance.leases import PRUNE, Leases
from dbcluster.cluster.maintenance.pruner import (
    FINISHED,
    TABLES,
    PrunePolicy,
    Pruner,
    Pruning,
    parse_statuses,
)
from dbcluster.cluster.settings import ClusterSettings, parse_age
from dbcluster.cluster.store import CoordinationStore
from dbcluster.errors import ConfigurationError
from dbcluster.testing.app import TIME_SCALE
from dbcluster.testing.backends import Backend
from dbcluster.testing.history import Written, add_execution
from dbcluster.testing.waiting import wait_for

DAY = timedelta(days=1)
MONTH_MS = parse_age("30d")


def _executions(backend: Backend) -> set[int]:
    with backend.engine.connect() as conn:
        return {int(r[0]) for r in conn.execute(select(schema.job_execution.c.job_execution_id))}


def _count(backend: Backend, table: str) -> int:
    t = schema.metadata.tables[table]
    with backend.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t)).scalar_one())


def _counts(backend: Backend) -> dict[str, int]:
    return {t: _count(backend, t) for t in TABLES}


def _rows(w: Written, partitions: int, params: int = 2, coordination: bool = True) -> dict:
    """The rows :func:`add_execution` wrote for one execution (instance not included)."""
    return {
        "batch_partitions": partitions,
        "batch_step_execution_context": partitions + 1,
        "batch_step_execution": partitions + 1,
        "batch_job_coordination": int(coordination),
        "batch_job_masters": int(coordination),
        "batch_job_execution_context": 1,
        "batch_job_execution_params": params,
        "batch_job_execution": 1,
    }


def _young_last(backend: Backend) -> Written:
    """A young execution (no policy here prunes it), written after the ones a test prunes: the
    newest of all, which a database that hands a deleted newest row's id out again (SQLite)
    never prunes (see :func:`test_the_newest_execution_is_kept_where_ids_come_back`), so the
    older ones are prunable alike on every database."""
    return add_execution(backend.engine, "young", "last", ended_ago=DAY, partitions_count=1)


def _left(young: Written) -> dict[str, int]:
    """What remains once everything but :func:`_young_last`'s execution is pruned."""
    return {**{t: 0 for t in TABLES}, **_rows(young, 1), "batch_job_instance": 1}


def test_keeps_what_it_must_and_deletes_the_rest(backend: Backend) -> None:
    e = backend.engine
    # Deleted: a completed instance (its instance goes too), and a failed-then-completed one.
    gone_a = add_execution(e, "nightly", "k1", partitions_count=3)
    gone_b1 = add_execution(e, "nightly", "k2", status="FAILED", partition_status="FAILED")
    gone_b2 = add_execution(e, "nightly", "k2")
    # Kept: every execution of an instance whose newest execution FAILED (restart reads them).
    kept_c1 = add_execution(e, "nightly", "k3")
    kept_c2 = add_execution(e, "nightly", "k3", status="FAILED", partition_status="FAILED")
    kept_d = add_execution(e, "nightly", "k4", status="STOPPED")
    # Kept: in flight (no end, running status), and ended but its coordination row in flight.
    kept_e = add_execution(
        e, "nightly", "k5", status="STARTED", ended_ago=None, coordination="STARTED"
    )
    kept_f = add_execution(e, "nightly", "k6", coordination="RECOVERING")
    # Kept: younger than the age.
    kept_g = add_execution(e, "nightly", "k7", ended_ago=DAY)
    before = _counts(backend)
    pruning = Pruning(CoordinationStore(e))
    policy = PrunePolicy(older_than_ms=MONTH_MS, batch_size=2)

    planned = pruning.dry_run(policy)
    assert _counts(backend) == before, "a dry run deletes nothing"
    assert sorted(planned.executions) == sorted(w.execution_id for w in (gone_a, gone_b1, gone_b2))

    done = pruning.prune(policy)
    expected = {t: 0 for t in TABLES}
    for w, n in ((gone_a, 3), (gone_b1, 2), (gone_b2, 2)):
        for table, rows in _rows(w, n).items():
            expected[table] += rows
    expected["batch_job_instance"] = 2
    assert done.counts == expected
    assert planned.counts == expected, "the dry run counted what the prune deleted"
    assert done.finished
    after = _counts(backend)
    assert {t: before[t] - after[t] for t in TABLES} == expected
    assert _executions(backend) == {
        w.execution_id for w in (kept_c1, kept_c2, kept_d, kept_e, kept_f, kept_g)
    }
    # Nothing dangles: every partition, step and context left has its parent.
    with e.connect() as conn:
        se, je = schema.step_execution, schema.job_execution
        orphans = conn.execute(
            select(func.count())
            .select_from(schema.partitions)
            .where(~schema.partitions.c.step_execution_id.in_(select(se.c.step_execution_id)))
        ).scalar_one()
        assert orphans == 0
        assert (
            conn.execute(
                select(func.count())
                .select_from(je)
                .where(~je.c.job_instance_id.in_(select(schema.job_instance.c.job_instance_id)))
            ).scalar_one()
            == 0
        )
    # A second prune finds nothing.
    assert pruning.prune(policy).total == 0


def test_keep_last_and_status_filter(backend: Backend) -> None:
    e = backend.engine
    olds = [add_execution(e, "hourly", f"run{i}", partitions_count=1) for i in range(4)]
    failed = add_execution(e, "hourly", "run-f", status="FAILED", partitions_count=1)
    newest = add_execution(e, "hourly", "run-f", partitions_count=1)  # completed later
    other = add_execution(e, "daily", "d1", partitions_count=1)
    pruning = Pruning(CoordinationStore(e))

    only_failed = PrunePolicy(older_than_ms=MONTH_MS, statuses=("FAILED",))
    assert pruning.prune(only_failed).executions == [failed.execution_id]

    # The two newest executions of each job stay whatever their age.
    keep_two = PrunePolicy(older_than_ms=MONTH_MS, keep_last=2)
    gone = pruning.prune(keep_two).executions
    # hourly's two newest: run-f's completion and run3.
    assert sorted(gone) == [w.execution_id for w in olds[:3]]
    left = _executions(backend)
    assert left == {olds[3].execution_id, newest.execution_id, other.execution_id}
    assert pruning.prune(keep_two).total == 0


def test_stops_between_transactions_and_finishes_later(backend: Backend) -> None:
    e = backend.engine
    written = [add_execution(e, "batchy", f"k{i}", partitions_count=5) for i in range(3)]
    young = _young_last(backend)
    pruning = Pruning(CoordinationStore(e))
    policy = PrunePolicy(older_than_ms=MONTH_MS, batch_size=2)
    asked = 0

    def three_transactions() -> bool:
        nonlocal asked
        asked += 1
        return asked <= 3

    part = pruning.prune(policy, three_transactions)
    assert not part.finished
    assert part.counts["batch_step_execution"] == 6  # three slices of two
    assert part.counts["batch_job_execution"] == 0
    rest = pruning.prune(policy)
    assert rest.finished
    assert part.counts["batch_step_execution"] + rest.counts["batch_step_execution"] == 18
    assert rest.counts["batch_job_execution"] == 3
    assert sorted(rest.executions) == [w.execution_id for w in written]
    assert _counts(backend) == _left(young)


def test_asks_whether_to_go_on_before_every_transaction_but_its_opening_reads(
    backend: Backend,
) -> None:
    """A pruner whose lease lapsed begins nothing after the transaction it is in: between two
    transactions it asks whether to go on, but for the prune's opening reads (the candidates and
    the first slice's step ids, which its caller asked just before). It read the next slice's
    step ids unasked (the empty instances go in their executions' transaction)."""
    e = backend.engine
    for i in range(3):
        add_execution(e, "batchy", f"k{i}", partitions_count=2)
    young = _young_last(backend)
    store = CoordinationStore(e)
    pruning = Pruning(store)
    seen: list[str] = []
    transaction = store.transaction

    def traced(work: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(what)
        return transaction(work, what, *args, **kwargs)

    def keep_going() -> bool:
        seen.append("asked")
        return True

    store.transaction = traced  # type: ignore[method-assign]
    result = pruning.prune(PrunePolicy(older_than_ms=MONTH_MS, batch_size=1), keep_going)
    assert result.finished and len(result.executions) == 3
    unasked = [after for before, after in pairwise(seen) if "asked" not in (before, after)]
    assert unasked == ["prune read steps"], seen
    assert _counts(backend) == _left(young)


class _Recorder(ClusterEvents):
    def __init__(self) -> None:
        self.pruned_by: list[tuple[str, dict[str, int]]] = []

    def pruned(self, node_id: str, counts: dict[str, int], seconds: float) -> None:
        self.pruned_by.append((node_id, counts))


def _leased(
    store: CoordinationStore, settings: ClusterSettings, events: ClusterEvents, node_id: str
) -> tuple[Leases, Pruner]:
    """A node's pruner and the lease service it prunes under (their turns run by the test)."""
    identity = Identity(node_id)
    store.register(node_id, "here", 0)
    leases = Leases(store, settings, lambda: identity)
    pruner = Pruner(store, settings, events, leases.acting(PRUNE))
    leases.want(PRUNE, pruner)
    return leases, pruner


def test_pruners_on_two_nodes_prune_one_at_a_time(backend: Backend) -> None:
    e = backend.engine
    settings = ClusterSettings(prune_after=MONTH_MS, prune_interval=50)
    events = _Recorder()
    nodes = [_leased(CoordinationStore(e), settings, events, f"pruner-{n}") for n in range(2)]
    add_execution(e, "nightly", "a", partitions_count=2)
    young = _young_last(backend)
    # Both nodes look for the lease at once: one takes it, and only its pruner prunes.
    barrier = threading.Barrier(2)

    def run(leases: Leases) -> None:
        barrier.wait()
        leases.run_once()

    threads = [threading.Thread(target=run, args=(leases,)) for leases, _ in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    held = [leases.holding(PRUNE) is not None for leases, _ in nodes]
    assert sorted(held) == [False, True]
    for _, pruner in nodes:
        pruner.run_once()
    assert len(events.pruned_by) == 1
    winner = events.pruned_by[0][0]
    assert winner == f"pruner-{held.index(True)}"
    assert events.pruned_by[0][1]["batch_job_execution"] == 1
    # While the winner holds the lease, the other node prunes nothing.
    b = add_execution(e, "nightly", "b", partitions_count=1)
    nodes[held.index(False)][1].run_once()
    assert len(events.pruned_by) == 1
    assert _executions(backend) == {young.execution_id, b.execution_id}


def test_a_pruner_that_loses_its_lease_mid_prune_stops_and_another_takes_it(
    backend: Backend,
) -> None:
    """The holder's lease service renews no more (frozen) while its pruner is part-way through
    a prune that outlasts the term: the pruner stops after its current transaction, and
    another node takes the lapsed lease within the term (the pruner renewed the lease row
    itself, unguarded, every third of the term, so the lease outlived its holder's lease
    service by up to a term and nobody could take it)."""
    e = backend.engine
    term_ms = round(2000 * TIME_SCALE)
    term_s, slack_s = term_ms / 1000, 0.5 * TIME_SCALE
    settings = ClusterSettings(
        heartbeat_interval=100,
        sweep_interval=100,
        unreachable_threshold=term_ms,
        cleanup_threshold=2 * term_ms,
        prune_after=MONTH_MS,
    )
    events = _Recorder()
    first_leases, first = _leased(CoordinationStore(e), settings, events, "pruner-1")
    second_leases, _ = _leased(CoordinationStore(e), settings, events, "pruner-2")
    taken_at = time.monotonic()
    first_leases.run_once()
    assert first_leases.holding(PRUNE) is not None
    second_leases.run_once()
    assert second_leases.holding(PRUNE) is None
    written = [add_execution(e, "nightly", f"k{i}", partitions_count=5) for i in range(8)]
    assert _count(backend, "batch_step_execution") == 6 * len(written)
    first.policy = PrunePolicy(older_than_ms=MONTH_MS, batch_size=1)
    # Each of its ~60 transactions takes a tenth of the term: the prune outlasts the term.
    began: list[float] = []
    pace = threading.Event()
    transaction = first.store.transaction

    def slow_transaction(work: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        began.append(time.monotonic())
        pace.wait(term_s / 10)
        return transaction(work, what, *args, **kwargs)

    first.store.transaction = slow_transaction  # type: ignore[method-assign]
    pruning = threading.Thread(target=first.run_once)
    pruning.start()
    try:
        looked: list[float] = []

        def taken() -> bool:
            looked.append(time.monotonic())
            second_leases.run_once()
            return second_leases.holding(PRUNE) is not None

        wait_for(taken, term_s + slack_s, "the other node to take the lapsed lease", poll=0.05)
        took_at = looked[-1]
    finally:
        pruning.join(60)
    assert not pruning.is_alive()
    assert took_at - taken_at <= term_s + slack_s
    # It stopped part-way: at most the transaction it was in began after the other took over.
    assert len([b for b in began if b > took_at]) <= 1
    assert _executions(backend), "the pruner did not stop"
    assert _count(backend, "batch_step_execution") < 6 * len(written), "it pruned nothing"


def test_node_prunes_on_its_own(backend: Backend) -> None:
    from dbcluster.cluster.node import Node

    e = backend.engine
    add_execution(e, "nightly", "old", partitions_count=2)
    kept = add_execution(e, "nightly", "young", ended_ago=DAY)
    settings = ClusterSettings(
        heartbeat_interval=200,
        unreachable_threshold=2000,
        cleanup_threshold=4000,
        prune_after=MONTH_MS,
        prune_interval=100,
    )
    node = Node(e, None, settings, capacity=0)
    events = _Recorder()
    node.events.subscribe(events)
    node.start()
    try:
        wait_for(lambda: events.pruned_by, timeout=20, what="the node to prune")
    finally:
        node.stop()
    assert _executions(backend) == {kept.execution_id}


def test_settings_and_inputs() -> None:
    assert parse_age("30d") == 30 * 86_400_000
    assert parse_age("12h") == 12 * 3_600_000
    assert parse_age("90m") == 90 * 60_000
    for bad in ("-5d", "30", "d", "1.5h", "30 days", ""):
        with pytest.raises(ConfigurationError):
            parse_age(bad)
    assert parse_statuses(None) == FINISHED
    assert parse_statuses("completed, FAILED") == ("COMPLETED", "FAILED")
    for bad in ("STARTED", "COMPLETED,NOPE", ","):
        with pytest.raises(ConfigurationError):
            parse_statuses(bad)
    with pytest.raises(ConfigurationError):
        PrunePolicy(older_than_ms=1, keep_last=-1)
    with pytest.raises(ConfigurationError):
        PrunePolicy(older_than_ms=1, batch_size=0)
    env = {"DBCLUSTER_PRUNE_AFTER": "30d"}
    assert ClusterSettings.from_env(env).prune_after == MONTH_MS
    assert ClusterSettings.from_env({"DBCLUSTER_PRUNE_AFTER": "60000"}).prune_after == 60000
    assert ClusterSettings.from_env({}).prune_after is None
    with pytest.raises(ConfigurationError):
        ClusterSettings.from_env({"DBCLUSTER_PRUNE_AFTER": "-1d"})


def test_metrics_count_pruned_rows() -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")
    from dbcluster.metrics import NodeMetrics

    metrics = NodeMetrics()
    metrics.pruned("n", {"batch_partitions": 7, "batch_job_execution": 1, "batch_nodes": 0}, 0.1)
    text = metrics.exposition() if hasattr(metrics, "exposition") else ""
    assert 'dbcluster_pruned_rows_total{table="batch_partitions"} 7.0' in str(text)


def _age_all(backend: Backend, days: int = 40) -> None:
    from sqlalchemy import update

    je = schema.job_execution
    with backend.engine.begin() as conn:
        for row in conn.execute(select(je.c.job_execution_id, je.c.end_time)).all():
            if row.end_time is not None:
                conn.execute(
                    update(je)
                    .where(je.c.job_execution_id == row.job_execution_id)
                    .values(end_time=row.end_time - timedelta(days=days))
                )


def test_a_pruned_repository_still_restarts_a_failed_job(backend: Backend) -> None:
    """Real executions: a FAILED instance keeps its executions through a prune and its restart
    skips the step it completed; once it completed, the next prune takes all of it."""
    from dbcluster.batch import (
        Job,
        JobLauncher,
        JobRepository,
        LocalPartitionHandler,
        RepeatStatus,
        TaskletStep,
    )
    from dbcluster.batch.status import BatchStatus

    runs: list[str] = []
    fail = {"two": True}

    def one(ctx: object) -> RepeatStatus:
        runs.append("one")
        return RepeatStatus.FINISHED

    def two(ctx: object) -> RepeatStatus:
        runs.append("two")
        if fail["two"]:
            raise RuntimeError("two fails the first time")
        return RepeatStatus.FINISHED

    flaky = Job("flaky", [TaskletStep("one", one), TaskletStep("two", two)])
    plain = Job("plain", [TaskletStep("only", lambda ctx: RepeatStatus.FINISHED)])
    launcher = JobLauncher(JobRepository(backend.engine), LocalPartitionHandler(max_workers=2))
    first = launcher.run(flaky, {"day": "2026-10-01"})
    assert first.status is BatchStatus.FAILED
    done = launcher.run(plain, {"day": "2026-10-01"})
    assert done.status is BatchStatus.COMPLETED
    _age_all(backend)
    young = _young_last(backend)
    pruning = Pruning(CoordinationStore(backend.engine))
    policy = PrunePolicy(older_than_ms=MONTH_MS)
    assert pruning.prune(policy).executions == [done.id]
    assert _executions(backend) == {first.id, young.execution_id}

    fail["two"] = False
    runs.clear()
    second = launcher.run(flaky, {"day": "2026-10-01"})
    assert second.status is BatchStatus.COMPLETED
    assert runs == ["two"], "the restart skipped the step the pruned-around execution completed"
    _age_all(backend)  # the young execution too: it goes now, a younger one stands last
    younger = _young_last(backend)
    gone = pruning.prune(policy)
    assert sorted(gone.executions) == sorted([first.id, second.id, young.execution_id])
    assert gone.counts["batch_job_instance"] == 1
    assert _counts(backend) == _left(younger)


def test_the_newest_execution_is_kept_where_ids_come_back(backend: Backend) -> None:
    """Where the database hands a deleted newest row's id out again (SQLite), the newest
    execution of all is never pruned, so no execution id is ever handed out twice; elsewhere
    it goes like any other."""
    e = backend.engine
    older = add_execution(e, "nightly", "a", partitions_count=1)
    newest = add_execution(e, "nightly", "b", partitions_count=1)
    gone = Pruning(CoordinationStore(e)).prune(PrunePolicy(older_than_ms=MONTH_MS))
    if backend.provider.reuses_ids:
        assert gone.executions == [older.execution_id]
        assert _executions(backend) == {newest.execution_id}
    else:
        assert sorted(gone.executions) == [older.execution_id, newest.execution_id]
        assert _executions(backend) == set()
    later = add_execution(e, "nightly", "c", partitions_count=1)
    assert later.execution_id > newest.execution_id


def test_the_newest_step_execution_is_kept_where_ids_come_back(backend: Backend) -> None:
    """An execution that made a step execution after a later execution's (a long job's next
    step) holds the newest step execution id: where ids come back (SQLite) it is not pruned
    either, so no step execution id is handed out twice (a node keys the partitions it holds
    by it); elsewhere it goes."""
    e = backend.engine
    long_job = add_execution(e, "long", "a", partitions_count=1)
    newest = add_execution(e, "short", "b", partitions_count=1)
    se = schema.step_execution
    with e.begin() as conn:
        old = conn.execute(
            select(se.c.create_time).where(se.c.job_execution_id == long_job.execution_id)
        ).scalar()
        conn.execute(
            se.insert().values(
                version=1,
                step_name="long.worker:p9",
                job_execution_id=long_job.execution_id,
                create_time=old,
                status="COMPLETED",
            )
        )
        newest_step = conn.execute(select(func.max(se.c.step_execution_id))).scalar_one()
    gone = Pruning(CoordinationStore(e)).prune(PrunePolicy(older_than_ms=MONTH_MS))
    if backend.provider.reuses_ids:
        assert gone.executions == []
        assert _executions(backend) == {long_job.execution_id, newest.execution_id}
    else:
        assert sorted(gone.executions) == [long_job.execution_id, newest.execution_id]
    add_execution(e, "other", "c", partitions_count=1)
    with e.connect() as conn:
        made = conn.execute(select(func.max(se.c.step_execution_id))).scalar_one()
    assert made > newest_step


def test_a_job_launched_after_a_prune_runs_with_its_own_parameters(
    backend: Backend, make_cluster: Any
) -> None:
    """A worker remembers the job executions of the partitions it ran, by id. A prune that
    took every execution once let SQLite hand the next launch the pruned one's id, and the
    worker ran the new job's partitions with the old job's parameters and context."""
    from dbcluster.batch.status import BatchStatus
    from dbcluster.testing.app import FAST_SETTINGS

    master = make_cluster(FAST_SETTINGS, work=False)
    worker = make_cluster(FAST_SETTINGS)
    first = master.launch("ledger", {"run": 1})
    assert first.status is BatchStatus.COMPLETED
    Pruning(master.node.store).prune(PrunePolicy(older_than_ms=0))
    second = master.launch("ledger", {"run": 2})
    assert second.status is BatchStatus.COMPLETED
    assert worker.node.worker is not None
    seen = worker.node.worker.executor.claimed._jobs[second.id]
    assert seen.parameters == second.parameters, "the partitions ran with the old parameters"
    assert second.id != first.id
