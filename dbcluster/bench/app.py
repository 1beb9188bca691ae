"""The benchmark application: a no-op partitioned job and a chunk job.

Imported by the benchmark's worker processes (``--app dbcluster.bench.app:registry``); when
``DBCLUSTER_BENCH_COUNTS`` names a file, the process counts its statements into it, and its
SQLite round trips too when ``DBCLUSTER_BENCH_TRACE`` is set, and when
``DBCLUSTER_BENCH_STAGES`` is set the times each partition reached the worker's points as
well (:mod:`dbcluster.bench.stages`).
"""

from __future__ import annotations

import os
import time

from sqlalchemy import BigInteger, Column, Double, MetaData, String, Table, insert

from dbcluster.batch import (
    IntegerRangePartitioner,
    Job,
    JobRegistry,
    PartitionStep,
    RepeatStatus,
    TaskletStep,
)
from dbcluster.batch.scope import ChunkContext
from dbcluster.bench import counting, stages

if os.environ.get("DBCLUSTER_BENCH_COUNTS"):
    if os.environ.get("DBCLUSTER_BENCH_STATEMENTS", "1") != "0":
        counting.install()
    if os.environ.get("DBCLUSTER_BENCH_TRACE"):
        counting.install_trace()
    counting.start_dumping(os.environ["DBCLUSTER_BENCH_COUNTS"])
    if os.environ.get("DBCLUSTER_BENCH_STAGES"):
        stages.record_worker()


def noop(ctx: ChunkContext) -> RepeatStatus:
    return RepeatStatus.FINISHED


NOOP_WORKER = TaskletStep("noop.worker", noop)


def noop_job(partitions: int, name: str = "noop") -> Job:
    partitioner = IntegerRangePartitioner(0, partitions, partitions=partitions, prefix="n-")
    return Job(name, [PartitionStep(f"{name}.master", NOOP_WORKER, partitioner)])


#: The user table of the drain scenario: one row per partition.
drain_metadata = MetaData()
drain_rows = Table(
    "bench_drain",
    drain_metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("name", String(100), nullable=False),
)
_INSERT_DRAIN_ROW = insert(drain_rows)


def insert_one(ctx: ChunkContext) -> RepeatStatus:
    """The drain task's body: one INSERT, in the step's own transaction."""
    ctx.connection.execute(
        _INSERT_DRAIN_ROW, {"id": ctx.step_execution.id, "name": ctx.step_execution.step_name}
    )
    return RepeatStatus.FINISHED


#: Its one INSERT is its only effect, in the step's transaction: its partitions may be grouped.
DRAIN_WORKER = TaskletStep("drain.worker", insert_one, transactional=True)

#: The latency scenario's user table: when each partition's body began (``time.time()`` of
#: the worker process), one row per partition.
started_rows = Table(
    "bench_started",
    drain_metadata,
    Column("step_execution_id", BigInteger, primary_key=True, autoincrement=False),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("started_at", Double, nullable=False),  # time.time(): a double, not a FLOAT
)
_INSERT_STARTED = insert(started_rows)


def record_start(ctx: ChunkContext) -> RepeatStatus:
    """The latency task's body: the time it began, one INSERT in the step's own transaction
    (what the peer queues' latency task does)."""
    began = time.time()
    se = ctx.step_execution
    ctx.connection.execute(
        _INSERT_STARTED,
        {"step_execution_id": se.id, "job_execution_id": se.job_execution.id, "started_at": began},
    )
    return RepeatStatus.FINISHED


#: Its one INSERT is its only effect, in the step's transaction (as the drain task's): an idle
#: node runs its partition as the wake-up carried it, claimed by that transaction.
STARTED_WORKER = TaskletStep("started.worker", record_start, transactional=True)


def drain_job(partitions: int) -> Job:
    partitioner = IntegerRangePartitioner(0, partitions, partitions=partitions, prefix="d-")
    return Job("drain", [PartitionStep("drain.master", DRAIN_WORKER, partitioner)])


def build_registry(partitions: int = 1000) -> JobRegistry:
    registry = JobRegistry(steps=[NOOP_WORKER, DRAIN_WORKER, STARTED_WORKER])
    registry.register(noop_job(partitions))
    registry.register(noop_job(1, "noop-one"))
    registry.register(
        Job(
            "started-one",
            [
                PartitionStep(
                    "started.master",
                    STARTED_WORKER,
                    IntegerRangePartitioner(0, 1, partitions=1, prefix="t-"),
                )
            ],
        )
    )
    registry.register(drain_job(partitions))
    return registry


registry = build_registry()


def sleepy(ctx: ChunkContext) -> RepeatStatus:
    """Runs for the job parameter ``ms`` milliseconds, one 100 ms tick per transaction."""
    import time

    params = ctx.job_parameters
    total_ms = int(params["ms"]) if "ms" in params else 1000
    ticks = int(ctx.step_context.get("ticks", 0))
    if ticks * 100 >= total_ms:
        return RepeatStatus.FINISHED
    time.sleep(0.1)
    ctx.step_context.put("ticks", ticks + 1)
    return RepeatStatus.CONTINUABLE


SLEEPY_WORKER = TaskletStep("sleepy.worker", sleepy)


def sleepy_job(partitions: int) -> Job:
    partitioner = IntegerRangePartitioner(0, partitions, partitions=partitions, prefix="s-")
    return Job("sleepy", [PartitionStep("sleepy.master", SLEEPY_WORKER, partitioner)])


registry.register_step(SLEEPY_WORKER)
registry.register(sleepy_job(12))
