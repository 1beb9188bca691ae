"""The pruning and lease statements compile with every database's own dialect (Oracle, SQL
Server and Db2 have no server here: this is their proof); IN lists are expanding parameters."""

from __future__ import annotations

import pytest

from dbcluster.cluster.maintenance.pruner import FINISHED
from dbcluster.dialects import BUILTIN_NAMES, provider_for_name
from dbcluster.dialects.base import QueryProvider


def _statements(provider: QueryProvider) -> list:
    statuses, age = FINISHED, 30 * 86_400_000
    selected = provider.select_prunable(statuses, age, "COMPLETED", 0)
    return [
        selected,
        provider.select_prunable(statuses, age, "COMPLETED", 3),
        provider.select_prunable_recheck(statuses, age, "COMPLETED"),
        provider.select_steps_of(),
        *provider.delete_step_rows(),
        *provider.delete_job_rows(),
        provider.select_instances_of(),
        provider.delete_empty_instances(),
        *provider.count_prunable(provider.select_prunable(statuses, age, "COMPLETED", 2)).values(),
        provider.insert_lease("prune", "n"),
        provider.take_lapsed_lease("prune", "n", 10_000),
        provider.renew_leases(["prune"], "n", 10_000),
        provider.release_lease("prune", "n"),
    ]


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_pruning_statements_compile(name: str) -> None:
    provider = provider_for_name(name)
    for stmt in _statements(provider):
        for part in provider.bounded(stmt) if stmt.is_dml and not stmt.is_insert else [stmt]:
            assert str(part.compile(dialect=provider.dialect)).strip()


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_deletes_name_their_rows_by_key(name: str) -> None:
    """Every delete is by key with an IN list (no scan of a table the cluster writes), in
    foreign-key order: partitions, step contexts, steps; then the job's rows."""
    provider = provider_for_name(name)
    tables = [d.table.name for d in provider.delete_step_rows() + provider.delete_job_rows()]
    assert tables == [
        "batch_partitions",
        "batch_step_execution_context",
        "batch_step_execution",
        "batch_job_coordination",
        "batch_job_masters",
        "batch_job_execution_context",
        "batch_job_execution_params",
        "batch_job_execution",
    ]
    for stmt in provider.delete_step_rows() + provider.delete_job_rows():
        sql = str(stmt.compile(dialect=provider.dialect))
        assert " IN (" in sql.upper(), sql


def test_oracle_bounds_the_lock_wait_of_a_delete() -> None:
    provider = provider_for_name("oracle")
    lock, delete = provider.bounded(provider.delete_step_rows()[0])
    sql = str(lock.compile(dialect=provider.dialect))
    assert "FOR UPDATE WAIT" in sql and "batch_partitions" in sql.lower()
