"""The benchmark scenarios. Each returns a dict of figures and cleans up after itself."""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    Table,
    func,
    insert,
    select,
)

from dbcluster.batch import (
    ChunkStep,
    IntegerRangePartitioner,
    Job,
    JobLauncher,
    JobRepository,
    LocalPartitionHandler,
    PartitionStep,
    SqlKeyRangeReader,
)
from dbcluster.batch.scope import ChunkContext
from dbcluster.bench import counting
from dbcluster.bench.app import build_registry, sleepy_job
from dbcluster.bench.harness import scratch_database, worker_pool
from dbcluster.cluster import Cluster, ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import partitions, step_execution
from dbcluster.testing.waiting import wait_for

#: Thresholds for the failover scenario (short, so it finishes in seconds).
FAILOVER_SETTINGS = ClusterSettings(
    heartbeat_interval=500,
    task_polling_interval=200,
    unreachable_threshold=2000,
    cleanup_threshold=4000,
    sweep_interval=500,
    master_check_interval=100,
    orphan_check_interval=500,
    stranded_master_scan_interval=2000,
    node_id_prefix="bench",
)


@dataclass
class Params:
    partitions: int = 1000
    workers: int = 4
    latency_runs: int = 50
    idle_seconds: float = 15.0
    idle_nodes: int = 4
    scale_nodes: tuple[int, ...] = (2, 5, 10, 20)
    scale_partitions: int = 400
    #: Partitions each node runs at once in ``scale``: 20 nodes x (this + the node's own
    #: coordination connections) must fit the server's connection limit.
    scale_concurrency: int = 2
    chunk_rows: int = 1_000_000
    chunk_size: int = 1000
    settings: ClusterSettings = field(default_factory=ClusterSettings.from_env)


def _per(counts: dict[str, int], n: int) -> dict[str, float]:
    return {k: round(v / n, 3) for k, v in counts.items() if not k.startswith(" ")}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}


def _add(*parts: dict[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0) + v
    return total


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_for(condition, timeout, what, poll=0.01)


# --- overhead -----------------------------------------------------------------------------------


def overhead(url: str | None, p: Params) -> dict[str, Any]:
    """P no-op partitions on K worker processes, against the same job run in one process by
    LocalPartitionHandler (K threads)."""
    settings = p.settings
    counting.install()
    with scratch_database(url) as db:
        registry = build_registry(p.partitions)
        engine = make_engine(db)
        counting.reset()
        started = time.perf_counter()
        local = JobLauncher(JobRepository(engine), LocalPartitionHandler(p.workers)).run(
            registry.get_job("noop"), {"run": "local"}
        )
        local_s = time.perf_counter() - started
        local_counts = counting.snapshot()
        with worker_pool(db, settings) as pool:
            pool.start(p.workers)
            pool.wait_registered(engine, p.workers)
            before = pool.counts()
            counting.reset()
            with Cluster(engine, registry, settings, work=False) as cluster:
                started = time.perf_counter()
                execution = cluster.launch("noop", {"run": "cluster"})
                cluster_s = time.perf_counter() - started
                master_counts = counting.snapshot()
            time.sleep(0.5)  # the workers' last counts reach their files
            worker_counts = _delta(pool.counts(), before)
        engine.dispose()
    # The idle traffic of the workers during the run (heartbeats, sweeps) is included.
    cluster_counts = _add(worker_counts, master_counts)
    n = p.partitions
    extra = (cluster_counts.get("total", 0) - local_counts.get("total", 0)) / n
    return {
        "partitions": n,
        "workers": p.workers,
        "local": {
            "status": local.status.value,
            "wall_s": round(local_s, 3),
            "partitions_per_s": round(n / local_s, 1),
            "statements_per_partition": _per(local_counts, n),
        },
        "cluster": {
            "status": execution.status.value,
            "wall_s": round(cluster_s, 3),
            "partitions_per_s": round(n / cluster_s, 1),
            "statements_per_partition": _per(cluster_counts, n),
            "statement_detail_per_partition": {
                k.strip(): round(v / n, 3) for k, v in cluster_counts.items() if k.startswith(" ")
            },
        },
        "extra_statements_per_partition": round(extra, 3),
        "throughput_ratio_cluster_to_local": round(local_s / cluster_s, 3),
    }


# --- latency ------------------------------------------------------------------------------------


def latency(url: str | None, p: Params) -> dict[str, Any]:
    """Idle nodes already running; a one-partition job launched ``latency_runs`` times."""
    settings = p.settings
    with scratch_database(url) as db:
        registry = build_registry(1)
        engine = make_engine(db)
        start_lat, done_lat = [], []
        with worker_pool(db, settings) as pool:
            pool.start(2)
            pool.wait_registered(engine, 2)
            with Cluster(engine, registry, settings, work=False) as cluster:
                for run in range(p.latency_runs):
                    launched = datetime.now(UTC).replace(tzinfo=None)
                    t0 = time.perf_counter()
                    execution = cluster.launch("noop-one", {"run": run})
                    done_lat.append(time.perf_counter() - t0)
                    with engine.connect() as conn:
                        started = conn.execute(
                            select(step_execution.c.start_time).where(
                                step_execution.c.job_execution_id == execution.id,
                                step_execution.c.step_name.like("noop.worker:%"),
                            )
                        ).scalar_one()
                    start_lat.append((started - launched).total_seconds())
        engine.dispose()
    ms = lambda v: round(v * 1000, 1)  # noqa: E731
    return {
        "runs": p.latency_runs,
        "task_polling_interval_ms": settings.task_polling_interval,
        "launch_to_partition_start_ms": {
            "median": ms(statistics.median(start_lat)),
            "p95": ms(_pct(start_lat, 0.95)),
        },
        "launch_to_job_complete_ms": {
            "median": ms(statistics.median(done_lat)),
            "p95": ms(_pct(done_lat, 0.95)),
        },
    }


# --- failover -----------------------------------------------------------------------------------


def _rows(engine: Any, job_execution_id: int) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            select(partitions).where(partitions.c.job_execution_id == job_execution_id)
        ).all()


