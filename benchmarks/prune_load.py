"""Prune a large repository while a node works: does the cluster notice?

1. Writes history into a scratch database of the server behind ``--url``: ``--partitions``
   partitions in old COMPLETED executions of ``--per-execution`` partitions each (executemany),
   and what prune must keep: instances whose newest execution FAILED (with an older COMPLETED
   one) and young executions. (An execution in flight is the in-suite tests' case: here the
   node would recover a fake one.)
2. Starts a node (in this process) that launches a small no-op partitioned job back to back and
   claims its partitions, and records every heartbeat (gap between two, round trip) and every
   claim (its statement's time, and the delay from placement to claim).
3. Measures ``--baseline`` seconds of that, then runs ``dbcluster prune --older-than 30d`` in
   another process, and measures the same while it runs.
4. Checks that what should go went and what must stay stayed, and prints the numbers.

    python benchmarks/prune_load.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
    python benchmarks/prune_load.py --url mariadb+pymysql://root@127.0.0.1:3306/test --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from dbcluster import schema
from dbcluster.batch import JobRegistry
from dbcluster.bench.app import NOOP_WORKER, noop_job
from dbcluster.bench.harness import scratch_database
from dbcluster.cluster import Cluster, ClusterSettings
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.maintenance.pruner import Pruner
from dbcluster.cluster.settings import parse_age
from dbcluster.dialects import make_engine
from dbcluster.testing.history import add_execution


class Recorder(ClusterEvents):
    """Heartbeats and claims, with the monotonic time they happened."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.heartbeats: list[tuple[float, float]] = []  # (when, round trip s)
        self.placed_at: dict[str, float] = {}
        self.claim_delays: list[tuple[float, float]] = []  # (when, placement -> claim s)
        self.pruned_counts: dict[str, int] = {}

    def pruned(self, node_id: str, counts: dict[str, int], seconds: float) -> None:
        self.pruned_counts = dict(counts)

    def heartbeat(self, node_id: str, seconds: float) -> None:
        with self.lock:
            self.heartbeats.append((time.monotonic(), seconds))

    def placed(self, master: str, job_execution_id: int, mse: int, placement: dict) -> None:
        now = time.monotonic()
        with self.lock:
            for name in placement:
                self.placed_at[name] = now

    def claimed(self, node_id: str, partition: str, step_execution_id: int, attempt: int) -> None:
        now = time.monotonic()
        name = partition.split(":", 1)[-1]
        with self.lock:
            placed = self.placed_at.get(name) or self.placed_at.get(partition)
            if placed is not None:
                self.claim_delays.append((now, now - placed))


def window(rec: Recorder, claims: list[tuple[float, float]], start: float, end: float) -> dict:
    with rec.lock:
        beats = [b for b in rec.heartbeats if start <= b[0] <= end]
        delays = sorted(d for t, d in rec.claim_delays if start <= t <= end)
    times = [t for t, _ in beats]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    claim_s = sorted(d for t, d in claims if start <= t <= end)

    def pct(values: list[float], p: float) -> float | None:
        return (
            round(values[min(len(values) - 1, int(p * len(values)))] * 1000, 1) if values else None
        )

    return {
        "seconds": round(end - start, 1),
        "heartbeats": len(beats),
        "heartbeat_gap_max_ms": round(max(gaps) * 1000, 1) if gaps else None,
        "heartbeat_round_trip_max_ms": round(max(r for _, r in beats) * 1000, 1) if beats else None,
        "claims": len(delays),
        "claim_delay_p50_ms": pct(delays, 0.5),
        "claim_delay_p99_ms": pct(delays, 0.99),
        "claim_delay_max_ms": round(delays[-1] * 1000, 1) if delays else None,
        "claim_statement_max_ms": round(claim_s[-1] * 1000, 1) if claim_s else None,
        "claim_statement_p99_ms": pct(claim_s, 0.99),
    }


