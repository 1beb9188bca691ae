"""Provider tests of the repository's writes of many rows at once (a group's final writes),
against a live database. Collected through ``test_provider``, as ``claims`` is."""

from __future__ import annotations

from typing import Any

import pytest

from dbcluster import schema
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import utcnow
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.testing.suite.provider_helpers import _job

__all__ = [
    "test_a_groups_final_writes_from_arrays_write_what_row_by_row_writes",
]


def _ended(repository: JobRepository, job_id: int, tag: str) -> list[Any]:
    """Three new step executions of the job, ended COMPLETED in memory with counters, an exit
    description, and contexts changed (one too long for the short column)."""
    execution = repository.get_job_execution(job_id)
    assert execution is not None
    created = repository.create_step_executions(
        execution, [(f"suite.worker:{tag}{i}", ExecutionContext({"i": i})) for i in range(3)]
    )
    for i, se in enumerate(created):
        se.status = BatchStatus.COMPLETED
        se.exit_status = ExitStatus.COMPLETED.with_description(f"done {i}" if i else "")
        se.end_time = utcnow()
        se.commit_count, se.write_count, se.read_count = 1, i, i * 2
        if i:
            se.execution_context.put("k", "x" * (schema.SHORT_CONTEXT_LENGTH + 10) if i == 2 else i)
            se.execution_context.dirty = True
    return created


def test_a_groups_final_writes_from_arrays_write_what_row_by_row_writes(
    dbc_backend: Any,
) -> None:
    """Where the provider updates many rows from arrays (``update_from_arrays``), a group's
    final writes of its step executions and their changed contexts store what an executemany
    stores (each at its version, bumped; NULLs, long contexts and counters kept), and one row
    at another version refuses the group's update as it does there."""
    engine = dbc_backend.engine
    seen: dict[str, Any] = {}
    for name in ("executemany", "arrays"):
        repository = JobRepository(engine)
        if name == "executemany":
            repository.combined.bulk_updates = None
        elif repository.combined.bulk_updates is None:
            continue  # this database has no such statement: executemany only
        job_id, _, _ = _job(engine, 0)
        created = _ended(repository, job_id, "u")
        versions = [se.version for se in created]
        with engine.begin() as conn:
            repository.update_step_executions(created, conn)
        assert [se.version for se in created] == [v + 1 for v in versions]
        loaded = [repository.get_step_execution(se.id) for se in created]
        seen[name] = [
            (
                se.status,
                se.exit_status.code,
                se.exit_status.description,
                se.commit_count,
                se.write_count,
                se.read_count,
                se.version - version,
                se.execution_context.get("i"),
                se.execution_context.get("k"),
                se.end_time is not None,
            )
            for se, version in zip(loaded, versions, strict=True)
            if se is not None
        ]
        # One row moved on meanwhile: nothing of the group's update stands.
        stale = _ended(repository, job_id, "s")
        stale[1].version += 1
        with pytest.raises(OptimisticLockingFailureError), engine.begin() as conn:
            repository.update_step_executions(stale, conn)
        again = [repository.get_step_execution(se.id) for se in stale]
        assert all(se is not None and se.status is not BatchStatus.COMPLETED for se in again)
    long_text = "x" * (schema.SHORT_CONTEXT_LENGTH + 10)
    assert seen["executemany"] == [
        (BatchStatus.COMPLETED, "COMPLETED", "", 1, 0, 0, 1, 0, None, True),
        (BatchStatus.COMPLETED, "COMPLETED", "done 1", 1, 1, 2, 1, 1, 1, True),
        (BatchStatus.COMPLETED, "COMPLETED", "done 2", 1, 2, 4, 1, 2, long_text, True),
    ]
    assert len(set(map(repr, seen.values()))) == 1, seen
