"""Placing and failing many partitions writes them in batches of the provider's
``partition_write_batch`` rows: one statement over a few thousand rows passes SQL Server's
lock-escalation threshold (about 5,000 locks) and takes a table lock on ``batch_partitions``
that stops every poll and claim. (Db2 counts a transaction's locks against LOCKLIST/MAXLOCKS;
abandoning a job stays one transaction, so that it is all or nothing: the README tells a DBA to
size them.)

Run on SQLite with the batch lowered to 5, counting what reaches the database.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.store import CoordinationStore, StrandedJob
from dbcluster.dialects import get_provider, make_engine
from dbcluster.dialects.sqlite import SQLiteProvider
from dbcluster.schema import metadata, partitions

BATCH = 5


@pytest.fixture
def small_batches(monkeypatch: Any) -> None:
    monkeypatch.setattr(SQLiteProvider, "partition_write_batch", BATCH, raising=False)


@pytest.mark.backends("sqlite")
def test_placing_writes_partitions_in_batches(backend: Any, make_cluster: Any, small_batches):
    inserts: list[int] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: Any):
        if statement.lstrip().upper().startswith("INSERT INTO BATCH_PARTITIONS"):
            inserts.append(len(parameters) if many else 1)

    # Every engine: the master places partitions through its node's own coordination engine.
    event.listen(Engine, "before_cursor_execute", record)
    try:
        a, _, _ = make_cluster(), make_cluster(), make_cluster()
        execution = a.launch("ledger", {"run": 1})
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert execution.status is BatchStatus.COMPLETED
    # The ledger job makes four partitions per live node (12 when all three had joined by the
    # launch, fewer on a machine slow to start them): every one in batches of at most BATCH.
    with backend.engine.connect() as conn:
        placed = len(
            conn.execute(
                select(partitions.c.step_execution_id).where(
                    partitions.c.job_execution_id == execution.id
                )
            ).all()
        )
    assert placed > BATCH and sum(inserts) == placed, (placed, inserts)
    assert max(inserts) <= BATCH and len(inserts) >= 2, inserts


@pytest.fixture
def engine(tmp_path: Any) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'batches.db'}")
    metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_abandoning_a_job_fails_its_partitions_in_batches_of_one_transaction(
    engine: Engine, small_batches
) -> None:
    repository = JobRepository(engine)
    params = JobParameters.parse(["run=1"])
    execution = repository.create_job_execution(
        repository.create_job_instance("wide", params), params
    )
    master = repository.create_step_execution(execution, "wide.master")
    workers = repository.create_step_executions(
        execution, [(f"wide.worker:p{i}", None) for i in range(12)]
    )
    store = CoordinationStore(engine, get_provider(engine))
    with engine.begin() as conn:
        store.insert_partitions(
            conn,
            [
                {
                    "step_execution_id": w.id,
                    "job_execution_id": execution.id,
                    "master_step_execution_id": master.id,
                    "partition_name": f"p{i}",
                    "assigned_node": "n1",
                    "transferable": True,
                }
                for i, w in enumerate(workers)
            ],
        )
    commits: list[int] = []
    updated: list[int] = []

    @event.listens_for(engine, "commit")
    def on_commit(conn: Any) -> None:
        commits.append(1)

    @event.listens_for(engine, "after_cursor_execute")
    def on_update(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE BATCH_PARTITIONS"):
            updated.append(cursor.rowcount)

    # A survivor abandons the job (its coordination row is this node's, RECOVERING).
    with engine.begin() as conn:
        conn.execute(store.provider.insert_coordination(execution.id, "survivor", "RECOVERING"))
    commits.clear()
    job = StrandedJob(execution.id, "survivor", 1, master.id, "RECOVERING")
    assert store.abandon(job, "master lost", repository) == "ABANDONED"
    assert updated == [5, 5, 2], "each batch is one UPDATE"
    assert len(commits) == 1, "the batches commit together: a job is abandoned whole or not at all"
    with engine.connect() as conn:
        statuses = set(conn.execute(select(partitions.c.status)).scalars())
    assert statuses == {"FAILED"}
