"""The launch-request and schedule statements compile with every database's own dialect (Oracle,
SQL Server, Db2 and MySQL 8 have no server here: this is their proof)."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam

from dbcluster.dialects import BUILTIN_NAMES, provider_for_name
from dbcluster.dialects.base import LAUNCH_FAILED, LAUNCH_LAUNCHED, QueryProvider


def launch_statements(provider: QueryProvider) -> list:
    ids = bindparam("b_ids", expanding=True)
    return [
        provider.insert_launch_request(),
        provider.select_pending_launches(bindparam("b_jobs", expanding=True), 4),
        provider.lock_pending_launches(ids),
        provider.claim_launches(bindparam("b_node"), ids),
        provider.select_claimed_launches(bindparam("b_node"), ids),
        provider.end_launch(1, "n", LAUNCH_LAUNCHED),
        provider.end_launch(1, "n", LAUNCH_FAILED),
        provider.select_lost_launch(),
        provider.release_lost_launches(),
        provider.select_launch_request(1),
        provider.insert_schedule_fire(),
        provider.select_last_fire(bindparam("b_name")),
    ]


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_launch_statement_compiles(name: str) -> None:
    provider = provider_for_name(name)
    for stmt in launch_statements(provider):
        assert str(stmt.compile(dialect=provider.dialect)).strip()
    lock = str(provider.lock_pending_launches([1, 2]).compile(dialect=provider.dialect))
    # Concurrent claimers pass over each other's rows where the database can (SQL Server: the
    # READPAST table hint).
    skipping = "SKIP LOCKED" in lock.upper() or "READPAST" in lock.upper()
    assert skipping == provider.skip_locked()
    claim = str(provider.claim_launches("n", [1]).compile(dialect=provider.dialect))
    assert "status" in claim and "request_id IN" in claim.replace("batch_launch_requests.", "")
    released = str(provider.release_lost_launches().compile(dialect=provider.dialect))
    assert "NOT (EXISTS" in released or "NOT EXISTS" in released


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_the_new_tables_are_in_every_ddl(name: str) -> None:
    ddl = provider_for_name(name).ddl_script()
    assert "CREATE TABLE batch_launch_requests" in ddl
    assert "CREATE TABLE batch_schedule_fires" in ddl
    assert "ix_launch_status" in ddl and "pk_schedule_fires" in ddl
