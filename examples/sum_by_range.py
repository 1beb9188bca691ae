"""Sum a 1,000,000-row table by id range in 8 partitions, on SQLite.

Each partition is a chunk step: a key-range reader reads its slice of ``numbers`` in id order,
and the writer adds each chunk's sum to the partition's step context, in the same transaction as
the step's counters and reader position. So a failed or interrupted run restarts where it stopped
and no row is ever counted twice. The total is the sum of the partitions' committed sums.

Run it:  python examples/sum_by_range.py
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, Table, insert

from dbcluster import schema
from dbcluster.batch import (
    BatchStatus,
    ChunkContext,
    ChunkStep,
    ColumnRangePartitioner,
    Job,
    JobLauncher,
    JobRepository,
    LocalPartitionHandler,
    PartitionStep,
    SqlKeyRangeReader,
    StepExecution,
    item_writer,
)
from dbcluster.dialects import make_engine

ROWS = 1_000_000
PARTITIONS = 8

numbers = Table(
    "numbers",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("value", Integer, nullable=False),
)


def build_job(engine: Any) -> Job:
    def reader(step_execution: StepExecution) -> SqlKeyRangeReader:
        # Step scope: each partition reads the slice its context names.
        ctx = step_execution.execution_context
        return SqlKeyRangeReader(
            engine, numbers, "id", ctx["lo"], ctx["hi"], columns=["value"], page_size=20_000
        )

    @item_writer
    def add_to_sum(rows: Sequence[dict[str, int]], chunk: ChunkContext) -> None:
        chunk.step_context.put(
            "sum", chunk.step_context.get("sum", 0) + sum(r["value"] for r in rows)
        )

    worker = ChunkStep("sum-slice", reader=reader, writer=add_to_sum, chunk_size=20_000)
    partitioner = ColumnRangePartitioner(engine, numbers, "id", prefix="id-")
    return Job("sum-by-range", [PartitionStep("sum", worker, partitioner, grid_size=PARTITIONS)])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'batch.db'}")
        schema.metadata.create_all(engine)
        numbers.create(engine)
        started = time.perf_counter()
        with engine.begin() as conn:
            for start in range(1, ROWS + 1, 100_000):
                conn.execute(
                    insert(numbers),
                    [{"id": i, "value": i} for i in range(start, min(start + 100_000, ROWS + 1))],
                )
        loaded = time.perf_counter()

        repository = JobRepository(engine)
        launcher = JobLauncher(repository, LocalPartitionHandler(max_workers=PARTITIONS))
        execution = launcher.run(build_job(engine), {"rows": ROWS})
        finished = time.perf_counter()

        partitions = [s for s in repository.get_step_executions(execution) if s.step_name != "sum"]
        total = sum(s.execution_context["sum"] for s in partitions)
        expected = ROWS * (ROWS + 1) // 2
        print(f"job status: {execution.status.value}")
        for s in partitions:
            print(f"  {s.step_name:<28} read {s.read_count:>7}  sum {s.execution_context['sum']}")
        print(f"total: {total}")
        print(f"expected (n(n+1)/2): {expected}")
        print(f"load {loaded - started:.1f}s, job {finished - loaded:.1f}s")
        engine.dispose()
        if execution.status is not BatchStatus.COMPLETED or total != expected:
            raise SystemExit("MISMATCH")
        print("OK")


if __name__ == "__main__":
    main()
