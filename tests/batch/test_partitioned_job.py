"""``partitioned_job``: a function over a range of ids made into a partitioned job."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import insert

from dbcluster import ChunkContext, JobRegistry, partitioned_job
from dbcluster.batch import (
    BatchStatus,
    JobLauncher,
    JobParameters,
    JobRepository,
    LocalPartitionHandler,
    StepConfigurationError,
    TaskletStep,
)
from dbcluster.batch.partitioned import NEXT_ID_KEY, IdRangeStep
from dbcluster.batch.transactions import RetryPolicy


class Boom(Exception):
    """The failure a test injects."""


class Blip(Exception):
    """Stands for a transient database error."""


def _partitions(repo: JobRepository, execution: Any) -> dict[str, Any]:
    return {
        se.step_name: se
        for se in repo.get_step_executions(execution)
        if ":" in se.step_name  # a partition: <worker step>:<partition>
    }


def test_every_id_is_handed_once_in_chunks_of_at_most_chunk_size(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    calls: list[range] = []

    @partitioned_job(ids=range(1, 1001), partitions=4, chunk_size=60)
    def visit(ids: range, ctx: ChunkContext) -> None:
        calls.append(ids)

    execution = launcher.run(visit, {"run": 1})

    assert execution.status is BatchStatus.COMPLETED
    assert sorted(i for ids in calls for i in ids) == list(range(1, 1001))
    assert all(1 <= len(ids) <= 60 and ids.step == 1 for ids in calls)
    partitions = _partitions(repo, execution)
    assert len(partitions) == 4
    assert sum(se.read_count for se in partitions.values()) == 1000
    master = next(se for se in repo.get_step_executions(execution) if se.step_name == "visit")
    assert master.read_count == 1000


def test_partition_names_are_the_slices_they_hold(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    job = partitioned_job(lambda ids, ctx: None, name="names", ids=range(0, 100), partitions=4)
    execution = launcher.run(job, {"run": 1})
    assert sorted(_partitions(repo, execution)) == [
        "names-slice:ids-0-25",
        "names-slice:ids-25-50",
        "names-slice:ids-50-75",
        "names-slice:ids-75-100",
    ]


def test_ids_may_come_from_the_job_parameters(launcher: JobLauncher, repo: JobRepository) -> None:
    seen: set[int] = set()

    def upto(params: JobParameters) -> range:
        count = params["count"]
        assert isinstance(count, int)
        return range(1, count + 1)

    @partitioned_job(ids=upto, partitions=3)
    def count(ids: range, ctx: ChunkContext) -> None:
        seen.update(ids)

    execution = launcher.run(count, {"count": 50})

    assert execution.status is BatchStatus.COMPLETED
    assert seen == set(range(1, 51))
    assert sum(se.read_count for se in _partitions(repo, execution).values()) == 50


def test_writes_through_ctx_connection_commit_with_the_position_so_a_restart_does_each_id_once(
    launcher: JobLauncher, repo: JobRepository, tables: Any
) -> None:
    """A failure mid-partition rolls back its chunk; the restart resumes after the last
    committed chunk: every id is written exactly once over both runs."""
    failing = {"id": 437}

    @partitioned_job(ids=range(0, 600), partitions=3, chunk_size=25)
    def record(ids: range, ctx: ChunkContext) -> None:
        ctx.connection.execute(insert(tables.out), [{"item": i, "origin": "x"} for i in ids])
        if failing["id"] in ids:
            raise Boom(f"id {failing['id']}")

    first = launcher.run(record, {"run": 1})
    assert first.status is BatchStatus.FAILED
    written = tables.out_items()
    assert 0 < len(written) < 600 and failing["id"] not in written
    positions = {
        name: se.execution_context.get(NEXT_ID_KEY) for name, se in _partitions(repo, first).items()
    }
    assert positions["record-slice:ids-400-600"] == 425  # after the last committed chunk

    failing["id"] = -1
    second = launcher.restart(first.id, record)

    assert second.status is BatchStatus.COMPLETED
    assert tables.out_items() == list(range(600))
    assert tables.duplicates() == []
    # Only the failed partition ran again, from 425.
    assert list(_partitions(repo, second)) == ["record-slice:ids-400-600"]
    assert _partitions(repo, second)["record-slice:ids-400-600"].read_count == 175


def test_the_registry_decorator_registers_the_job_and_its_steps() -> None:
    registry = JobRegistry()

    @registry.partitioned_job(ids=range(10), transferable=False, max_attempts=1)
    def tidy(ids: range, ctx: ChunkContext) -> None: ...

    assert registry.get_job("tidy") is tidy
    assert registry.step_names() == ["tidy", "tidy-slice"]
    step = registry.get_step("tidy")
    assert isinstance(step, IdRangeStep)
    assert isinstance(registry.get_step("tidy-slice"), TaskletStep)
    assert step.max_attempts == 1
    assert step.partitioner.is_transferable("ids-0-10", {}) is False  # type: ignore[arg-type]
    assert registry.partition_step_of("tidy-slice") is step


def _two(ids: range, ctx: ChunkContext) -> None: ...


@pytest.mark.parametrize(
    ("function", "options", "message"),
    [
        (lambda ids: None, {"ids": range(3)}, "must take two arguments, (ids, ctx)"),
        (_two, {"ids": [1, 2]}, "ids must be a range or a function"),
        (_two, {"ids": range(0, 9, 2)}, "ids must be a range of step 1"),
        (_two, {"ids": range(3), "partitions": 0}, "partitions must be at least 1"),
        (_two, {"ids": range(3), "chunk_size": 0}, "chunk_size must be at least 1"),
        (42, {"ids": range(3)}, "needs a function"),
    ],
)
def test_a_job_that_cannot_work_is_refused_in_one_line(
    function: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(StepConfigurationError) as raised:
        partitioned_job(function, name="j", **options)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_ids_from_parameters_that_are_not_a_range_fail_the_job_with_the_reason(
    launcher: JobLauncher,
) -> None:
    not_a_range: Any = lambda params: [1, 2, 3]  # noqa: E731
    job = partitioned_job(lambda ids, ctx: None, name="bad", ids=not_a_range)
    execution = launcher.run(job, {"run": 1})
    assert execution.status is BatchStatus.FAILED
    assert "ids must be a range" in execution.exit_status.description


def test_an_empty_range_completes_with_no_partition(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    job = partitioned_job(lambda ids, ctx: None, name="empty", ids=range(5, 5))
    execution = launcher.run(job, {"run": 1})
    assert execution.status is BatchStatus.COMPLETED
    assert _partitions(repo, execution) == {}


def test_a_chunk_repeated_after_a_transient_error_sees_its_position_restored(
    backend: Any, tables: Any
) -> None:
    """The transaction of a chunk is repeated from the state it started in, so the function is
    called again with the same ids, and the position and read count are not counted twice."""
    calls: list[range] = []
    raised = {"done": False}

    @partitioned_job(ids=range(0, 20), partitions=1, chunk_size=10)
    def once(ids: range, ctx: ChunkContext) -> None:
        calls.append(ids)
        ctx.connection.execute(insert(tables.out), [{"item": i, "origin": "t"} for i in ids])
        if ids.start == 10 and not raised["done"]:
            raised["done"] = True
            raise Blip("server closed the connection")

    policy = RetryPolicy(is_transient=lambda e: isinstance(e, Blip), backoff_s=0.01)
    repo = JobRepository(backend.engine, policy)
    execution = JobLauncher(repo, LocalPartitionHandler(max_workers=1)).run(once, {"run": 1})

    assert execution.status is BatchStatus.COMPLETED
    assert calls == [range(0, 10), range(10, 20), range(10, 20)]
    assert tables.out_items() == list(range(20))
    (partition,) = _partitions(repo, execution).values()
    assert partition.read_count == 20
    assert partition.execution_context[NEXT_ID_KEY] == 20
