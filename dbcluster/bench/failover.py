"""The failover scenario: how long a stopped, killed or frozen node's partitions and a killed
master's job take to move on, on short thresholds."""

from __future__ import annotations

import signal
import time
from typing import Any

from sqlalchemy import func, select

from dbcluster.bench.app import build_registry, sleepy_job
from dbcluster.bench.common import Params, wait
from dbcluster.bench.harness import scratch_database, worker_pool
from dbcluster.cluster import Cluster, ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import partitions

#: Thresholds for the failover scenario (short, so it finishes in seconds).
FAILOVER_SETTINGS = ClusterSettings(
    heartbeat_interval=500,
    task_polling_interval=200,
    unreachable_threshold=2000,
    cleanup_threshold=4000,
    sweep_interval=500,
    master_check_interval=100,
    orphan_check_interval=500,
    stranded_master_scan_interval=500,
    node_id_prefix="bench",
)


# --- failover -----------------------------------------------------------------------------------


def _rows(engine: Any, job_execution_id: int) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            select(partitions).where(partitions.c.job_execution_id == job_execution_id)
        ).all()


def failover(url: str | None, p: Params) -> dict[str, Any]:
    """SIGKILL a node running transferable partitions: time until they run elsewhere. SIGTERM a
    node with unstarted partitions: time until those run elsewhere. SIGKILL a node with
    unstarted partitions: time until those start elsewhere. SIGKILL a job's master: time until
    a survivor takes the job over."""
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
                "stranded_master_scan_interval": s.stranded_master_scan_interval,
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
            victim_node = wait(
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

            wait(moved, floor_ms / 1000 + 30, "the killed node's partitions to move")
            kill_ms = (time.perf_counter() - killed) * 1000
            thread.join(timeout=job_ms / 1000 + 60)
            results["sigkill"] = {
                "partitions_moved": len(running),
                "recovery_ms": round(kill_ms),
                "over_floor_ms": round(kill_ms - floor_ms),
                "job_status": holder["ex"].status.value if "ex" in holder else "unknown",
            }
            # A node that runs one partition at a time holds unstarted ones when it goes.
            count, term_ms, status = _unstarted_after(engine, cluster, pool, signal.SIGTERM, 2, 30)
            results["sigterm"] = {
                "unstarted_partitions": count,
                "handoff_ms": round(term_ms),
                "job_status": status,
            }
            count, kill_ms, status = _unstarted_after(engine, cluster, pool, signal.SIGKILL, 3, 60)
            # Live nodes may claim a silent node's unstarted partitions as soon as it has not
            # heartbeaten for the unreachable threshold: within a second of it.
            bound_ms = s.unreachable_threshold + 1000
            results["sigkill_unstarted"] = {
                "unstarted_partitions": count,
                "start_elsewhere_ms": round(kill_ms),
                "bound_ms": bound_ms,
                "over_bound_ms": round(kill_ms - bound_ms),
                "job_status": status,
            }
            results["master_sigkill"] = _master_takeover(db, engine, s)
        engine.dispose()
    return results


def _unstarted_after(
    engine: Any, cluster: Cluster, pool: Any, sig: signal.Signals, run: int, timeout_s: float
) -> tuple[int, float, str]:
    """Start a node that runs one partition at a time, launch the sleepy job, and once the node
    runs a partition send it ``sig``: the partitions it had not started, the milliseconds until
    each of them runs on another node, and the job's status."""
    import threading

    node = pool.start(1, concurrency=1)[0]
    pool.wait_registered(engine, 3)
    holder: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: holder.update(ex=cluster.launch("sleepy", {"ms": 1500, "r": run})),
        daemon=True,
    )
    thread.start()
    prefix = f"bench{node.index}-"

    def placed_on_node(status: str) -> list[int]:
        return [
            r.step_execution_id
            for r in _rows_all(engine)
            if (r.assigned_node or "").startswith(prefix) and r.status == status
        ]

    wait(lambda: placed_on_node("CLAIMED"), 60, "the node to start a partition")
    unstarted = placed_on_node("PENDING")
    node.process.send_signal(sig)
    sent = time.perf_counter()

    def started_elsewhere() -> bool:
        rows = {r.step_execution_id: r for r in _rows_all(engine)}
        return all(
            rows[i].status in ("CLAIMED", "COMPLETED")
            and not (rows[i].assigned_node or "").startswith(prefix)
            for i in unstarted
        )

    wait(started_elsewhere, timeout_s, f"the unstarted partitions to run elsewhere ({sig.name})")
    moved_ms = (time.perf_counter() - sent) * 1000
    thread.join(timeout=60)
    return len(unstarted), moved_ms, holder["ex"].status.value if "ex" in holder else "unknown"


