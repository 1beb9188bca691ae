"""Sum a table by id range in 8 partitions: 1,000,000 rows unless ``rows`` says otherwise.

Two steps. ``load`` fills the table ``numbers`` with ids 1 to ``rows`` (each value its id). ``sum``
splits ``numbers`` by id range into 8 partitions; each is a chunk step: a key-range reader reads
its slice in id order, and the writer adds each chunk's sum to the partition's step context, in
the same transaction as the step's counters and reader position. So a failed or interrupted run
restarts where it stopped, a partition whose node died resumes elsewhere after its last commit,
and no row is ever counted twice. The total is the sum of the partitions' committed sums.

The example keeps ``numbers`` in the job repository's database (``DBCLUSTER_URL``) and reads it
through an application resource, ``data``: an engine made once in each process that runs steps.

In one process:   python examples/sum_by_range.py
On a cluster, from the repository root:
    export DBCLUSTER_URL=sqlite:///sums.db
    dbcluster init
    dbcluster worker --app examples.sum_by_range:registry      # on each node
    dbcluster launch --app examples.sum_by_range:registry sum-by-range 'rows(int)=1000000'
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy import Column, Engine, Integer, MetaData, Table, delete, insert

from dbcluster import schema
from dbcluster.batch import (
    BatchStatus,
    ChunkContext,
    ChunkStep,
    ColumnRangePartitioner,
    ExecutionContext,
    Job,
    JobLauncher,
    JobRegistry,
    JobRepository,
    LocalPartitionHandler,
    ParametersValidator,
    PartitionStep,
    SqlKeyRangeReader,
    StepExecution,
    TaskletStep,
    item_writer,
    partitioner,
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

registry = JobRegistry()


@registry.resource
def data() -> Iterator[Engine]:
    """The example's tables: in the job repository's database, which every ``dbcluster``
    command puts in ``DBCLUSTER_URL``."""
    url = os.environ.get("DBCLUSTER_URL")
    if not url:
        raise RuntimeError("set DBCLUSTER_URL: this example keeps its table in that database")
    engine = make_engine(url)
    yield engine
    engine.dispose()


def load(ctx: ChunkContext) -> None:
    """Fill ``numbers`` with ids 1 to ``rows``, in the step's transaction."""
    rows = ctx.job_parameters["rows"]
    assert isinstance(rows, int)  # the job's validator saw to it
    numbers.create(data(), checkfirst=True)
    ctx.connection.execute(delete(numbers))
    for start in range(1, rows + 1, 100_000):
        ctx.connection.execute(
            insert(numbers),
            [{"id": i, "value": i} for i in range(start, min(start + 100_000, rows + 1))],
        )


@partitioner
def by_id(grid_size: int) -> dict[str, ExecutionContext]:
    """``PARTITIONS`` id ranges over what ``numbers`` holds, read by the job's master."""
    return ColumnRangePartitioner(data(), numbers, "id", prefix="id-").partition(grid_size)


def reader(step_execution: StepExecution) -> SqlKeyRangeReader:
    # Step scope: each partition reads the slice its context names.
    ctx = step_execution.execution_context
    return SqlKeyRangeReader(
        data(), numbers, "id", ctx["lo"], ctx["hi"], columns=["value"], page_size=20_000
    )


@item_writer
def add_to_sum(rows: Sequence[dict[str, int]], chunk: ChunkContext) -> None:
    chunk.step_context.put("sum", chunk.step_context.get("sum", 0) + sum(r["value"] for r in rows))


worker = ChunkStep("sum-slice", reader=reader, writer=add_to_sum, chunk_size=20_000)
job = registry.register(
    Job(
        "sum-by-range",
        [TaskletStep("load", load), PartitionStep("sum", worker, by_id, grid_size=PARTITIONS)],
        validator=ParametersValidator(required={"rows": int}),
    )
)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DBCLUSTER_URL"] = f"sqlite:///{Path(tmp) / 'batch.db'}"
        schema.metadata.create_all(data())
        started = time.perf_counter()
        repository = JobRepository(data())
        launcher = JobLauncher(repository, LocalPartitionHandler(max_workers=PARTITIONS))
        execution = launcher.run(job, {"rows": ROWS})
        finished = time.perf_counter()

        partitions = [s for s in repository.get_step_executions(execution) if ":" in s.step_name]
        total = sum(s.execution_context["sum"] for s in partitions)
        expected = ROWS * (ROWS + 1) // 2
        print(f"job status: {execution.status.value}")
        for s in partitions:
            print(f"  {s.step_name:<28} read {s.read_count:>7}  sum {s.execution_context['sum']}")
        print(f"total: {total}")
        print(f"expected (n(n+1)/2): {expected}")
        print(f"load and sum {finished - started:.1f}s")
        registry.resources.close()
        if execution.status is not BatchStatus.COMPLETED or total != expected:
            raise SystemExit("MISMATCH")
        print("OK")


if __name__ == "__main__":
    main()
