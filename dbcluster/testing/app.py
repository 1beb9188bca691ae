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

``dbc_test_commits`` judges fencing by commit order: with :func:`install_observer`, the last
statement of every fenced transaction (after the engine's own fence, just before ``COMMIT``)
reads its owner row with a lock (the partition's row for a worker, the coordination row for a
master) and records what it saw. A row that commits with an owner other than the writer's own
(another node or attempt, another master or epoch) proves a write landed after its partition or
job moved. The ``ledger-steps`` job ends with a step its master runs itself, whose effect
(``dbc_test_master_effects``) must land once per job instance.
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
    AutoRestart,
    ChunkContext,
    ChunkStep,
    ExecutionContext,
    IterableItemReader,
    Job,
    JobRegistry,
    PartitionStep,
    RepeatStatus,
    TaskletStep,
    item_writer,
)
from dbcluster.batch.partition import BasePartitioner
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.schema import Id, Timestamp
from dbcluster.testing.waiting import TIME_SCALE

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

commits = Table(
    "dbc_test_commits",
    ledger_metadata,
    Column("id", Id, Identity(start=1), primary_key=True),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("step_execution_id", BigInteger),
    Column("kind", String(20), nullable=False),  # "partition" or "master"
    Column("final", Boolean(name="ck_commits_final"), nullable=False),
    Column("node_id", String(100), nullable=False),
    Column("token", Integer, nullable=False),  # the attempt, or the master's epoch
    Column("seen_node", String(100)),
    Column("seen_token", Integer),
    Column("seen_status", String(20)),
    Column("at", Timestamp),
)

master_effects = Table(
    "dbc_test_master_effects",
    ledger_metadata,
    Column("id", Id, Identity(start=1), primary_key=True),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("job_key", String(100), nullable=False),
    Column("node_id", String(100)),
    Column("epoch", Integer),
    Column("at", Timestamp),
)

items_written = Table(
    "dbc_test_items",
    ledger_metadata,
    Column("id", Id, Identity(start=1), primary_key=True),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("job_key", String(100), nullable=False),
    Column("item", Integer, nullable=False),
    Column("node_id", String(100)),
    Column("epoch", Integer),
)

TICK_S = 0.02

if os.environ.get("DBCLUSTER_FAULT_CUT_FILE"):  # set by the fault harness for its nodes
    from dbcluster.testing.faults import install_cut_switch

    install_cut_switch(os.environ["DBCLUSTER_FAULT_CUT_FILE"])


#: ``DBCLUSTER_TEST_GROUPED=1``: the partitions' tasklets (their effects are all in their
#: transactions) are declared ``transactional``, so nodes group their short partitions (grouped
#: commits: docs/cluster.md); the suite's and chaos's runs then exercise grouping.
GROUPED = os.environ.get("DBCLUSTER_TEST_GROUPED", "0") == "1"

