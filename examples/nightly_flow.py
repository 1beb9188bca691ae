"""A nightly job as a flow: load the day's orders, let a decider look at the volume, then on a
big day total them by region in a partitioned step while a second branch of a split exports
them to a JSON-lines file; on a small day total them in one step. A report step ends both ways.

    load -> volume? --BIG---> split[ totals (partitioned) | export ] -> report
                    --SMALL-> total-all ----------------------------> report

A first step, ``prepare``, creates the example's tables if they are missing and empties them.
Every step restarts from its last commit and the flow from the path it took: a failed big day
re-runs only the branch of the split that failed. The same job runs on a cluster (the split's
branches run on the master, the partitions on every node). The tables live in the job
repository's database (``DBCLUSTER_URL``), reached through the application resource ``data``.

In one process:   python examples/nightly_flow.py [ORDERS]
On a cluster, from the repository root:
    export DBCLUSTER_URL=sqlite:///nightly.db
    dbcluster init
    dbcluster worker --app examples.nightly_flow:registry      # on each node
    dbcluster launch --app examples.nightly_flow:registry nightly-orders 'orders(int)=5000' --next
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    delete,
    func,
    select,
)

from dbcluster import schema
from dbcluster.batch import (
    BatchStatus,
    ChunkContext,
    ChunkStep,
    ColumnRangePartitioner,
    Flow,
    IterableItemReader,
    Job,
    JobLauncher,
    JobRegistry,
    JobRepository,
    JsonLinesItemWriter,
    LocalPartitionHandler,
    ParametersValidator,
    PartitionStep,
    RunIdIncrementer,
    Split,
    SqlItemWriter,
    SqlPagingItemReader,
    StepExecution,
    TaskletStep,
    decider,
    item_writer,
    partitioner,
)
from dbcluster.batch.flow import PATH_KEY
from dbcluster.dialects import make_engine

REGIONS = ("apac", "emea", "latam", "na")
BIG_DAY = 1_000

metadata = MetaData()
orders = Table(
    "nightly_orders",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("region", String(10), nullable=False),
    Column("amount", Integer, nullable=False),
)
subtotals = Table(
    "nightly_subtotals",
    metadata,
    Column("part", String(60), primary_key=True),
    Column("chunk", Integer, primary_key=True, autoincrement=False),
    Column("region", String(10), primary_key=True),
    Column("total", Integer, nullable=False),
)
totals = Table(
    "nightly_totals",
    metadata,
    Column("region", String(10), primary_key=True),
    Column("total", Integer, nullable=False),
)


registry = JobRegistry()


@registry.resource
def data() -> Iterator[Engine]:
    """The example's tables: in the job repository's database, which every ``dbcluster``
    command puts in ``DBCLUSTER_URL``."""
    url = os.environ.get("DBCLUSTER_URL")
    if not url:
        raise RuntimeError("set DBCLUSTER_URL: this example keeps its tables in that database")
    engine = make_engine(url)
    yield engine
    engine.dispose()


def order(i: int) -> dict[str, Any]:
    return {"id": i, "region": REGIONS[i * 7 % len(REGIONS)], "amount": i % 97 + 1}


def export_path(step_execution: StepExecution) -> Path:
    """Where ``export`` writes: the ``export`` parameter, or a file in the temp folder."""
    default = Path(tempfile.gettempdir()) / "nightly-orders.jsonl"
    return Path(str(step_execution.job_execution.parameters.get("export", default)))


def build_job() -> Job:
    def clear(ctx: ChunkContext) -> None:
        metadata.create_all(data())  # a connection of its own: DDL commits on its own anyway
        for table in (totals, subtotals, orders):
            ctx.connection.execute(delete(table))

    prepare = TaskletStep("prepare", clear)
    # Load: an upsert, so loading the same day twice changes nothing.
    load = ChunkStep(
        "load",
        reader=lambda step_execution: IterableItemReader(
            order(i) for i in range(1, step_execution.job_execution.parameters["orders"] + 1)
        ),
        writer=SqlItemWriter(orders, upsert_on=["id"]),
        chunk_size=500,
    )

    @decider
    def volume(job_execution: Any, last: StepExecution | None) -> str:
        return "BIG" if last is not None and last.write_count >= BIG_DAY else "SMALL"

    def subtotal(part: str) -> Any:
        """A writer that records each chunk's sum per region, with the chunk (so exactly once)."""

        @item_writer
        def write(rows: Sequence[dict[str, Any]], chunk: ChunkContext) -> None:
            number = chunk.step_context.get("chunks", 0) + 1
            chunk.step_context.put("chunks", number)
            sums: Counter[str] = Counter()
            for row in rows:
                sums[row["region"]] += row["amount"]
            chunk.connection.execute(
                subtotals.insert(),
                [{"part": part, "chunk": number, "region": r, "total": t} for r, t in sums.items()],
            )

        return write

    def slice_reader(step_execution: StepExecution) -> SqlPagingItemReader:
        ctx = step_execution.execution_context  # step scope: this partition's id range
        query = select(orders).where(
            orders.c.id >= bindparam("lo", type_=Integer),
            orders.c.id < bindparam("hi", type_=Integer),
        )
        return SqlPagingItemReader(
            data(), query, ["id"], parameters={"lo": ctx["lo"], "hi": ctx["hi"]}, page_size=500
        )

    worker = ChunkStep(
        "total-slice",
        reader=slice_reader,
        writer=lambda step_execution: subtotal(step_execution.step_name),
        chunk_size=500,
    )

    @partitioner
    def by_id(grid_size: int) -> Any:  # read by the job's master when it splits the step
        return ColumnRangePartitioner(data(), orders, "id", prefix="id-").partition(grid_size)

    partitioned = PartitionStep("totals", worker, by_id, grid_size=4)
    export = ChunkStep(
        "export",
        reader=lambda step_execution: SqlPagingItemReader(data(), orders, ["region", "id"]),
        writer=lambda step_execution: JsonLinesItemWriter(export_path(step_execution)),
        chunk_size=500,
    )
    small = ChunkStep(
        "total-all",
        reader=lambda step_execution: SqlPagingItemReader(data(), orders, ["id"]),
        writer=subtotal("all"),
        chunk_size=500,
    )

    def report(ctx: ChunkContext) -> None:
        conn = ctx.connection
        summed = conn.execute(
            select(subtotals.c.region, func.sum(subtotals.c.total)).group_by(subtotals.c.region)
        ).all()
        conn.execute(delete(totals))
        conn.execute(totals.insert(), [{"region": r, "total": int(t)} for r, t in summed])
        ctx.step_context.put("grand_total", sum(int(t) for _, t in summed))

    finish = TaskletStep("report", report)
    flow = (
        Flow("nightly")
        .start(prepare)
        .next(load)
        .next(volume)
        .on("BIG").to(Split("big-day", [partitioned, export])).next(finish)
        .from_(volume).on("SMALL").to(small).next(finish)
    )  # fmt: skip
    return Job(
        "nightly-orders",
        flow,
        incrementer=RunIdIncrementer(),
        validator=ParametersValidator(required={"orders": int}),
    )


