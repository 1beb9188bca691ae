"""``drain``: many tiny partitions, each one INSERT into a user table, drained by worker
processes, against the same INSERTs written by hand (each in its own transaction, by as many
threads as the workers run partitions at once): the floor of what the database does."""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from typing import Any

from sqlalchemy import Engine, func, insert, select

from dbcluster.bench.app import build_registry, drain_metadata, drain_rows
from dbcluster.bench.common import (
    ClusterRun,
    Meter,
    Params,
    cluster_run,
    headline,
    round_trip_report,
)
from dbcluster.bench.harness import Tap, counting_tap, scratch_database
from dbcluster.dialects import make_engine


def hand_written_inserts(url: str, rows: int, threads: int, meter: Meter | None = None) -> float:
    """Seconds for ``threads`` threads to INSERT ``rows`` rows into the drain table, each in
    its own transaction, through hand-written SQLAlchemy (connections opened beforehand, no
    pool ping): the database's floor for the drain's work. ``meter`` counts the INSERTs' round
    trips (not the connections' set-up)."""
    engine = make_engine(url, pool_size=threads, max_overflow=0, pool_pre_ping=False)
    statement = insert(drain_rows)
    ids = iter(range(rows))
    lock = threading.Lock()
    failures: list[BaseException] = []

    def work() -> None:
        try:
            while True:
                with lock:
                    row = next(ids, None)
                if row is None:
                    return
                with engine.begin() as conn:
                    conn.execute(statement, {"id": row, "name": f"floor-{row}"})
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            failures.append(exc)

    try:
        warm = [engine.connect() for _ in range(threads)]
        for conn in warm:
            conn.close()
        workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
        with meter if meter is not None else nullcontext():
            started = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    if failures:
        raise failures[0]
    return seconds


def _rows_written(engine: Engine) -> int:
    with engine.begin() as conn:
        found = int(conn.execute(select(func.count()).select_from(drain_rows)).scalar_one())
        conn.execute(drain_rows.delete())
    return found


def _drain(db: str, engine: Engine, p: Params, label: str, tap: Tap | None = None) -> ClusterRun:
    return cluster_run(
        db,
        engine,
        build_registry(p.drain_partitions),
        p.settings,
        "drain",
        {"pass": label},
        workers=p.drain_workers,
        concurrency=p.drain_concurrency,
        tap=tap,
    )


def drain(url: str | None, p: Params) -> dict[str, Any]:
    """``drain_partitions`` one-INSERT partitions on ``drain_workers`` worker processes
    (``drain_concurrency`` each), the master in this process: partitions/s from the launch call
    to the job's end, beside the hand-written floor; round trips and commits per partition from
    a counting pass."""
    n = p.drain_partitions
    with scratch_database(url) as db:
        engine = make_engine(db)
        drain_metadata.create_all(engine)
        floor_s = hand_written_inserts(db, n, p.baseline_threads)
        floor_rows = _rows_written(engine)
        run = _drain(db, engine, p, "timed")
        rows = _rows_written(engine)
        round_trips: dict[str, Any] = {}
        statements: dict[str, int] = {}
        if p.counting:
            with counting_tap(db) as tap:
                floor_meter = Meter(tap)
                if tap is not None:
                    hand_written_inserts(tap.url, n, p.baseline_threads, floor_meter)
                    _rows_written(engine)
                counted = _drain(db, engine, p, "counted", tap)
                counted_rows = _rows_written(engine)
                statements = counted.statements
                round_trips = {
                    "framework": round_trip_report(tap, counted.meter, n, "partition"),
                    "baseline": round_trip_report(tap, floor_meter, n, "row"),
                }
                if counted_rows != n or counted.execution.status.value != "COMPLETED":
                    round_trips["framework"]["warning"] = (
                        f"the counting pass wrote {counted_rows} of {n} rows "
                        f"({counted.execution.status.value})"
                    )
        drain_metadata.drop_all(engine)
        engine.dispose()
    rate = n / run.seconds
    floor_rate = n / floor_s
    out: dict[str, Any] = {
        "partitions": n,
        "workers": p.drain_workers,
        "concurrency_per_worker": p.drain_concurrency,
        "framework": {
            "status": run.execution.status.value,
            "rows_written": rows,
            "wall_s": round(run.seconds, 3),
            "partitions_per_s": round(rate, 1),
            **headline(round_trips.get("framework", {}), "partition"),
            **(
                {
                    "statements_per_partition_sqlalchemy_events": round(
                        statements.get("total", 0) / n, 3
                    ),
                    "statement_detail_per_partition_sqlalchemy_events": {
                        k.strip(): round(v / n, 3)
                        for k, v in statements.items()
                        if k.startswith(" ")
                    },
                }
                if statements
                else {}
            ),
        },
        "baseline": {
            "what": f"the same INSERTs by hand, one transaction each, {p.baseline_threads} threads",
            "rows_written": floor_rows,
            "wall_s": round(floor_s, 3),
            "rows_per_s": round(floor_rate, 1),
            **headline(round_trips.get("baseline", {}), "row"),
        },
        "ratio_framework_to_baseline": round(rate / floor_rate, 3),
        "settings_ms": {
            "task_polling_interval": p.settings.task_polling_interval,
            "heartbeat_interval": p.settings.heartbeat_interval,
        },
    }
    if round_trips:
        out["round_trips"] = round_trips
    return out