def write_history(url: str, partitions: int, per_execution: int) -> dict[str, Any]:
    engine = make_engine(url)
    started = time.monotonic()
    gone, kept = [], []
    try:
        for i in range(max(1, partitions // per_execution)):
            gone.append(
                add_execution(engine, "history", f"old-{i}", partitions_count=per_execution)
            )
        for i in range(5):
            # Newest execution FAILED: the instance may be restarted, all of it stays.
            kept.append(add_execution(engine, "history", f"failed-{i}", partitions_count=50))
            kept.append(
                add_execution(
                    engine,
                    "history",
                    f"failed-{i}",
                    status="FAILED",
                    partition_status="FAILED",
                    partitions_count=50,
                )
            )
            kept.append(
                add_execution(
                    engine,
                    "history",
                    f"young-{i}",
                    ended_ago=timedelta(days=2),
                    partitions_count=50,
                )
            )
    finally:
        engine.dispose()
    return {
        "gone": [w.execution_id for w in gone],
        "kept": [w.execution_id for w in kept],
        "seconds": round(time.monotonic() - started, 1),
    }


def count(url: str, table: Any, *where: Any) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
            )
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--per-execution", type=int, default=1000)
    parser.add_argument("--baseline", type=float, default=10.0, help="Seconds measured first.")
    parser.add_argument("--job-partitions", type=int, default=8, help="Partitions per launch.")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--in-node",
        action="store_true",
        help="Prune as the node's own Pruner (--prune-after) does, in the working node's "
        "process, instead of `dbcluster prune` in another process.",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with scratch_database(args.url) as url:
        history = write_history(url, args.partitions, args.per_execution)
        partitions_before = count(url, schema.partitions)
        registry = JobRegistry(steps=[NOOP_WORKER])
        registry.register(noop_job(args.job_partitions, "tick"))
        settings = ClusterSettings.from_env(
            node_id_prefix="prune-load",
            concurrency_limit=4,
            task_polling_interval=200,
            heartbeat_interval=500,
            unreachable_threshold=5000,
            cleanup_threshold=15000,
        )
        cluster = Cluster(url, registry, settings)
        rec = Recorder()
        cluster.node.events.subscribe(rec)
        claims: list[tuple[float, float]] = []
        store = cluster.node.store
        claim = store.claim

        def timed_claim(*a: Any, **kw: Any) -> Any:
            began = time.monotonic()
            try:
                return claim(*a, **kw)
            finally:
                now = time.monotonic()
                claims.append((now, now - began))

        store.claim = timed_claim  # type: ignore[method-assign]
        stop = threading.Event()
        launches = [0]

        def launcher() -> None:
            while not stop.is_set():
                cluster.launch("tick", {"run": launches[0]})
                launches[0] += 1

        cluster.start()
        thread = threading.Thread(target=launcher, daemon=True)
        thread.start()
        try:
            time.sleep(1.0)  # warm up (not measured)
            base_start = time.monotonic()
            time.sleep(args.baseline)
            base_end = time.monotonic()
            prune_start = time.monotonic()
            if args.in_node:
                pruner = Pruner(
                    cluster.node.store,
                    settings.with_overrides(prune_after=parse_age("30d")),
                    cluster.node.events,
                    cluster.node.usable_identity,
                )
                pruner.policy = replace(pruner.policy, batch_size=args.batch_size)
                pruner.run_once()
                prune_end = time.monotonic()
                pruned = {
                    "executions": rec.pruned_counts.get("batch_job_execution", 0),
                    "rows": rec.pruned_counts,
                    "longest_transaction_s": None,
                }
            else:
                command = [
                    sys.executable,
                    "-m",
                    "dbcluster.cli",
                    "prune",
                    "--url",
                    url,
                    "--older-than",
                    "30d",
                    "--batch-size",
                    str(args.batch_size),
                    "--json",
                ]
                proc = subprocess.run(command, capture_output=True, text=True, timeout=3600)
                prune_end = time.monotonic()
                if proc.returncode != 0:
                    raise SystemExit(f"prune failed: {proc.stderr.strip()}")
                pruned = json.loads(proc.stdout)
            time.sleep(1.0)
        finally:
            stop.set()
            thread.join(60)
            cluster.stop()
        je = schema.job_execution
        left_gone = count(url, je, je.c.job_execution_id.in_(history["gone"]))
        left_kept = count(url, je, je.c.job_execution_id.in_(history["kept"]))
        partitions_after = count(url, schema.partitions)
        ticks = count(url, je, je.c.job_execution_id.not_in(history["gone"] + history["kept"]))
        report = {
            "backend": make_engine(url).dialect.name,
            "pruned_by": "the node's Pruner" if args.in_node else "dbcluster prune (a process)",
            "history": {
                "partitions": partitions_before,
                "executions_to_prune": len(history["gone"]),
                "executions_to_keep": len(history["kept"]),
                "insert_s": history["seconds"],
            },
            "prune": {
                "wall_s": round(prune_end - prune_start, 1),
                "executions": pruned["executions"],
                "rows": sum(pruned["rows"].values()),
                "rows_per_table": pruned["rows"],
                "longest_transaction_ms": None
                if pruned["longest_transaction_s"] is None
                else round(pruned["longest_transaction_s"] * 1000, 1),
            },
            "checks": {
                "old_executions_left": left_gone,
                "kept_executions_left": f"{left_kept}/{len(history['kept'])}",
                "partitions_left": partitions_after,
                "node_launches_during_run": launches[0],
                "node_executions_untouched": ticks,
            },
            "baseline": window(rec, claims, base_start, base_end),
            "during_prune": window(rec, claims, prune_start, prune_end),
        }
        ok = left_gone == 0 and left_kept == len(history["kept"]) and ticks >= launches[0]
        report["ok"] = ok
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            for section, values in report.items():
                if isinstance(values, dict):
                    print(f"{section}:")
                    for key, value in values.items():
                        print(f"  {key}: {value}")
                else:
                    print(f"{section}: {values}")
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
