"""The latency scenario: idle worker processes, a one-partition job launched again and again;
from the launch call to the partition's body, and where that time goes
(:mod:`dbcluster.bench.stages`)."""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, insert, select

from dbcluster.batch.registry import JobRegistry
from dbcluster.bench import counting, stages
from dbcluster.bench.app import build_registry, drain_metadata, drain_rows, started_rows
from dbcluster.bench.common import Meter, Params, headline, pct, round_trip_report
from dbcluster.bench.harness import Tap, counting_tap, scratch_database, worker_pool
from dbcluster.cluster import Cluster, ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import step_execution


def insert_transaction_ms(engine: Engine, runs: int) -> list[float]:
    """Milliseconds of a hand-written one-row INSERT, each in its own transaction, on a warm
    connection: the floor of making anything visible in this database."""
    drain_metadata.create_all(engine)
    times = []
    with engine.connect() as conn:
        for i in range(runs):
            started = time.perf_counter()
            with conn.begin():
                conn.execute(insert(drain_rows), {"id": -1 - i, "name": "floor"})
            times.append((time.perf_counter() - started) * 1000)
        with conn.begin():
            conn.execute(drain_rows.delete())
    return times


class Launches:
    """What ``runs`` launches measured: seconds from each launch to its partition's body
    beginning (the time the body wrote), to the start its claim recorded and to the job's end;
    each launch's marks (:func:`dbcluster.bench.stages.per_launch`; none in a counting pass);
    and the launches' round trips."""

    def __init__(self, meter: Meter) -> None:
        self.start: list[float] = []
        self.recorded: list[float] = []
        self.done: list[float] = []
        self.marks: list[dict[str, float]] = []
        self.meter = meter


def _launches(
    db: str,
    engine: Engine,
    registry: JobRegistry,
    settings: ClusterSettings,
    runs: int,
    label: str,
    tap: Tap | None = None,
    warmup: int = 0,
) -> Launches:
    """Launch the one-partition job ``runs`` times on 2 idle worker processes (see
    :class:`Launches`), after ``warmup`` launches that are not measured; the timed pass (no
    ``tap``) also records each launch's stages."""
    counting.uninstall()  # no statement listeners: the round trips come from the tap
    drain_metadata.create_all(engine)
    worker_env = dict(tap.worker_env) if tap else {"DBCLUSTER_BENCH_STAGES": "1"}
    launched: list[tuple[float, int, int, float]] = []
    with worker_pool(
        tap.worker_url if tap else db, settings, worker_env, count_statements=False
    ) as pool:
        pool.start(2)
        pool.wait_registered(engine, 2)
        master_engine = make_engine(tap.url) if tap else engine
        with (
            Cluster(master_engine, registry, settings, work=False, take_over=False) as cluster,
            stages.recording_master() as master_marks,
        ):
            for run in range(warmup):
                cluster.launch("started-one", {"run": f"{label}-warm-{run}"})
            found = Launches(Meter(tap, pool))
            for run in range(runs):
                launched_at = time.time()
                t0 = time.perf_counter()
                with found.meter:
                    execution = cluster.launch("started-one", {"run": f"{label}-{run}"})
                found.done.append(time.perf_counter() - t0)
                with engine.connect() as conn:
                    recorded = conn.execute(
                        select(step_execution.c.start_time).where(
                            step_execution.c.job_execution_id == execution.id,
                            step_execution.c.step_name.like("started.worker:%"),
                        )
                    ).scalar_one()
                    step_execution_id, began = conn.execute(
                        select(started_rows.c.step_execution_id, started_rows.c.started_at).where(
                            started_rows.c.job_execution_id == execution.id
                        )
                    ).one()
                found.start.append(began - launched_at)
                at = datetime.fromtimestamp(launched_at, UTC).replace(tzinfo=None)
                found.recorded.append((recorded - at).total_seconds())
                launched.append((launched_at, execution.id, step_execution_id, began))
        if tap is None:
            pool.settle()  # every worker's file written after its last mark
            workers = [
                mark
                for worker in pool.workers
                for mark in counting.read_file(worker.counts_path).get(stages.SECTION, ())
            ]
            found.marks = stages.per_launch(launched, master_marks.marks, workers)
        if master_engine is not engine:
            master_engine.dispose()
    return found


def latency(url: str | None, p: Params) -> dict[str, Any]:
    """Idle nodes already running; a one-partition job launched ``latency_runs`` times."""
    settings = p.settings
    with scratch_database(url) as db:
        registry = build_registry(1)
        engine = make_engine(db)
        floor = insert_transaction_ms(engine, max(20, p.latency_runs))
        timed = _launches(
            db, engine, registry, settings, p.latency_runs, "t", warmup=p.latency_warmup
        )
        round_trips: dict[str, Any] = {}
        if p.counting:
            counted_runs = min(10, p.latency_runs)
            with counting_tap(db) as tap:
                counted = _launches(db, engine, registry, settings, counted_runs, "c", tap)
                round_trips = round_trip_report(tap, counted.meter, counted_runs, "launch")
                round_trips["launches_counted"] = counted_runs
        engine.dispose()

    def ms(values: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(values) * 1000, 1),
            "p95": round(pct(values, 0.95) * 1000, 1),
        }

    out: dict[str, Any] = {
        "runs": p.latency_runs,
        "warmup_launches": p.latency_warmup,
        "task_polling_interval_ms": settings.task_polling_interval,
        # The body's own clock, as the peers' latency task reads it (the claim's COMMIT and the
        # executor's thread included).
        "launch_to_partition_start_ms": ms(timed.start),
        "launch_to_start_recorded_ms": ms(timed.recorded),
        "launch_to_job_complete_ms": ms(timed.done),
        # Where the time to the body goes (each stage's median over the launches that reached
        # both of its ends; the medians need not add up to the total's).
        "stages": stages.stage_medians(timed.marks),
        "baseline_one_insert_transaction_ms": {
            "median": round(statistics.median(floor), 2),
            "p95": round(pct(floor, 0.95), 2),
        },
        **headline(round_trips, "launch"),
    }
    if round_trips:
        out["round_trips"] = round_trips
    return out