#: Short thresholds for tests: a dead node is removed after one second (times TIME_SCALE).
FAST_SETTINGS = ClusterSettings(
    heartbeat_interval=100,
    task_polling_interval=50,
    unreachable_threshold=round(500 * TIME_SCALE),
    cleanup_threshold=round(1000 * TIME_SCALE),
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


class RetryableError(Exception):
    """What the ``ledger-retry`` job's partition step declares worth another try."""


def _param(ctx: ChunkContext, name: str, default: Any) -> Any:
    params = ctx.job_parameters
    return params[name] if name in params else default


def _observe(
    conn: Any, step_execution: Any = None, job_execution: Any = None, **details: Any
) -> None:
    """Record, in the transaction about to commit, the owner row it holds (see the module)."""
    from sqlalchemy import select

    from dbcluster.cluster.fencing import PartitionFence
    from dbcluster.cluster.mastership import Mastership
    from dbcluster.dialects import get_provider
    from dbcluster.schema import job_coordination, partitions

    execution = step_execution if step_execution is not None else job_execution
    fence = getattr(execution, "fence", None)
    if isinstance(fence, PartitionFence):
        kind, node_id, token = "partition", fence.node_id, fence.attempt
        seen = conn.execute(
            select(partitions.c.assigned_node, partitions.c.attempt, partitions.c.status)
            .where(partitions.c.step_execution_id == fence.step_execution_id)
            .with_for_update()
        ).first()
        job_execution_id = step_execution.job_execution.id
    elif isinstance(fence, Mastership):
        kind, node_id, token = "master", fence.node_id, fence.epoch
        seen = conn.execute(
            select(
                job_coordination.c.master_node,
                job_coordination.c.master_epoch,
                job_coordination.c.status,
            )
            .where(job_coordination.c.job_execution_id == fence.job_execution_id)
            .with_for_update()
        ).first()
        job_execution_id = fence.job_execution_id
    else:
        return
    # A step's last transaction of work may also record its end (see commit_step): final too.
    final = bool(details.get("final")) or not execution.status.is_running
    conn.execute(
        insert(commits).values(
            job_execution_id=job_execution_id,
            step_execution_id=getattr(step_execution, "id", None),
            kind=kind,
            final=final,
            node_id=node_id,
            token=token,
            seen_node=None if seen is None else seen[0],
            seen_token=None if seen is None else seen[1],
            seen_status=None if seen is None else seen[2],
            at=get_provider(conn.engine).now(),
        )
    )


def install_observer() -> None:
    """Record every fenced transaction's owner row at commit time (``dbc_test_commits``)."""
    from dbcluster import points

    points.remove("transaction.before_commit", _observe)
    points.install("transaction.before_commit", _observe)


def remove_observer() -> None:
    from dbcluster import points

    points.remove("transaction.before_commit", _observe)


def one_row_tasklet(ctx: ChunkContext) -> RepeatStatus:
    """Write the partition's one ledger row (with the node and attempt that wrote it) in the
    step's transaction, at once: a partition whose whole cost is one INSERT."""
    from dbcluster.cluster.executor import current_attempt, current_node_id

    se = ctx.step_execution
    ctx.connection.execute(
        insert(ledger).values(
            job_execution_id=se.job_execution.id,
            step_execution_id=se.id,
            partition_name=se.step_name,
            node_id=current_node_id.get(),
            attempt=current_attempt.get(),
            transferable=True,
            lo=0,
            hi=1,
            total=1,
        )
    )
    return RepeatStatus.FINISHED


def ledger_tasklet(ctx: ChunkContext) -> RepeatStatus:
    """Tick until ``delay_ms`` has passed, then record the slice's sum in the ledger."""
    from dbcluster import points
    from dbcluster.batch.domain import utcnow
    from dbcluster.cluster.executor import current_attempt, current_node_id

    points.reach("app.checkpoint", node_id=current_node_id.get())

    from dbcluster.dialects import get_provider

    se = ctx.step_execution
    name = se.step_name.split(":", 1)[1]
    step_ctx = ctx.step_context
    if step_ctx.get("done"):
        # The effect committed in an earlier attempt or execution (its node died before the
        # step's COMPLETED status was written): record nothing twice.
        return RepeatStatus.FINISHED
    ticks = int(step_ctx.get("ticks", 0))
    delay_ms = int(_param(ctx, "delay_ms", 0))
    tick_s = int(_param(ctx, "tick_ms", int(TICK_S * 1000))) / 1000
    ticking = ticks * tick_s * 1000 < delay_ms
    if ticking:
        # Before this transaction writes anything: on SQLite the first write takes the
        # database's one write lock, and a tick slept under it would stall every other
        # process's heartbeat for its length (eight partitions starting together: seconds).
        time.sleep(tick_s)
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
    if ticking:
        step_ctx.put("ticks", ticks + 1)
        return RepeatStatus.CONTINUABLE
    stalling = str(_param(ctx, "stall", ""))
    if attempt == 1 and (stalling == "*" or name in stalling.split(",")):
        # Stuck on its first try (outside any database transaction: nothing ran in this one):
        # its step's timeout fences it, and it is tried again elsewhere.
        time.sleep(int(_param(ctx, "stall_ms", 5000)) / 1000)
    flaky = str(_param(ctx, "flaky", ""))
    if (flaky == "*" or name in flaky.split(",")) and (attempt or 1) < int(
        _param(ctx, "flaky_until", 3)
    ):
        raise RetryableError(f"partition {name} failed on purpose on attempt {attempt}")
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


def _write_items(items: list[int], ctx: ChunkContext) -> None:
    """Each item once per job instance, written with the chunk (its commit is the item's). It
    takes ``item_ms`` (a job parameter, default 2) per item before its first statement, so that a
    master can be stopped inside the step with no transaction of its open."""
    from dbcluster.cluster.mastership import Mastership

    time.sleep(int(_param(ctx, "item_ms", 2)) * len(items) / 1000)
    fence = ctx.step_execution.fence
    je = ctx.step_execution.job_execution
    ctx.connection.execute(
        insert(items_written),
        [
            {
                "job_execution_id": je.id,
                "job_key": je.job_instance.job_key,
                "item": item,
                "node_id": fence.node_id if isinstance(fence, Mastership) else None,
                "epoch": fence.epoch if isinstance(fence, Mastership) else None,
            }
            for item in items
        ],
    )


def master_effect_tasklet(ctx: ChunkContext) -> RepeatStatus:
    """A step the master runs itself: record one effect per job instance (its ``done`` marker
    commits with it, and a restart resumes from that context)."""
    from dbcluster.cluster.mastership import Mastership
    from dbcluster.dialects import get_provider

    se = ctx.step_execution
    if ctx.step_context.get("done"):
        return RepeatStatus.FINISHED
    delay_ms = int(_param(ctx, "final_delay_ms", 0))
    if delay_ms and not ctx.step_context.get("waited"):
        time.sleep(delay_ms / 1000)
        ctx.step_context.put("waited", True)
        return RepeatStatus.CONTINUABLE
    fence = se.fence
    ctx.connection.execute(
        insert(master_effects).values(
            job_execution_id=se.job_execution.id,
            job_key=se.job_execution.job_instance.job_key,
            node_id=fence.node_id if isinstance(fence, Mastership) else None,
            epoch=fence.epoch if isinstance(fence, Mastership) else None,
            at=get_provider(ctx.connection.engine).now(),
        )
    )
    ctx.step_context.put("done", True)
    return RepeatStatus.FINISHED


def build_registry(per_node: int = 4, items: int = 1000) -> JobRegistry:
    registry = JobRegistry()
    for job_name, transferable in (
        ("ledger", True),
        ("ledger-fixed", False),
        ("ledger-mixed", None),
    ):
        worker = TaskletStep(f"{job_name}.worker", ledger_tasklet, transactional=GROUPED)
        partitioner = RangePartitioner(transferable, per_node, items)
        registry.register(Job(job_name, [PartitionStep(f"{job_name}.master", worker, partitioner)]))
    # Retries and timeouts: a partition that fails with RetryableError is tried again (three
    # tries); one that makes no progress for 1.5 s is fenced and tried again elsewhere.
    registry.register(
        Job(
            "ledger-retry",
            [
                PartitionStep(
                    "ledger-retry.master",
                    TaskletStep("ledger-retry.worker", ledger_tasklet, transactional=GROUPED),
                    RangePartitioner(True, per_node, items),
                    max_attempts=3,
                    retry_on=(RetryableError,),
                    retry_backoff=0.1,
                    timeout=1.5,
                )
            ],
        )
    )
    # Non-transferable partitions with an automatic restart: a partition lost with its node
    # fails the execution (NODE_LOST), and a node restarts it.
    registry.register(
        Job(
            "ledger-autorestart",
            [
                PartitionStep(
                    "ledger-autorestart.master",
                    TaskletStep("ledger-autorestart.worker", ledger_tasklet, transactional=GROUPED),
                    RangePartitioner(False, per_node, items),
                )
            ],
            auto_restart=AutoRestart(max_restarts=2, backoff=0.2),
        )
    )
    # A chunk step the master runs itself, one item per row of dbc_test_items (a master that
    # died inside it is succeeded by one that resumes after its last commit).
    registry.register(
        Job(
            "ledger-chunks",
            [
                ChunkStep(
                    "ledger-chunks.items",
                    reader=lambda se: IterableItemReader(range(items), name="items"),
                    writer=item_writer(_write_items),
                    chunk_size=50,
                ),
                TaskletStep("ledger-chunks.final", master_effect_tasklet),
            ],
        )
    )
    # A partitioned step, then a step the master runs itself (a master paused between the two
    # must not publish the second step's effect after a survivor took the job).
    registry.register(
        Job(
            "ledger-steps",
            [
                PartitionStep(
                    "ledger-steps.master",
                    TaskletStep("ledger-steps.worker", ledger_tasklet, transactional=GROUPED),
                    # Transferable: the step survives its workers' faults, so that its master
                    # gets to the step after it.
                    RangePartitioner(True, per_node, items),
                ),
                TaskletStep("ledger-steps.final", master_effect_tasklet),
            ],
        )
    )
    return registry


#: ``--app dbcluster.testing.app:registry``
registry = build_registry()


def expected_total(items: int = 1000) -> int:
    return sum(range(items))


#: Eight partitions per live node: ``--app dbcluster.testing.app:wide_registry``.
wide_registry = build_registry(per_node=8)

#: Two partitions per live node, for chaos runs: ``dbcluster.testing.app:chaos_registry``.
chaos_registry = build_registry(per_node=2)

# Set by the fault harness for its nodes: its fault points, and commit-order observations.
if os.environ.get("DBCLUSTER_FAULT_DIR"):
    from dbcluster.testing.faults import install_fault_control

    install_fault_control(os.environ["DBCLUSTER_FAULT_DIR"])
    install_observer()