def failover(url: str | None, p: Params) -> dict[str, Any]:
    """SIGKILL a node running transferable partitions: time until they run elsewhere. SIGTERM a
    node with unstarted partitions: time until those run elsewhere."""
    s = FAILOVER_SETTINGS
    floor_ms = s.recovery_floor_ms
    with scratch_database(url) as db:
        engine = make_engine(db)
        registry = build_registry(1)
        registry.register(sleepy_job(12))
        results: dict[str, Any] = {
            "thresholds_ms": {
                "heartbeat_interval": s.heartbeat_interval,
                "unreachable_threshold": s.unreachable_threshold,
                "cleanup_threshold": s.cleanup_threshold,
                "orphan_check_interval": s.orphan_check_interval,
            },
            "floor_ms": floor_ms,
        }
        with worker_pool(db, s) as pool, Cluster(engine, registry, s, work=False) as cluster:
            # SIGKILL: partitions long enough to outlive the floor.
            pool.start(3)
            pool.wait_registered(engine, 3)
            job_ms = floor_ms + 4000
            holder: dict[str, Any] = {}
            import threading

            thread = threading.Thread(
                target=lambda: holder.update(ex=cluster.launch("sleepy", {"ms": job_ms, "r": 1})),
                daemon=True,
            )
            thread.start()
            victim_node = _wait(
                lambda: next(
                    (
                        r.assigned_node
                        for r in _rows_all(engine)
                        if r.status == "CLAIMED" and r.assigned_node.startswith("bench0-")
                    ),
                    None,
                ),
                60,
                "node 0 to run a partition",
            )
            running = [
                r.step_execution_id
                for r in _rows_all(engine)
                if r.assigned_node == victim_node and r.status == "CLAIMED"
            ]
            pool.workers[0].process.send_signal(signal.SIGKILL)
            killed = time.perf_counter()

            def moved() -> bool:
                rows = {r.step_execution_id: r for r in _rows_all(engine)}
                return all(
                    rows[i].attempt > 1 and rows[i].status in ("CLAIMED", "COMPLETED")
                    for i in running
                )

            _wait(moved, floor_ms / 1000 + 30, "the killed node's partitions to move")
            kill_ms = (time.perf_counter() - killed) * 1000
            thread.join(timeout=job_ms / 1000 + 60)
            results["sigkill"] = {
                "partitions_moved": len(running),
                "recovery_ms": round(kill_ms),
                "over_floor_ms": round(kill_ms - floor_ms),
                "job_status": holder["ex"].status.value if "ex" in holder else "unknown",
            }
            # SIGTERM: one partition at a time, so the leaver holds unstarted ones.
            leaver = pool.start(1, concurrency=1)[0]
            pool.wait_registered(engine, 3)
            holder = {}
            thread = threading.Thread(
                target=lambda: holder.update(ex=cluster.launch("sleepy", {"ms": 1500, "r": 2})),
                daemon=True,
            )
            thread.start()
            prefix = f"bench{leaver.index}-"
            _wait(
                lambda: any(
                    r.status == "CLAIMED" and (r.assigned_node or "").startswith(prefix)
                    for r in _rows_all(engine)
                ),
                60,
                "the leaver to start a partition",
            )
            unstarted = [
                r.step_execution_id
                for r in _rows_all(engine)
                if (r.assigned_node or "").startswith(prefix) and r.status == "PENDING"
            ]
            leaver.process.send_signal(signal.SIGTERM)
            signalled = time.perf_counter()

            def handed() -> bool:
                rows = {r.step_execution_id: r for r in _rows_all(engine)}
                return all(
                    rows[i].status in ("CLAIMED", "COMPLETED")
                    and not (rows[i].assigned_node or "").startswith(prefix)
                    for i in unstarted
                )

            _wait(handed, 30, "the leaver's unstarted partitions to run elsewhere")
            term_ms = (time.perf_counter() - signalled) * 1000
            thread.join(timeout=60)
            results["sigterm"] = {
                "unstarted_partitions": len(unstarted),
                "handoff_ms": round(term_ms),
                "job_status": holder["ex"].status.value if "ex" in holder else "unknown",
            }
        engine.dispose()
    return results


