"""The stop's statements (dbcluster.cluster.stopping) compile with every database's dialect,
bounded as every guarded write is; Oracle, SQL Server and Db2 have no server here."""

from __future__ import annotations

from datetime import datetime

import pytest

from dbcluster.batch.dao.statements import UPDATE_JOB, UPDATE_RUNNING_JOB
from dbcluster.dialects import BUILTIN_NAMES, provider_for_name
from dbcluster.dialects.base import PARTITION_FAILED, SessionLimits


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_the_stop_statements_compile_and_are_bounded(name: str) -> None:
    provider = provider_for_name(name)
    provider.limits = SessionLimits(lock_timeout_ms=2500, idle_in_transaction_ms=9000)
    dialect = provider.dialect
    request = provider.request_stop(7, datetime(2026, 11, 30))
    sql = str(request.compile(dialect=dialect))
    assert "batch_job_execution" in sql and "version" not in sql.split("WHERE")[0], sql
    writes = [request, provider.stop_pending_partitions([1, 2, 3])]
    for stmt in writes:
        compiled = [str(s.compile(dialect=dialect)) for s in provider.bounded(stmt)]
        assert compiled[-1] == str(stmt.compile(dialect=dialect))
        assert len(compiled) == (2 if name == "oracle" else 1), compiled
    for stmt in (
        provider.select_stopping(),
        provider.select_pending_partition_ids(1).limit(provider.partition_write_batch),
        provider.select_partition_ids_in([1, 2], PARTITION_FAILED),
    ):
        assert str(stmt.compile(dialect=dialect)).startswith("SELECT")
    # The master's write of a running status keeps STOPPING; an end replaces it.
    running = str(UPDATE_RUNNING_JOB.compile(dialect=dialect))
    assert "CASE WHEN" in running, running
    assert "CASE" not in str(UPDATE_JOB.compile(dialect=dialect))
