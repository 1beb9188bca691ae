"""What the scenarios share: their parameters, small statistics, and the metering of round trips
in a counting pass."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from dbcluster.batch import JobRegistry
from dbcluster.batch.domain import JobExecution
from dbcluster.bench import counting
from dbcluster.bench.harness import Tap, WorkerPool, worker_pool
from dbcluster.bench.wire import summarize
from dbcluster.cluster import Cluster
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.testing.waiting import wait_for


@dataclass
class Params:
    partitions: int = 1000
    workers: int = 4
    latency_runs: int = 50
    #: Launches of ``latency`` run first, untimed: the master and the workers have run jobs
    #: before, as in a running cluster (and as the peer queue's workers have in
    #: ``benchmarks/peers.py``, whose latency follows its drain on the same workers).
    latency_warmup: int = 20
    idle_seconds: float = 15.0
    idle_nodes: int = 4
    scale_nodes: tuple[int, ...] = (2, 5, 10, 20)
    scale_partitions: int = 400
    #: Partitions each node runs at once in ``scale``: 20 nodes x (this + the node's own
    #: coordination connections) must fit the server's connection limit.
    scale_concurrency: int = 2
    chunk_rows: int = 1_000_000
    chunk_size: int = 1000
    drain_partitions: int = 2000
    drain_workers: int = 2
    drain_concurrency: int = 4
    #: Threads of the hand-written baseline of ``drain`` (2 workers x 4, by default).
    baseline_threads: int = 8
    ceiling_nodes: tuple[int, ...] = (50, 200, 500, 1000)
    ceiling_seconds: float = 30.0
    #: Load-generator processes of ``ceiling`` (each runs its share of the nodes).
    ceiling_processes: int = field(default_factory=lambda: os.cpu_count() or 1)
    #: Threads of each load-generator process that run its nodes' calls.
    ceiling_threads: int = 24
    #: ``one`` node (the lease holder) sweeps and scans for stranded masters, or ``every``.
    ceiling_maintenance: str = "one"
    #: Whether simulated nodes' wake-ups arrive (where the database has them): they then poll
    #: every ``wakeup_poll_interval`` (their heartbeats carrying a poll each); else every
    #: ``task_polling_interval`` (a node behind a pooler without ``listen_url``).
    ceiling_listening: bool = True
    #: Simulated nodes connect without session settings or server-side prepared statements
    #: (through PgBouncer 1.18 in transaction mode).
    ceiling_plain: bool = False
    #: Whether the scenarios that run partitions repeat their run through the round-trip
    #: counters (the wire proxy, or SQLite's trace).
    counting: bool = True
    settings: ClusterSettings = field(default_factory=ClusterSettings.from_env)


def per(counts: dict[str, int], n: int) -> dict[str, float]:
    return {k: round(v / n, 3) for k, v in counts.items() if not k.startswith(" ")}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}


def add(*parts: dict[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0) + v
    return total


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_for(condition, timeout, what, poll=0.01)


class Meter:
    """The round trips a tap counts while ``with`` blocks run (added up over several):
    :attr:`master` (the bench process) and :attr:`workers` (the worker processes of ``pool``).
    Without a tap it counts nothing."""

    def __init__(self, tap: Tap | None, pool: WorkerPool | None = None) -> None:
        self.tap, self.pool = tap, pool
        self.master: dict[str, int] = {}
        self.workers: dict[str, int] = {}
        self._before: tuple[dict[str, int], dict[str, int]] = ({}, {})

    def _read(self) -> tuple[dict[str, int], dict[str, int]]:
        if self.tap is None:
            return {}, {}
        workers: dict[str, int] = {}
        if self.pool is not None:
            if self.tap.remote is None:
                self.pool.settle()
            workers = self.tap.worker_round_trips(self.pool)
        return self.tap.local.snapshot(), workers

    def __enter__(self) -> Meter:
        self._before = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        master, workers = self._read()
        self.master = add(self.master, delta(master, self._before[0]))
        self.workers = add(self.workers, delta(workers, self._before[1]))

    @property
    def total(self) -> dict[str, int]:
        return add(self.master, self.workers)


def round_trip_report(tap: Tap | None, meter: Meter, n: int, unit: str) -> dict[str, Any]:
    """Round trips and commits per ``unit`` (``partition``, ``row``, ``launch``): in all, and
    for the worker processes and the bench process (the master) apart."""
    if tap is None:
        return {"source": "not counted: no round-trip counter for this database"}
    report: dict[str, Any] = {"source": tap.source, f"per_{unit}": summarize(meter.total, n)}
    if meter.workers:
        report[f"workers_per_{unit}"] = summarize(meter.workers, n)
        report[f"master_per_{unit}"] = summarize(meter.master, n)
    return report


def headline(report: dict[str, Any], unit: str) -> dict[str, Any]:
    """The two figures every scenario that runs partitions shows at its top level."""
    found = report.get(f"per_{unit}")
    if not found:
        return {}
    return {
        f"round_trips_per_{unit}": found["round_trips"],
        f"commits_per_{unit}": found["commits"],
    }


@dataclass
class ClusterRun:
    """One job launched by a master in the bench process onto worker processes."""

    seconds: float
    execution: JobExecution
    #: SQLAlchemy's statement events, master and workers (the breakdown by table and verb);
    #: empty when the run did not count them.
    statements: dict[str, int]
    #: The round trips, when the run went through a tap.
    meter: Meter


def cluster_run(
    db: str,
    engine: Engine,
    registry: JobRegistry,
    settings: ClusterSettings,
    job: str,
    params: dict[str, Any],
    *,
    workers: int,
    concurrency: int | None = None,
    tap: Tap | None = None,
    register_timeout: float = 60,
    count_statements: bool | None = None,
) -> ClusterRun:
    """Start ``workers`` worker processes, launch ``job`` from a master in this process
    (``work=False, take_over=False``), time the launch call to the job's end, stop the workers.
    Through ``tap`` (master and workers connected through it) when given. ``engine`` is a direct
    engine on ``db`` for the harness's own reads. SQLAlchemy's statement events are counted
    (``statements``) in a counting pass (through ``tap``) unless ``count_statements`` says
    otherwise; a timed pass runs without their listeners."""
    if count_statements is None:
        count_statements = tap is not None
    worker_url = tap.worker_url if tap is not None else db
    env = tap.worker_env if tap is not None else {}
    with (
        counting.statements_counted(count_statements),
        worker_pool(worker_url, settings, env, count_statements=count_statements) as pool,
    ):
        pool.start(workers, concurrency=concurrency)
        pool.wait_registered(engine, workers, timeout=register_timeout)
        master_engine = make_engine(tap.url) if tap is not None else engine
        try:
            with Cluster(master_engine, registry, settings, work=False, take_over=False) as cluster:
                pool.settle()
                before = pool.counts()
                counting.reset()
                with Meter(tap, pool) as meter:
                    started = time.perf_counter()
                    execution = cluster.launch(job, params)
                    seconds = time.perf_counter() - started
                master_statements = counting.snapshot()
            pool.settle()
            statements = add(delta(pool.counts(), before), master_statements)
        finally:
            if master_engine is not engine:
                master_engine.dispose()
    return ClusterRun(seconds, execution, statements, meter)
