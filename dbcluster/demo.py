"""The demo application (``--app dbcluster.demo:registry``), which ``dbcluster demo`` runs on a
cluster that loses a worker mid-run (the driver is :mod:`dbcluster.cli.demo`).

It reconciles receipts: a partitioned job sums ``dbc_demo_receipts`` by id range, each partition a
tasklet that reads one page per call and commits its running count and sum with the step's context
(so a partition that moves to another node resumes after its last committed page), and writes its
result row into ``dbc_demo_results`` in the same transaction as its final commit. Partitions are
transferable. It reads the receipts through an application resource (:func:`receipts_db`), an
engine made once in each worker process and disposed when the worker stops.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Identity,
    Integer,
    MetaData,
    String,
    Table,
    delete,
    insert,
    select,
)

from dbcluster.batch import (
    ChunkContext,
    ExecutionContext,
    IntegerRangePartitioner,
    Job,
    JobRegistry,
    PartitionStep,
    RepeatStatus,
    TaskletStep,
)
from dbcluster.dialects import make_engine
from dbcluster.errors import ConfigurationError
from dbcluster.schema import Id

demo_metadata = MetaData()

receipts = Table(
    "dbc_demo_receipts",
    demo_metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("account", Integer, nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
)

results = Table(
    "dbc_demo_results",
    demo_metadata,
    Column("id", Id, Identity(start=1), primary_key=True),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("partition_name", String(100), nullable=False),
    Column("lo", BigInteger, nullable=False),
    Column("hi", BigInteger, nullable=False),
    Column("receipts", BigInteger, nullable=False),
    Column("total_cents", BigInteger, nullable=False),
    Column("node_id", String(100)),
    Column("attempt", Integer),
)

RECEIPTS = 60_000
PARTITIONS_PER_NODE = 4
PAGE = 500
JOB_NAME = "reconcile-receipts"
APP = "dbcluster.demo:registry"

#: Short cluster thresholds, so a killed worker is noticed in a second and a half and removed
#: two seconds later. A node fences itself after ``cleanup - heartbeat`` ms without a heartbeat
#: (3.3 s): at 2 s / 200 ms, a heavily loaded machine (other benchmarks on 2 cores) stalled the
#: demo's own master that long once, and it fenced itself mid-demo.
DEMO_SETTINGS: dict[str, str] = {
    "DBCLUSTER_HEARTBEAT_INTERVAL": "200",
    "DBCLUSTER_TASK_POLLING_INTERVAL": "100",
    "DBCLUSTER_UNREACHABLE_THRESHOLD": "1500",
    "DBCLUSTER_CLEANUP_THRESHOLD": "3500",
    "DBCLUSTER_SWEEP_INTERVAL": "200",
    "DBCLUSTER_MASTER_CHECK_INTERVAL": "100",
    "DBCLUSTER_ORPHAN_CHECK_INTERVAL": "200",
    "DBCLUSTER_STRANDED_MASTER_SCAN_INTERVAL": "1000",
    "DBCLUSTER_DRAIN_TIMEOUT": "3000",
    "DBCLUSTER_NO_NODE_TIMEOUT": "15000",
}


# --- the application ----------------------------------------------------------------------------


class ReceiptRangePartitioner(IntegerRangePartitioner):
    """``PARTITIONS_PER_NODE`` id ranges per live node over ``[1, RECEIPTS]``."""

    def partition(self, grid_size: int) -> dict[str, ExecutionContext]:
        self.partitions = PARTITIONS_PER_NODE * max(1, grid_size)
        return super().partition(grid_size)


#: ``dbcluster worker --app dbcluster.demo:registry``
registry = JobRegistry()


@registry.resource
def receipts_db() -> Iterator[Engine]:
    """The application's engine on the receipts' database, one per process: the demo keeps its
    tables in the job repository's database (``DBCLUSTER_URL``, which every ``dbcluster``
    command sets from its ``--url``)."""
    url = os.environ.get("DBCLUSTER_URL")
    if not url:
        raise ConfigurationError("the demo reads its receipts from DBCLUSTER_URL: set it")
    engine = make_engine(url)
    yield engine
    engine.dispose()


def reconcile_slice(ctx: ChunkContext) -> RepeatStatus:
    """One page of the slice per call: add it to the committed running count and sum; at the end
    write the slice's result row (in the same transaction as the step's final commit)."""
    from dbcluster.cluster.executor import current_attempt, current_node_id

    step_ctx = ctx.step_context
    lo, hi = int(step_ctx["lo"]), int(step_ctx["hi"])
    after = int(step_ctx.get("last_id", lo - 1))
    # Read on a connection of its own: the step's transaction only writes (on SQLite a
    # transaction that reads and then writes can lose its snapshot to another process).
    with receipts_db().connect() as conn:
        rows = conn.execute(
            select(receipts.c.id, receipts.c.amount_cents)
            .where(receipts.c.id > after, receipts.c.id < hi)
            .order_by(receipts.c.id)
            .limit(PAGE)
        ).all()
    se = ctx.step_execution
    if rows:
        step_ctx.put("last_id", int(rows[-1].id))
        step_ctx.put("count", int(step_ctx.get("count", 0)) + len(rows))
        step_ctx.put("sum", int(step_ctx.get("sum", 0)) + sum(int(r.amount_cents) for r in rows))
        se.read_count += len(rows)
        se.write_count += len(rows)
        pace_ms = ctx.job_parameters.get("pace_ms", 0)
        if pace_ms:
            time.sleep(int(pace_ms) / 1000)
    if len(rows) == PAGE:
        return RepeatStatus.CONTINUABLE
    ctx.connection.execute(
        insert(results).values(
            job_execution_id=se.job_execution.id,
            partition_name=se.step_name.split(":", 1)[1],
            lo=lo,
            hi=hi,
            receipts=int(step_ctx.get("count", 0)),
            total_cents=int(step_ctx.get("sum", 0)),
            node_id=current_node_id.get(),
            attempt=current_attempt.get(),
        )
    )
    return RepeatStatus.FINISHED


def build_job() -> Job:
    worker = TaskletStep("reconcile-slice", reconcile_slice)
    partitioner = ReceiptRangePartitioner(1, RECEIPTS + 1, prefix="receipts-")
    return Job(JOB_NAME, [PartitionStep("reconcile", worker, partitioner)])


registry.register(build_job())


# --- its data --------------------------------------------------------------------------------


def money(cents: int) -> str:
    return f"${cents // 100:,}.{cents % 100:02d}"


def load_receipts(engine: Engine, count: int = RECEIPTS, seed: int = 2026) -> None:
    """Replace the receipts with ``count`` seeded random ones (ids 1 to ``count``)."""
    rng = random.Random(seed)
    rows = [
        {"id": i, "account": rng.randrange(1, 500), "amount_cents": rng.randrange(100, 50_000)}
        for i in range(1, count + 1)
    ]
    with engine.begin() as conn:
        conn.execute(delete(receipts))
        for start in range(0, len(rows), 5000):
            conn.execute(insert(receipts), rows[start : start + 5000])


def single_process_total(engine: Engine) -> tuple[int, int]:
    """The reference: every receipt read and summed here, in one pass."""
    count = total = 0
    with engine.connect() as conn:
        for (amount,) in conn.execution_options(stream_results=True).execute(
            select(receipts.c.amount_cents)
        ):
            count += 1
            total += int(amount)
    return count, total
