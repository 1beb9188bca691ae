"""dbcluster beside pgqueuer, on one PostgreSQL server, in one run.

The test a user deciding between dbcluster and a database-backed queue runs first: many tiny
tasks, and one task on idle workers. The task body is one INSERT into a table in both systems.

- drain: 2,000 tasks enqueued in one bulk call (pgqueuer) / a 2,000-partition job launched
  (dbcluster), drained by 2 worker processes running 4 at once each; tasks per second from the
  enqueue (launch) call to the last one done.
- latency: one task enqueued on idle workers, 50 times: enqueue (launch) to body start, median
  and p95. Warm on both sides: pgqueuer's workers and connection have just drained; dbcluster's
  latency runs on worker processes of its own, which first run 20 untimed launches
  (``Params.latency_warmup``). dbcluster's task is a tasklet step declared ``transactional``
  (its one INSERT is in the step's transaction), which an idle node runs as the wake-up
  carried it, claimed by that transaction (``dbcluster/cluster/placed.py``).

This script is not part of the dbcluster package, and dbcluster does not depend on pgqueuer.
It installs nothing; beside dbcluster, install::

    pip install 'dbcluster[postgresql]' pgqueuer asyncpg

(pgqueuer 1.6 needs Python >= 3.10 and brings anyio, pydantic, typer and uvloop; asyncpg is its
driver here.) Run::

    python benchmarks/peers.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test

pgqueuer's workers are ``QueueManager.run(batch_size=2, max_concurrent_tasks=4)``: its
documented per-worker cap is ``max_concurrent_tasks`` (enforced by its dequeue query), which must
be at least twice ``batch_size``. They run on uvloop when it is installed, as ``pgq run`` does.
dbcluster runs with its default settings (``DBCLUSTER_*`` variables apply), its master in this
process, through the code of ``dbcluster bench drain`` and ``dbcluster bench latency``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

REQUIREMENTS = "pip install pgqueuer asyncpg"


def _require_pgqueuer() -> None:
    """Stop with one clear line when pgqueuer or asyncpg is missing."""
    for module in ("pgqueuer", "asyncpg"):
        try:
            __import__(module)
        except ImportError:
            sys.exit(f"peers.py: {module} is not installed; run `{REQUIREMENTS}` first")


def _dsn(url: str) -> str:
    """A libpq DSN (asyncpg's) for a SQLAlchemy PostgreSQL URL."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _wait(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.002)


# --- pgqueuer ---------------------------------------------------------------------------------


TABLES = """
CREATE TABLE IF NOT EXISTS peer_rows (id bigint PRIMARY KEY, started_at double precision);
CREATE TABLE IF NOT EXISTS peer_workers (pid integer PRIMARY KEY);
"""


async def pgqueuer_worker(dsn: str, concurrency: int, batch_size: int) -> None:
    """One pgqueuer worker process: entrypoint ``insert`` (the task body: one INSERT, with
    the time it started) and ``hello`` (says which worker process is consuming)."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=concurrency, max_size=concurrency)
    manager = QueueManager(Queries(AsyncpgDriver(connection)))

    @manager.entrypoint("insert")
    async def insert(job: Job) -> None:
        started = time.time()
        assert job.payload is not None
        await pool.execute(
            "INSERT INTO peer_rows (id, started_at) VALUES ($1, $2)", int(job.payload), started
        )

    @manager.entrypoint("hello")
    async def hello(job: Job) -> None:
        await pool.execute(
            "INSERT INTO peer_workers (pid) VALUES ($1) ON CONFLICT DO NOTHING", os.getpid()
        )

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, manager.shutdown.set)
    try:
        await manager.run(batch_size=batch_size, max_concurrent_tasks=concurrency)
    finally:
        await pool.close()
        await connection.close()


async def _pgqueuer(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(connection))
    await queries.install()
    await connection.execute(TABLES)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--pgqueuer-worker",
                dsn,
                str(args.concurrency),
                str(args.batch_size),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(args.workers)
    ]
    try:
        # Every worker consuming: greet (a few tasks at a time) until each has answered.
        deadline = time.monotonic() + 60
        while await connection.fetchval("SELECT count(*) FROM peer_workers") < args.workers:
            if any(w.poll() is not None for w in workers) or time.monotonic() > deadline:
                raise RuntimeError("the pgqueuer workers did not all start consuming")
            k = args.workers * args.concurrency
            await queries.enqueue(["hello"] * k, [None] * k, [0] * k)
            await asyncio.sleep(0.2)

        async def queue_empty() -> bool:
            rows = await connection.fetchval("SELECT count(*) FROM peer_rows")
            queued = await connection.fetchval("SELECT count(*) FROM pgqueuer")
            return bool(rows >= args.tasks and queued == 0)

        # Drain: one bulk enqueue, until every body ran and the queue is empty.
        await connection.execute("DELETE FROM peer_rows")
        await _wait(lambda: _empty(connection), 30, "the greeting tasks to finish")
        n = args.tasks
        started = time.perf_counter()
        await queries.enqueue(["insert"] * n, [str(i).encode() for i in range(n)], [0] * n)
        await _wait(queue_empty, 600, f"{n} pgqueuer tasks to drain")
        drain_s = time.perf_counter() - started
        # Latency: one task at a time on idle workers.
        await connection.execute("DELETE FROM peer_rows")
        latencies = []
        for run in range(args.runs):
            task_id = n + run
            enqueued = time.time()
            await queries.enqueue("insert", str(task_id).encode())

            async def ran(task_id: int = task_id) -> bool:
                found = await connection.fetchval(
                    "SELECT started_at FROM peer_rows WHERE id = $1", task_id
                )
                return found is not None

            await _wait(ran, 60, "a pgqueuer task to start")
            started_at = await connection.fetchval(
                "SELECT started_at FROM peer_rows WHERE id = $1", task_id
            )
            latencies.append((started_at - enqueued) * 1000)
            await _wait(lambda: _empty(connection), 30, "the task to leave the queue")
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        await connection.close()
    return {
        "system": f"pgqueuer {importlib.metadata.version('pgqueuer')} (asyncpg)",
        "drain_per_s": round(n / drain_s, 1),
        "start_ms_median": round(statistics.median(latencies), 2),
        "start_ms_p95": round(_pct(latencies, 0.95), 2),
    }


async def _empty(connection: Any) -> bool:
    return bool(await connection.fetchval("SELECT count(*) FROM pgqueuer") == 0)


def run_pgqueuer(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from dbcluster.bench.harness import scratch_database

    with scratch_database(url) as db:
        return asyncio.run(_pgqueuer(_dsn(db), args))


# --- dbcluster --------------------------------------------------------------------------------


def run_dbcluster(url: str, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """dbcluster through the bench's own drain and latency scenarios; also the hand-written
    floor the drain scenario measures beside it."""
    from dbcluster.bench.drain import drain
    from dbcluster.bench.scenarios import Params, latency

    params = Params(
        drain_partitions=args.tasks,
        drain_workers=args.workers,
        drain_concurrency=args.concurrency,
        baseline_threads=args.workers * args.concurrency,
        latency_runs=args.runs,
        counting=False,
    )
    drained = drain(url, params)
    started = latency(url, params)
    version = importlib.metadata.version("dbcluster")
    row = {
        "system": f"dbcluster {version} ({args.tasks}-partition job; 1-partition job)",
        "drain_per_s": drained["framework"]["partitions_per_s"],
        "start_ms_median": started["launch_to_partition_start_ms"]["median"],
        "start_ms_p95": started["launch_to_partition_start_ms"]["p95"],
        # Where dbcluster's launch -> body start goes (see dbcluster/bench/stages.py).
        "start_stages": {name: s["median_ms"] for name, s in started["stages"].items()},
    }
    floor = {
        "system": f"floor: the INSERTs by hand, {params.baseline_threads} threads "
        "(latency: one INSERT transaction)",
        "drain_per_s": drained["baseline"]["rows_per_s"],
        "start_ms_median": started["baseline_one_insert_transaction_ms"]["median"],
        "start_ms_p95": started["baseline_one_insert_transaction_ms"]["p95"],
    }
    return row, floor


# --- the table --------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], ratio: dict[str, Any]) -> str:
    head = f"drain of {ratio['tasks']:,} tasks, /s"
    lines = [
        f"| system | {head} | enqueue -> body start, median / p95 ms |",
        "|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['system']} | {row['drain_per_s']} | "
            f"{row['start_ms_median']} / {row['start_ms_p95']} |"
        )
    lines.append(
        f"| ratio dbcluster / pgqueuer | {ratio['drain']} (higher is better) | "
        f"{ratio['start_median']} / {ratio['start_p95']} (lower is better) |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--pgqueuer-worker"]:
        dsn, concurrency, batch_size = argv[1], int(argv[2]), int(argv[3])
        try:
            import uvloop

            uvloop.run(pgqueuer_worker(dsn, concurrency, batch_size))
        except ImportError:
            asyncio.run(pgqueuer_worker(dsn, concurrency, batch_size))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("DBCLUSTER_URL"), help="PostgreSQL URL")
    parser.add_argument("--tasks", type=int, default=2000, help="drain: tasks (default 2000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=4, help="per worker (default 4)")
    parser.add_argument("--batch-size", type=int, default=2, help="pgqueuer's (default 2)")
    parser.add_argument("--runs", type=int, default=50, help="latency: tasks (default 50)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    _require_pgqueuer()
    if not args.url or not args.url.startswith("postgresql"):
        sys.exit("peers.py: --url must be a PostgreSQL URL (postgresql+psycopg://...)")
    if args.concurrency < 2 * args.batch_size:
        sys.exit("peers.py: pgqueuer needs --concurrency at least twice --batch-size")
    print("running pgqueuer ...", file=sys.stderr)
    peer = run_pgqueuer(args.url, args)
    print("running dbcluster ...", file=sys.stderr)
    ours, floor = run_dbcluster(args.url, args)
    ratio = {
        "tasks": args.tasks,
        "drain": round(ours["drain_per_s"] / peer["drain_per_s"], 3),
        "start_median": round(ours["start_ms_median"] / peer["start_ms_median"], 2),
        "start_p95": round(ours["start_ms_p95"] / peer["start_ms_p95"], 2),
    }
    if args.json:
        print(json.dumps({"rows": [peer, ours, floor], "ratio_dbcluster_to_pgqueuer": ratio}))
    else:
        print(table([peer, ours, floor], ratio))
        stages = ", ".join(f"{name} {ms}" for name, ms in ours["start_stages"].items())
        print(f"\ndbcluster's launch -> body start by stage (medians, ms): {stages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