def _rows_all(engine: Any) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(select(partitions)).all()


# --- idle ---------------------------------------------------------------------------------------


def idle(url: str | None, p: Params) -> dict[str, Any]:
    """Statements per second that idle nodes issue, for 1 node and for N nodes."""
    settings = p.settings
    out: dict[str, Any] = {
        "window_s": p.idle_seconds,
        "settings_ms": {
            "heartbeat_interval": settings.heartbeat_interval,
            "task_polling_interval": settings.task_polling_interval,
            "sweep_interval": settings.sweep_interval,
            "stranded_master_scan_interval": settings.stranded_master_scan_interval,
        },
    }
    with scratch_database(url) as db:
        engine = make_engine(db)
        for n in (1, p.idle_nodes):
            with worker_pool(db, settings) as pool:
                pool.start(n)
                pool.wait_registered(engine, n)
                time.sleep(1.0)  # past start-up
                before = pool.counts()
                time.sleep(p.idle_seconds)
                counts = _delta(pool.counts(), before)
            rate = counts.get("total", 0) / p.idle_seconds
            out[f"nodes_{n}"] = {
                "statements_per_s_total": round(rate, 2),
                "statements_per_s_per_node": round(rate / n, 2),
                "commits_per_s_per_node": round(counts.get("commit", 0) / p.idle_seconds / n, 2),
            }
        engine.dispose()
    return out


# --- scale --------------------------------------------------------------------------------------


def scale(url: str | None, p: Params) -> dict[str, Any]:
    """The same job on 2, 5, 10, 20 worker processes on this machine."""
    settings = p.settings
    out: dict[str, Any] = {
        "partitions": p.scale_partitions,
        "concurrency_per_node": p.scale_concurrency,
        "note": "worker processes on this one machine",
    }
    with scratch_database(url) as db:
        registry = build_registry(p.scale_partitions)
        engine = make_engine(db)
        for n in p.scale_nodes:
            with worker_pool(db, settings) as pool:
                pool.start(n, concurrency=p.scale_concurrency)
                pool.wait_registered(engine, n, timeout=120)
                before = pool.counts()
                counting.install()
                counting.reset()
                with Cluster(engine, registry, settings, work=False) as cluster:
                    t0 = time.perf_counter()
                    execution = cluster.launch("noop", {"nodes": n})
                    wall = time.perf_counter() - t0
                    master_counts = counting.snapshot()
                time.sleep(0.5)
                counts = _add(_delta(pool.counts(), before), master_counts)
            with engine.connect() as conn:
                rows = conn.execute(
                    select(partitions.c.created_time, step_execution.c.start_time)
                    .join(
                        step_execution,
                        step_execution.c.step_execution_id == partitions.c.step_execution_id,
                    )
                    .where(partitions.c.job_execution_id == execution.id)
                ).all()
            claim = [(s - c).total_seconds() * 1000 for c, s in rows if s is not None]
            out[f"nodes_{n}"] = {
                "status": execution.status.value,
                "wall_s": round(wall, 3),
                "partitions_per_s": round(p.scale_partitions / wall, 1),
                "statements_per_s": round(counts.get("total", 0) / wall, 1),
                "claim_latency_p95_ms": round(_pct(claim, 0.95), 1),
            }
        engine.dispose()
    return out


