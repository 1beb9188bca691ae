"""The test application: partitioned jobs that record every partition execution in a ledger.

The ledger row is written in the same transaction as the step's final commit, so a fenced or
removed node's write rolls back with its step: invariants are checked from data, not logs.
Job parameters steer the work: ``delay_ms`` (how long each partition runs), ``tick_ms`` (one
chunk transaction per tick, default 20), ``fail`` (comma-separated partition names, or ``*``, that
fail), ``fail_mode`` (``raise`` or ``status``: end FAILED without raising), ``per_node``
(partitions per live node, default 4) and ``items``.

``dbc_test_runs`` gets one row per attempt that committed its first chunk (node, attempt, database
clock), in that chunk's guarded transaction. The effect (the ledger row) commits with a ``done``
marker in the step context, so a restarted execution, which resumes from that context, never
records the same partition twice: the restartable-step pattern the batch model is built for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Identity,
    Integer,
    MetaData,
    String,
    Table,
    insert,
)

from dbcluster.batch import (
    ChunkContext,
    ExecutionContext,
    Job,
    JobRegistry,
    PartitionStep,
    RepeatStatus,
    TaskletStep,
)
from dbcluster.batch.partition import BasePartitioner
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.schema import Id, Timestamp

ledger_metadata = MetaData()

ledger = Table(
    "dbc_test_ledger",
    ledger_metadata,
    Column("id", Id, Identity(start=1), primary_key=True),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("step_execution_id", BigInteger, nullable=False),
    Column("partition_name", String(100), nullable=False),
    Column("node_id", String(100)),
    Column("attempt", Integer),
    Column("transferable", Boolean(name="ck_ledger_transferable"), nullable=False),
    Column("lo", BigInteger, nullable=False),
    Column("hi", BigInteger, nullable=False),
    Column("total", BigInteger, nullable=False),
    Column("started", Timestamp),
    Column("finished", Timestamp),
)

runs = Table(
    "dbc_test_runs",
    ledger_metadata,
    Column("id", Id, Identity(start=1), primary_key=True),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("step_execution_id", BigInteger, nullable=False),
    Column("partition_name", String(100), nullable=False),
    Column("node_id", String(100)),
    Column("attempt", Integer),
    Column("transferable", Boolean(name="ck_runs_transferable"), nullable=False),
    Column("started", Timestamp),
)

TICK_S = 0.02

if os.environ.get("DBCLUSTER_FAULT_CUT_FILE"):  # set by the fault harness for its nodes
    from dbcluster.testing.faults import install_cut_switch

    install_cut_switch(os.environ["DBCLUSTER_FAULT_CUT_FILE"])

#: Short thresholds for tests: a dead node is removed after one second.
FAST_SETTINGS = ClusterSettings(
    heartbeat_interval=100,
    task_polling_interval=50,
    unreachable_threshold=500,
    cleanup_threshold=1000,
    sweep_interval=100,
    master_check_interval=50,
    orphan_check_interval=100,
    stranded_master_scan_interval=200,
    concurrency_limit=10,
    node_id_prefix="t",
    drain_timeout=5000,
    no_node_timeout=5000,
)


class RangePartitioner(BasePartitioner):
    """``per_node * grid_size`` half-open slices of ``[0, items)``, named after the slice."""

    def __init__(self, transferable: bool | None, per_node: int = 4, items: int = 1000) -> None:
        self.transferable = transferable
        self.per_node = per_node
        self.items = items
        self.last_grid_size: int | None = None

    def partition(self, grid_size: int) -> Mapping[str, ExecutionContext]:
        self.last_grid_size = grid_size
        count = max(1, self.per_node * grid_size)
        width = -(-self.items // count)
        out: dict[str, ExecutionContext] = {}
        for lo in range(0, self.items, width):
            hi = min(self.items, lo + width)
            name = f"r-{lo:06d}-{hi:06d}"
            context = ExecutionContext({"lo": lo, "hi": hi})
            context.put("transferable", self.is_transferable(name, context))
            out[name] = context
        return out

    def is_transferable(self, name: str, context: ExecutionContext) -> bool:
        if self.transferable is None:  # mixed: alternate slices
            return int(context["lo"]) // max(1, int(context["hi"]) - int(context["lo"])) % 2 == 0
        return self.transferable


def _param(ctx: ChunkContext, name: str, default: Any) -> Any:
    params = ctx.job_parameters
    return params[name] if name in params else default


def ledger_tasklet(ctx: ChunkContext) -> RepeatStatus:
    """Tick until ``delay_ms`` has passed, then record the slice's sum in the ledger."""
    from dbcluster.batch.domain import utcnow
    from dbcluster.cluster.node import checkpoint, current_attempt, current_node_id

    checkpoint()

    from dbcluster.dialects import get_provider

    se = ctx.step_execution
    name = se.step_name.split(":", 1)[1]
    step_ctx = ctx.step_context
    if step_ctx.get("done"):
        # The effect committed in an earlier attempt or execution (its node died before the
        # step's COMPLETED status was written): record nothing twice.
        return RepeatStatus.FINISHED
    provider = get_provider(ctx.connection.engine)
    node_id, attempt = current_node_id.get(), current_attempt.get()
    transferable = bool(step_ctx.get("transferable", True))
    run_key = f"{node_id}/{attempt}/{se.job_execution.id}"
    if step_ctx.get("run") != run_key:
        step_ctx.put("run", run_key)
        step_ctx.put("started", utcnow().isoformat())
        ctx.connection.execute(
            insert(runs).values(
                job_execution_id=se.job_execution.id,
                step_execution_id=se.id,
                partition_name=name,
                node_id=node_id,
                attempt=attempt,
                transferable=transferable,
                started=provider.now(),
            )
        )
    ticks = int(step_ctx.get("ticks", 0))
    delay_ms = int(_param(ctx, "delay_ms", 0))
    tick_s = int(_param(ctx, "tick_ms", int(TICK_S * 1000))) / 1000
    if ticks * tick_s * 1000 < delay_ms:
        time.sleep(tick_s)
        step_ctx.put("ticks", ticks + 1)
        return RepeatStatus.CONTINUABLE
    failing = str(_param(ctx, "fail", ""))
    if failing == "*" or name in failing.split(","):
        if str(_param(ctx, "fail_mode", "raise")) == "status":
            se.status = BatchStatus.FAILED
            return RepeatStatus.FINISHED
        raise RuntimeError(f"partition {name} failed on purpose")
    lo, hi = int(step_ctx["lo"]), int(step_ctx["hi"])
    ctx.connection.execute(
        insert(ledger).values(
            job_execution_id=se.job_execution.id,
            step_execution_id=se.id,
            partition_name=name,
            node_id=node_id,
            attempt=attempt,
            transferable=transferable,
            lo=lo,
            hi=hi,
            total=sum(range(lo, hi)),
            started=datetime.fromisoformat(str(step_ctx["started"])),
            finished=provider.now(),
        )
    )
    step_ctx.put("done", True)
    return RepeatStatus.FINISHED


def build_registry(per_node: int = 4, items: int = 1000) -> JobRegistry:
    registry = JobRegistry()
    for job_name, transferable in (
        ("ledger", True),
        ("ledger-fixed", False),
        ("ledger-mixed", None),
    ):
        worker = TaskletStep(f"{job_name}.worker", ledger_tasklet)
        partitioner = RangePartitioner(transferable, per_node, items)
        registry.register(Job(job_name, [PartitionStep(f"{job_name}.master", worker, partitioner)]))
    return registry


#: ``--app dbcluster.testing.app:registry``
registry = build_registry()


def expected_total(items: int = 1000) -> int:
    return sum(range(items))


#: Eight partitions per live node: ``--app dbcluster.testing.app:wide_registry``.
wide_registry = build_registry(per_node=8)

#: Two partitions per live node, for chaos runs: ``dbcluster.testing.app:chaos_registry``.
chaos_registry = build_registry(per_node=2)
