"""A one-call partition's final write carries its fence's guard (in one statement where the
database can: ``QueryProvider.fold_guard``); a partition taken away while its call runs commits
nothing, its user writes included, and the guard still holds the partition row to COMMIT."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from dbcluster.batch import Job, PartitionStep, RepeatStatus, TaskletStep
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import partitions, step_execution
from dbcluster.testing.app import (
    FAST_SETTINGS,
    RangePartitioner,
    build_registry,
    ledger,
    one_row_tasklet,
)
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import record_events, transfer_while_parked

SETTINGS = FAST_SETTINGS.with_overrides(concurrency_limit=2)


def _registry(body: Any) -> Any:
    registry = build_registry()
    worker = TaskletStep("moved.worker", body)
    registry.register(
        Job("moved", [PartitionStep("moved.master", worker, RangePartitioner(True, 1, 10))])
    )
    return registry


def _written(backend: Backend, job_execution_id: int) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(ledger.c.step_execution_id).where(ledger.c.job_execution_id == job_execution_id)
        ).all()


@pytest.mark.backends("postgresql", "mariadb", "mysql")
def test_a_partition_taken_away_during_its_one_call_commits_nothing(
    backend: Backend, make_cluster: Any
) -> None:
    provider = backend.provider

    def body(ctx: ChunkContext) -> RepeatStatus:
        one_row_tasklet(ctx)  # the user's write, in the partition's one transaction
        # Meanwhile its master fails it (as after its node was judged dead): it commits, as
        # nothing holds the partition row yet.
        with backend.engine.begin() as conn:
            conn.execute(provider.fail_job_partitions(ctx.step_execution.job_execution.id))
        return RepeatStatus.FINISHED

    registry = _registry(body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    recorder = record_events(worker.node)
    execution = master.launch("moved", {"run": 1})
    assert execution.status is BatchStatus.FAILED
    assert _written(backend, execution.id) == [], "a partition taken away committed its write"
    lost = recorder.named("lost")
    assert len(lost) == 1 and "it moved" in lost[0]["reason"], recorder.names()
    with backend.engine.connect() as conn:
        row = conn.execute(
            select(partitions.c.status, step_execution.c.status.label("step"))
            .join(
                step_execution, step_execution.c.step_execution_id == partitions.c.step_execution_id
            )
            .where(partitions.c.job_execution_id == execution.id)
        ).one()
    # The mover's outcome stands; the fenced write changed nothing of the step (still STARTED).
    assert (row.status, row.step) == ("FAILED", "STARTED"), row


@pytest.mark.backends("postgresql", "mariadb", "mysql")
def test_a_transfer_waits_for_the_final_write_that_holds_its_partition(
    backend: Backend, make_cluster: Any
) -> None:
    def body(ctx: ChunkContext) -> RepeatStatus:
        one_row_tasklet(ctx)
        return RepeatStatus.FINISHED

    registry = _registry(body)
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    if worker.repository.commits_with_final_write:
        pytest.skip("the final write is sent with its COMMIT (tests/cluster/test_pipelined_commit)")

    def parked_on_final(**details: Any) -> bool:
        se = details.get("step_execution")
        return se is not None and se.step_name.startswith("moved.worker:")

    run, transfer, job_id = transfer_while_parked(
        backend.engine,
        lambda: master.launch("moved", {"run": 2}),
        "step.before_final_commit",
        parked_on_final,
        "its final write",
    )
    moved = transfer["moved"]
    transfer["thread"].join(20)
    run["thread"].join(30)
    assert moved == [0], "the final write landed first: nothing was left in flight to fail"
    assert run["result"].status is BatchStatus.COMPLETED
    assert len(_written(backend, job_id)) == 1


def test_the_folded_write_is_used_where_the_database_can(backend: Backend) -> None:
    from dbcluster.batch.repository import JobRepository

    folds = JobRepository(backend.engine).folds_guards
    assert folds == backend.provider.supports_writable_cte
