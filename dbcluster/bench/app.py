"""The benchmark application: a no-op partitioned job and a chunk job.

Imported by the benchmark's worker processes (``--app dbcluster.bench.app:registry``); when
``DBCLUSTER_BENCH_COUNTS`` names a file, the process counts its statements into it.
"""

from __future__ import annotations

import os

from dbcluster.batch import (
    IntegerRangePartitioner,
    Job,
    JobRegistry,
    PartitionStep,
    RepeatStatus,
    TaskletStep,
)
from dbcluster.batch.scope import ChunkContext
from dbcluster.bench import counting

if os.environ.get("DBCLUSTER_BENCH_COUNTS"):
    counting.install()
    counting.start_dumping(os.environ["DBCLUSTER_BENCH_COUNTS"])


def noop(ctx: ChunkContext) -> RepeatStatus:
    return RepeatStatus.FINISHED


NOOP_WORKER = TaskletStep("noop.worker", noop)


def noop_job(partitions: int, name: str = "noop") -> Job:
    partitioner = IntegerRangePartitioner(0, partitions, partitions=partitions, prefix="n-")
    return Job(name, [PartitionStep(f"{name}.master", NOOP_WORKER, partitioner)])


def build_registry(partitions: int = 1000) -> JobRegistry:
    registry = JobRegistry(steps=[NOOP_WORKER])
    registry.register(noop_job(partitions))
    registry.register(noop_job(1, "noop-one"))
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