job = registry.register(build_job())


def main(count: int = 5_000) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DBCLUSTER_URL"] = f"sqlite:///{Path(tmp) / 'batch.db'}"
        engine = data()
        schema.metadata.create_all(engine)
        exported_to = Path(tmp) / "orders.jsonl"
        launcher = JobLauncher(JobRepository(engine), LocalPartitionHandler(max_workers=4))
        params = {"orders": count, "export": str(exported_to)}
        execution = launcher.run(job, launcher.next_parameters(job, params))
        # The path the flow took is in the job execution's context (a restart replays it).
        taken = execution.execution_context[PATH_KEY]["nightly"]["states"]
        path = " -> ".join(f"{name} ({code})" for name, code, *_ in taken)
        print(f"{execution.status.value}: {path}")
        steps = launcher.repository.get_step_executions(execution)
        print(
            f"{sum(':' in se.step_name for se in steps)} partitions, {len(steps)} step executions"
        )
        with engine.connect() as conn:
            got = dict(conn.execute(select(totals.c.region, totals.c.total)).all())
            want = dict(
                conn.execute(
                    select(orders.c.region, func.sum(orders.c.amount)).group_by(orders.c.region)
                ).all()
            )
        for region in sorted(got):
            print(f"  {region:6} {got[region]:>10}")
        exported = len(exported_to.read_text().splitlines()) if exported_to.exists() else 0
        ok = execution.status is BatchStatus.COMPLETED and got == {
            k: int(v) for k, v in want.items()
        }
        ok = ok and (count < BIG_DAY or exported == count)
        if exported:
            first = json.loads(exported_to.read_text().splitlines()[0])
            print(f"exported {exported} orders, first {first}")
        registry.resources.close()
        print("OK" if ok else "MISMATCH")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5_000))
