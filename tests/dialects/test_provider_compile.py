"""Every statement and the DDL compile with each database's own SQLAlchemy dialect.

Oracle, SQL Server and Db2 have no server on the test machine; this is the proof that their
providers produce SQL those dialects accept, with the vendor functions we rely on.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dbcluster import schema
from dbcluster.dialects import BUILTIN_NAMES, provider_for_name
from dbcluster.dialects.base import COORD_STARTED, PARTITION_COMPLETED, QueryProvider
from dbcluster.schema import nodes

CLOCKS = {
    "postgresql": "timezone('UTC', clock_timestamp())",
    "mysql": "UTC_TIMESTAMP(6)",
    "mariadb": "UTC_TIMESTAMP(6)",
    "oracle": "SYS_EXTRACT_UTC(SYSTIMESTAMP)",
    "mssql": "SYSUTCDATETIME()",
    "db2": "CURRENT TIMESTAMP - CURRENT TIMEZONE",
    "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')",
}
STALENESS = {
    "postgresql": "last_heartbeat <",
    "mysql": "timestampadd(MICROSECOND,",
    "mariadb": "timestampadd(MICROSECOND,",
    "oracle": "numtodsinterval(",
    "mssql": "dateadd(millisecond,",
    "db2": "add_seconds(",
    "sqlite": "strftime(",
}
TIMESTAMP_TYPES = {
    "postgresql": "TIMESTAMP WITHOUT TIME ZONE",
    "mysql": "DATETIME(6)",
    "mariadb": "DATETIME(6)",
    "oracle": "TIMESTAMP",
    "mssql": "DATETIME2(6)",
    "db2": "TIMESTAMP",
    "sqlite": "DATETIME",
}


def statements(provider: QueryProvider) -> list:
    return [
        provider.select_now(),
        select(nodes.c.node_id).where(provider.older_than(nodes.c.last_heartbeat, 250)),
        provider.heartbeat("n", 1),
        provider.mark_unreachable(10_000),
        provider.remove_stale(30_000),
        provider.deregister_node("n"),
        provider.set_node_capacity("n", 0),
        provider.select_nodes(),
        provider.select_nodes_with_age(),
        provider.insert_partitions(),
        provider.claim_partition(1, "n", 1),
        provider.finish_partition(1, "n", 1, PARTITION_COMPLETED),
        provider.release_partition(1, "n", 1),
        provider.reassign_partition(1, "n", 1, "m"),
        provider.reassign_partition(1, None, 1, "m"),
        provider.fail_orphaned_partition(1, "n", 1),
        provider.select_pending_for_node("n", 10),
        provider.select_orphaned_partitions(1),
        provider.select_partition_counts(1),
        provider.select_partitions(1),
        provider.insert_coordination(1, "n", 2, "w"),
        provider.set_coordination_status(1, "n", [COORD_STARTED], "COMPLETED"),
        provider.select_stranded_masters(),
        provider.restart_coordination(1, "n", 2, "w"),
        provider.fail_job_partitions(1),
        provider.release_pending_for_node("n"),
        provider.select_recovering_owned_by("n"),
        provider.select_in_flight_count(1),
        select(nodes.c.node_id).where(provider.partition_guard(1, "n", 1)),
        provider.claim_stranded_master(1, "n", COORD_STARTED, "m"),
    ]


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_statement_compiles(name: str) -> None:
    provider = provider_for_name(name)
    for stmt in statements(provider):
        sql = str(stmt.compile(dialect=provider.dialect))
        assert sql.strip()
    clock_sql = str(provider.select_now().compile(dialect=provider.dialect))
    assert CLOCKS[name] in clock_sql
    stale = select(nodes.c.node_id).where(provider.older_than(nodes.c.last_heartbeat, 250))
    stale_sql = str(stale.compile(dialect=provider.dialect))
    assert STALENESS[name] in stale_sql
    # The column stands alone on one side of the comparison, so an index on it can serve.
    assert "last_heartbeat <" in stale_sql.replace("batch_nodes.", "")


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_ddl_compiles_with_precise_timestamps(name: str) -> None:
    provider = provider_for_name(name)
    ddl = provider.ddl_script()
    for table in schema.ALL_TABLES:
        assert f"CREATE TABLE {table.name}" in ddl
        assert len(table.name) <= 30
        for index in table.indexes:
            assert index.name and len(index.name) <= 30
    assert f"last_heartbeat {TIMESTAMP_TYPES[name]}" in ddl
    # Node ids have one width everywhere.
    widths = {
        col.type.length
        for table in schema.ALL_TABLES
        for col in table.columns
        if col.name in ("node_id", "assigned_node", "master_node")
    }
    assert widths == {schema.NODE_ID_LENGTH}


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_register_node_compiles(name: str) -> None:
    """The upsert each provider uses (native where the database has one)."""
    from unittest import mock

    provider = provider_for_name(name)
    executed: list[str] = []

    class FakeResult:
        rowcount = 0

    class FakeConnection:
        def execute(self, stmt, *args, **kwargs):
            executed.append(str(stmt.compile(dialect=provider.dialect)))
            return FakeResult()

        def begin_nested(self):
            return mock.MagicMock()

    provider.register_node(FakeConnection(), "n", "h")  # type: ignore[arg-type]
    assert executed and all("batch_nodes" in sql for sql in executed)