# --- chunk --------------------------------------------------------------------------------------


def chunk(url: str | None, p: Params) -> dict[str, Any]:
    """A chunk step reading a table by key range and writing a row per chunk, against a
    hand-written SQLAlchemy loop doing the same reads and writes."""
    meta = MetaData()
    source = Table(
        "bench_source",
        meta,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("amount", Integer, nullable=False),
    )
    result = Table(
        "bench_result",
        meta,
        Column("first_id", BigInteger, primary_key=True, autoincrement=False),
        Column("rows", Integer, nullable=False),
        Column("total", BigInteger, nullable=False),
    )
    rows, size = p.chunk_rows, p.chunk_size
    with scratch_database(url) as db:
        engine = make_engine(db)
        meta.create_all(engine)
        with engine.begin() as conn:
            for start in range(0, rows, 50_000):
                conn.execute(
                    insert(source),
                    [{"id": i, "amount": i % 100} for i in range(start, min(rows, start + 50_000))],
                )

        def write_summary(items: list[dict[str, Any]], ctx: ChunkContext) -> None:
            ctx.connection.execute(
                insert(result).values(
                    first_id=items[0]["id"], rows=len(items), total=sum(i["amount"] for i in items)
                )
            )

        from dbcluster.batch import item_writer

        worker = ChunkStep(
            "chunk.worker",
            reader=lambda se: SqlKeyRangeReader(
                engine,
                source,
                "id",
                se.execution_context["lo"],
                se.execution_context["hi"],
                page_size=size,
            ),
            writer=item_writer(write_summary),
            chunk_size=size,
        )
        job = Job(
            "chunk",
            [
                PartitionStep(
                    "chunk.master",
                    worker,
                    IntegerRangePartitioner(0, rows, partitions=1, prefix="c-"),
                )
            ],
        )

        def hand_written() -> tuple[float, int]:
            """The same reads (keyset pages in key order) and writes, by hand."""
            t0 = time.perf_counter()
            last = -1
            while True:
                with engine.begin() as conn:
                    page = conn.execute(
                        select(source.c.id, source.c.amount)
                        .where(source.c.id > last, source.c.id < rows)
                        .order_by(source.c.id)
                        .limit(size)
                    ).all()
                    if not page:
                        break
                    conn.execute(
                        insert(result).values(
                            first_id=page[0].id, rows=len(page), total=sum(r.amount for r in page)
                        )
                    )
                    last = page[-1].id
            elapsed = time.perf_counter() - t0
            with engine.begin() as conn:
                total = int(conn.execute(select(func.sum(result.c.total))).scalar_one() or 0)
                conn.execute(result.delete())
            return elapsed, total

        # The baseline runs before and after the framework (the faster run counts), so neither
        # side is favoured by what the freshly loaded table still has in caches or logs.
        first_s, baseline_total = hand_written()
        t0 = time.perf_counter()
        execution = JobLauncher(JobRepository(engine), LocalPartitionHandler(1)).run(job, {"r": 1})
        framework_s = time.perf_counter() - t0
        with engine.begin() as conn:
            framework_total = int(conn.execute(select(func.sum(result.c.total))).scalar_one() or 0)
            conn.execute(result.delete())
        second_s, _ = hand_written()
        baseline_s = min(first_s, second_s)
        meta.drop_all(engine)
        engine.dispose()
    return {
        "rows": rows,
        "chunk_size": size,
        "status": execution.status.value,
        "framework_rows_per_s": round(rows / framework_s),
        "hand_written_rows_per_s": round(rows / baseline_s),
        "ratio_framework_to_hand_written": round(baseline_s / framework_s, 3),
        "totals_agree": framework_total == baseline_total,
    }


SCENARIOS: dict[str, Callable[[str | None, Params], dict[str, Any]]] = {
    "overhead": overhead,
    "latency": latency,
    "failover": failover,
    "idle": idle,
    "scale": scale,
    "chunk": chunk,
}