def _master_takeover(db: str, engine: Any, s: ClusterSettings) -> dict[str, Any]:
    """SIGKILL the master of a running job (a ``dbcluster launch`` process): time until a
    survivor takes the job over (its first write) and until the job completes, in the same
    execution, with its running partitions left where they run."""
    import os
    import subprocess
    import sys

    from dbcluster.bench.harness import settings_env
    from dbcluster.dialects import get_provider
    from dbcluster.schema import job_execution, job_masters

    floor_ms = s.cleanup_threshold + s.stranded_master_scan_interval
    with engine.connect() as conn:
        before = conn.execute(select(func.max(job_execution.c.job_execution_id))).scalar() or 0
    master = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dbcluster.cli",
            "launch",
            "--url",
            db,
            "--app",
            "dbcluster.bench.app:registry",
            "sleepy",
            f"ms(int)={floor_ms + 4000}",
            "r=3",
            "--no-work",
            "--quiet",
        ],
        env={**os.environ, **settings_env(s), "DBCLUSTER_NODE_ID_PREFIX": "benchmaster"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def running() -> Any:
            with engine.connect() as conn:
                return conn.execute(
                    select(job_execution.c.job_execution_id).where(
                        job_execution.c.job_execution_id > before,
                        job_execution.c.status == "STARTED",
                    )
                ).scalar()

        execution_id = wait(running, 60, "the master to start its job")
        wait(
            lambda: sum(r.status == "CLAIMED" for r in _rows(engine, execution_id)) >= 3,
            60,
            "its partitions to run",
        )
        master.kill()
        with engine.connect() as conn:
            killed_at = conn.execute(get_provider(engine).select_now()).scalar_one()
        killed = time.perf_counter()

        def took_over() -> Any:
            with engine.connect() as conn:
                return conn.execute(
                    select(job_masters.c.since).where(
                        job_masters.c.job_execution_id == execution_id,
                        job_masters.c.reason == "takeover",
                    )
                ).scalar()

        since = wait(took_over, floor_ms / 1000 + 30, "a survivor to take the job over")
        takeover_ms = (since.replace(tzinfo=None) - killed_at.replace(tzinfo=None)).total_seconds()

        def ended() -> Any:
            with engine.connect() as conn:
                status = conn.execute(
                    select(job_execution.c.status).where(
                        job_execution.c.job_execution_id == execution_id
                    )
                ).scalar()
            return status if status not in ("STARTING", "STARTED") else None

        status = wait(ended, 120, "the job to end under its new master")
        done_ms = (time.perf_counter() - killed) * 1000
    finally:
        if master.poll() is None:
            master.kill()
        master.wait()
    attempts = {int(r.attempt) for r in _rows(engine, execution_id)}
    return {
        "floor_ms": floor_ms,
        "takeover_ms": round(takeover_ms * 1000),
        "over_floor_ms": round(takeover_ms * 1000 - floor_ms),
        "kill_to_job_end_ms": round(done_ms),
        "job_status": status,
        "partition_attempts": sorted(attempts),
    }


def _rows_all(engine: Any) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(select(partitions)).all()
