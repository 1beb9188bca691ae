"""A database outage that fails the partitions running on a node logs like any other outage: one
WARNING when it begins ("service partitions: database unavailable"), one INFO when it ends, and
each partition it interrupted says so at INFO; none logs a WARNING of its own, and nothing is an
ERROR. The partitions are tried again and complete.

A partition's transactions ride out an outage for as long as its node may act (up to its
fencing), but a step that reads the database outside its transactions (a SQL reader's pages)
fails at once, and its partition is tried again. Before, each such partition logged two
WARNINGs ("step ... failed", "failed on attempt 1 of 3; it will be tried again"): a 15 s
PostgreSQL restart under 16 running partitions logged 43 WARNING lines on two workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, Table, func, insert, select, update

from dbcluster.batch import (
    ChunkContext,
    ChunkStep,
    IntegerRangePartitioner,
    Job,
    JobRegistry,
    PartitionStep,
    SqlKeyRangeReader,
    StepExecution,
    item_writer,
)
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import partitions
from dbcluster.testing.app import FAST_SETTINGS, TIME_SCALE
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import cut_engine, cut_node
from dbcluster.testing.waiting import in_thread, wait_for

PARTITIONS = 8
ITEMS = PARTITIONS * 20
PAGE = 5
#: A page read takes this long: a partition spends most of its time reading.
READ_S = 0.1
#: The worker runs this many partitions at once: the outage interrupts each.
CAPACITY = 4


#: The items: each partition reads a range of ids and counts each item it writes in ``n``.
COLUMNS = (Column("id", Integer, primary_key=True, autoincrement=False), Column("n", Integer))
items = Table("dbc_outage_items", MetaData(), *COLUMNS)

#: Thresholds the outage does not reach: no node is fenced (that is not a routine outage).
SETTINGS = FAST_SETTINGS.with_overrides(
    unreachable_threshold=round(4000 * TIME_SCALE),
    cleanup_threshold=round(8000 * TIME_SCALE),
    concurrency_limit=CAPACITY,
)


class _Reads:
    """The test's reading engine, and a gate that holds the reads of a page while it is shut
    (so that the outage meets every running partition in a read, not in a chunk's commit,
    which rides it out)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.open = threading.Event()
        self.open.set()
        self.held = 0
        self.lock = threading.Lock()

    def gate(self) -> None:
        if self.open.is_set():
            return
        with self.lock:
            self.held += 1
        self.open.wait(20)


class _SlowReader(SqlKeyRangeReader):
    """A SQL reader whose pages take :data:`READ_S` each, on their own connection (outside the
    chunk's transaction, as every SQL reader's)."""

    reads: _Reads

    def _fetch(self) -> None:
        time.sleep(READ_S)
        self.reads.gate()
        super()._fetch()


def _registry(reads: _Reads) -> JobRegistry:
    def reader(step_execution: StepExecution) -> SqlKeyRangeReader:
        ctx = step_execution.execution_context
        found = _SlowReader(reads.engine, items, "id", ctx["lo"], ctx["hi"], page_size=PAGE)
        found.reads = reads
        return found

    @item_writer
    def write(rows: Sequence[dict[str, Any]], chunk: ChunkContext) -> None:
        ids = [row["id"] for row in rows]
        chunk.connection.execute(update(items).where(items.c.id.in_(ids)).values(n=items.c.n + 1))

    worker = ChunkStep("outage.slice", reader=reader, writer=write, chunk_size=PAGE)
    registry = JobRegistry()
    registry.register(
        Job(
            "outage",
            [
                PartitionStep(
                    "outage.master",
                    worker,
                    IntegerRangePartitioner(0, ITEMS, partitions=PARTITIONS, prefix="o-"),
                    retry_backoff=0.05,
                )
            ],
        )
    )
    return registry


@pytest.fixture
def reads(backend: Backend) -> Iterator[_Reads]:
    engine = backend.new_engine()
    items.drop(engine, checkfirst=True)
    items.create(engine)
    with engine.begin() as conn:
        conn.execute(insert(items), [{"id": i, "n": 0} for i in range(ITEMS)])
    yield _Reads(engine)
    items.drop(engine, checkfirst=True)
    engine.dispose()


def test_an_outage_that_fails_running_partitions_warns_once(
    backend: Backend, reads: _Reads, make_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    registry = _registry(reads)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    caplog.set_level(logging.INFO, logger="dbcluster")
    run = in_thread(lambda: master.launch("outage", {"run": 1}))
    wait_for(lambda: _written(reads.engine) >= CAPACITY * PAGE, 20, "the partitions to start")
    heartbeat = worker.node.services.get("heartbeat")
    assert heartbeat is not None
    reads.open.clear()
    wait_for(lambda: reads.held == CAPACITY, 10, "every running partition to be about to read")
    with ExitStack() as cut:
        cut.enter_context(cut_node(worker.node))
        cut.enter_context(cut_engine(reads.engine))
        reads.open.set()
        # Down until every running partition met the outage and so did the node's services
        # (the heartbeat: the last of them to meet it, at most an interval after it began).
        wait_for(lambda: _met(caplog) >= CAPACITY, 10, "the running partitions to fail")
        wait_for(lambda: heartbeat.outage.since is not None, 10, "the heartbeat to meet it")
    run["thread"].join(60)
    assert "error" not in run, run.get("error")
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status

    # Nothing lost or doubled, and the interrupted partitions were tried again.
    with reads.engine.connect() as conn:
        counts = {row.id: row.n for row in conn.execute(select(items.c.id, items.c.n))}
        attempts = conn.execute(
            select(func.max(partitions.c.attempt)).where(
                partitions.c.job_execution_id == execution.id
            )
        ).scalar_one()
    assert counts == dict.fromkeys(range(ITEMS), 1)
    assert attempts >= 2, "no partition was tried again: the outage interrupted none"

    records = [r for r in caplog.records if r.name.startswith("dbcluster")]
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert not errors, errors
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    # The node's one WARNING for the outage (from whichever of its services or partitions met
    # it first); none of a partition's own, none of each other service.
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("service ") and "database unavailable" in warnings[0]
    infos = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert any(": database available again (after" in i for i in infos), infos
    interrupted = [i for i in infos if "met a database outage on attempt 1 of 3" in i]
    assert len(interrupted) == CAPACITY, infos


def _met(caplog: pytest.LogCaptureFixture) -> int:
    """Steps of the test's partitions that failed (met the outage) so far."""
    return sum(
        1
        for r in list(caplog.records)
        if r.name == "dbcluster.batch.step" and r.getMessage().startswith("step outage.slice:")
    )


def _written(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.sum(items.c.n))).scalar_one() or 0)
