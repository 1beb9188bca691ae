"""Every statement and the DDL compile with each database's own SQLAlchemy dialect.

Oracle, SQL Server and Db2 have no server on the test machine; this is the proof that their
providers produce SQL those dialects accept, with the vendor functions we rely on.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import bindparam, select
from sqlalchemy.sql.elements import ClauseElement

from dbcluster import schema
from dbcluster.dialects import BUILTIN_NAMES, provider_for_name
from dbcluster.dialects.base import PARTITION_COMPLETED, QueryProvider, SessionLimits
from dbcluster.schema import nodes
from dbcluster.testing.suite.statements import (
    CALLS,
    NEW_ROW,
    NOT_SQL,
    StatementError,
    provider_methods,
    render_all,
    unlisted,
)

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


#: Every dialect dbcluster compiles for: each built-in provider at the oldest server version it
#: supports, and Oracle's 23ai as well (native BOOLEAN, the offline dialect's default otherwise).
DIALECTS = [(name, None) for name in BUILTIN_NAMES] + [("oracle", (23,))]
DIALECT_IDS = [name if version is None else f"{name}{version[0]}" for name, version in DIALECTS]


def statements(provider: QueryProvider) -> list[Any]:
    """Every SQLAlchemy statement ``provider`` builds: each method of the provider contract, by
    introspection (``dbcluster.testing.suite.statements``), in each variant the product uses."""
    built: list[Any] = []
    for method in sorted(provider_methods(type(provider)) & set(CALLS)):
        built.extend(s for s in CALLS[method](provider) if isinstance(s, ClauseElement))
    return built


def test_every_provider_method_is_called_or_said_to_build_no_sql() -> None:
    """A method of any built-in provider that neither table lists fails here by name, the day
    it is written; an entry that names no method of any provider is stale."""
    classes = [type(provider_for_name(name)) for name in BUILTIN_NAMES]
    missing = {cls.__name__: unlisted(cls) for cls in classes if unlisted(cls)}
    assert not missing, f"say how to call these in dbcluster.testing.suite.statements: {missing}"
    known = set().union(*(provider_methods(cls) for cls in classes))
    assert not (set(CALLS) | set(NOT_SQL)) - known, "entries for methods no provider has"
    assert not set(CALLS) & set(NOT_SQL)


@pytest.mark.parametrize(("name", "version"), DIALECTS, ids=DIALECT_IDS)
def test_every_statement_compiles_on_every_dialect(
    name: str, version: tuple[int, ...] | None
) -> None:
    """Every statement of every provider method, compiled by the database's own SQLAlchemy
    dialect (Db2 through ibm_db_sa); a method that does not compile fails with its name."""
    provider = provider_for_name(name, version)
    rendered = render_all(provider)
    assert set(rendered) == provider_methods(type(provider)) & set(CALLS)
    clock_sql = str(provider.select_now().compile(dialect=provider.dialect))
    assert CLOCKS[name] in clock_sql
    stale = select(nodes.c.node_id).where(provider.older_than(nodes.c.last_heartbeat, 250))
    stale_sql = str(stale.compile(dialect=provider.dialect))
    assert STALENESS[name] in stale_sql
    # The column stands alone on one side of the comparison, so an index on it can serve.
    assert "last_heartbeat <" in stale_sql.replace("batch_nodes.", "")


def test_every_sql_method_gives_sql_on_some_database() -> None:
    """A method every database answers None (or nothing) for is dead, or its table entry calls
    it wrongly."""
    given: dict[str, int] = dict.fromkeys(CALLS, 0)
    for name, version in DIALECTS:
        for method, found in render_all(provider_for_name(name, version)).items():
            given[method] += len(found.sql)
    assert not [method for method, count in given.items() if not count]


def test_a_method_that_does_not_compile_fails_with_its_name() -> None:
    """The test of the test: Db2 through ibm_db_sa's own compiler (without the provider's
    mending), which cannot compile a locking read under SQLAlchemy 2, names exactly the methods
    that send one."""
    from ibm_db_sa.ibm_db import DB2Dialect_ibm_db

    from dbcluster.dialects.db2 import Db2Provider

    provider = provider_for_name("db2")
    provider.dialect = Db2Provider.offline_dialect(DB2Dialect_ibm_db)
    with pytest.raises(StatementError) as refused:
        render_all(provider)
    named = set(re.findall(r"db2: (\w+)\(\) does not compile", str(refused.value)))
    assert named == {
        "lock_node",
        "lock_removing",
        "lock_claimable",
        "lock_pending_launches",
        "locked",
    }
    assert "no attribute 'for_update'" in str(refused.value)


#: A one-row source standing in for a statement's new row (what riders take values from).
_NEW = NEW_ROW


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


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_bounded_write_compiles(name: str) -> None:
    """What each provider runs for a guarded write: the statement itself, after a bounded row
    lock where the database bounds no lock wait per session (Oracle)."""
    provider = provider_for_name(name)
    provider.limits = SessionLimits(lock_timeout_ms=2500, idle_in_transaction_ms=9000)
    for stmt in (provider.hold_partition(1, "n", 1), provider.fail_job_partitions(1)):
        compiled = [str(s.compile(dialect=provider.dialect)) for s in provider.bounded(stmt)]
        assert compiled[-1] == str(stmt.compile(dialect=provider.dialect))
        if name == "oracle":
            assert len(compiled) == 2 and "FOR UPDATE WAIT 3" in compiled[0], compiled
        else:
            assert len(compiled) == 1


SESSION_BOUNDS = {
    "postgresql": (
        {
            "connect_args": {
                "options": "-c lock_timeout=2500 -c idle_in_transaction_session_timeout=9000"
            }
        },
        [],
    ),
    "mysql": (
        {
            "pool_recycle": 4,
            "connect_args": {
                "init_command": "SET SESSION innodb_lock_wait_timeout = 3, wait_timeout = 9"
            },
        },
        [],
    ),
    "mariadb": (
        {
            "connect_args": {
                "init_command": "SET SESSION innodb_lock_wait_timeout = 3, "
                "idle_transaction_timeout = 9"
            }
        },
        [],
    ),
    "oracle": ({}, []),
    "mssql": ({}, ["SET LOCK_TIMEOUT 2500"]),
    "db2": ({}, ["SET CURRENT LOCK TIMEOUT = 3"]),
    "sqlite": ({}, []),
}


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_session_gets_its_lock_and_idle_bounds(name: str) -> None:
    provider = provider_for_name(name)
    limits = SessionLimits(lock_timeout_ms=2500, idle_in_transaction_ms=9000)
    options, statements_ = SESSION_BOUNDS[name]
    assert provider.session_engine_options(limits) == options
    assert provider.session_statements(limits) == statements_


#: How each database says "pass over rows another transaction holds" in a claim's locking read.
SKIP_CLAUSES = {
    "postgresql": "FOR UPDATE SKIP LOCKED",
    "mysql": "FOR UPDATE SKIP LOCKED",
    "mariadb": "FOR UPDATE SKIP LOCKED",
    "oracle": "FOR UPDATE SKIP LOCKED",
    "mssql": "FROM batch_partitions WITH (UPDLOCK, READPAST, ROWLOCK)",
    "db2": "FOR UPDATE SKIP LOCKED DATA",
}
#: The locking read of a node's row (a removal or a node leaving waits for what holds it).
ROW_LOCKS = {
    "postgresql": "FOR UPDATE",
    "mysql": "FOR UPDATE",
    "mariadb": "FOR UPDATE",
    "oracle": "FOR UPDATE",
    "mssql": "FROM batch_nodes WITH (UPDLOCK, ROWLOCK)",
    "db2": "FOR UPDATE",
}


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_claims_skip_rows_another_claimer_holds_where_the_database_can(name: str) -> None:
    """SQL Server (whose SQLAlchemy compiler drops ``with_for_update()`` without a word) takes
    table hints; Db2 says ``SKIP LOCKED DATA``; every server database passes over the rows
    another claimer holds. SQLite has one writer: the guarded claim decides."""
    provider = provider_for_name(name)
    ids = bindparam("b_ids", expanding=True)
    claims = [provider.lock_claimable(ids), provider.lock_pending_launches(ids)]
    removals = [provider.lock_node("n"), provider.lock_removing()]
    claim_sql = [str(s.compile(dialect=provider.dialect)).replace("\n", " ") for s in claims]
    lock_sql = [str(s.compile(dialect=provider.dialect)).replace("\n", " ") for s in removals]
    if name == "sqlite":
        assert not provider.skip_locked()
        assert not any("UPDATE" in sql or "WITH (" in sql for sql in claim_sql + lock_sql)
        return
    assert provider.skip_locked()
    clause = SKIP_CLAUSES[name].replace("batch_partitions", "{table}")
    for sql, table in zip(claim_sql, ("batch_partitions", "batch_launch_requests"), strict=True):
        assert clause.format(table=table) in sql, sql
        assert sql.count("SKIP LOCKED") + sql.count("READPAST") == 1, sql
    for sql in lock_sql:
        assert ROW_LOCKS[name] in sql, sql
        assert "SKIP" not in sql and "READPAST" not in sql, "a removal must wait, not skip"


def test_only_postgresql_sends_wake_ups_and_its_notify_compiles() -> None:
    assert [n for n in BUILTIN_NAMES if provider_for_name(n).supports_listen_notify] == [
        "postgresql"
    ]
    provider = provider_for_name("postgresql")
    sql = str(
        provider.notify(provider.notify_parameter("b_channels")).compile(dialect=provider.dialect)
    )
    assert "pg_notify" in sql and "unnest" in sql
    channel = provider.wake_channel("host-0123456789abcdef0123456789abcdef")
    assert channel.startswith("dbcluster_") and len(channel) <= 63 and channel.isidentifier()


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_a_lone_partitions_wake_up_rides_on_its_creation_only_where_nodes_are_woken(
    name: str,
) -> None:
    provider = provider_for_name(name)
    wake = provider.notify_from(_NEW, bindparam("b_channel"), _NEW.c.id)
    assert (wake is not None) == provider.supports_listen_notify
    if wake is not None:
        sql = str(wake.compile(dialect=provider.dialect))
        assert "pg_notify" in sql and "dbc_new" in sql
    placed = str(provider.insert_partition_from(_NEW, _NEW.c.id).compile(dialect=provider.dialect))
    assert "SELECT" in placed and "dbc_new" in placed  # nothing where the source has no row


def test_the_claim_writes_the_step_executions_status_as_the_repository_spells_it() -> None:
    from dbcluster.batch.status import BatchStatus, ExitStatus
    from dbcluster.dialects.base import STEP_EXECUTING, STEP_STARTED

    assert STEP_STARTED == BatchStatus.STARTED.value
    assert STEP_EXECUTING == ExitStatus.EXECUTING.code


def test_a_step_and_its_context_are_one_statement_where_the_database_allows() -> None:
    from dbcluster.batch.dao.statements import (
        STEP_CONTEXT_VALUES,
        UPDATE_STEP,
        UPDATE_STEP_CONTEXT,
    )

    combined = {
        n: provider_for_name(n).update_step_and_context(
            UPDATE_STEP, UPDATE_STEP_CONTEXT, STEP_CONTEXT_VALUES
        )
        for n in BUILTIN_NAMES
    }
    assert sorted(n for n, found in combined.items() if found is not None) == [
        "mariadb",
        "mysql",
        "postgresql",
    ]
    sql = str(combined["postgresql"].compile(dialect=provider_for_name("postgresql").dialect))
    assert sql.startswith("WITH dbc_context AS")
    assert "UPDATE batch_step_execution_context SET" in sql
    assert "RETURNING batch_step_execution_context.step_execution_id" in sql
    assert "batch_step_execution.version = %(b_version)s" in sql
    for name in ("mysql", "mariadb"):
        sql = str(combined[name].compile(dialect=provider_for_name(name).dialect))  # type: ignore[union-attr]
        assert sql.startswith("UPDATE batch_step_execution, batch_step_execution_context SET")
        assert "batch_step_execution_context.short_context=" in sql
        assert "batch_step_execution_context.step_execution_id = " in sql
        assert "batch_step_execution.version = " in sql


def test_a_wake_up_can_carry_the_ids_it_placed() -> None:
    from dbcluster.cluster.store import offer_payload, offered_ids

    provider = provider_for_name("postgresql")
    sql = str(
        provider.notify(
            provider.notify_parameter("b_channels"), provider.notify_parameter("b_payloads")
        ).compile(dialect=provider.dialect)
    )
    assert "pg_notify(anon_1.channel, anon_1.payload)" in sql and "unnest(" in sql
    assert 0 < provider.notify_payload_max < 8000, "PostgreSQL's payload limit is 8,000 bytes"
    ids = list(range(1_000_000, 1_002_000))
    payload = offer_payload(ids, provider.notify_payload_max)
    assert len(payload.encode()) <= provider.notify_payload_max
    named = offered_ids(payload)
    assert named == ids[: len(named)] and len(named) > 900
    assert offered_ids("") == [] and offered_ids("7,x,9") == [7, 9]
    assert offer_payload([], 100) == ""


def test_many_rows_are_one_insert_of_arrays_where_the_database_allows() -> None:
    from dbcluster.batch.dao.statements import NEW_STEP_COLUMNS

    placed = {n: provider_for_name(n).insert_partitions_from_arrays() for n in BUILTIN_NAMES}
    assert sorted(n for n, found in placed.items() if found is not None) == ["postgresql"]
    dialect = provider_for_name("postgresql").dialect
    sql = str(placed["postgresql"].compile(dialect=dialect))  # type: ignore[union-attr]
    assert sql.startswith("INSERT INTO batch_partitions (step_execution_id, job_execution_id,")
    assert "FROM unnest(%(a_step_execution_id)s::BIGINT[], " in sql
    assert "timezone('UTC', clock_timestamp())" in sql
    assert len(sql) < 2000, "one short text, whatever the number of rows"
    steps = provider_for_name("postgresql").insert_from_arrays(
        schema.step_execution, NEW_STEP_COLUMNS
    )
    sql = str(steps.compile(dialect=dialect))  # type: ignore[union-attr]
    # Bounded text binds unbounded: the column refuses an over-long value, no cast cuts it.
    assert "%(a_step_name)s::TEXT[]" in sql and "AS dbc_rows(version, step_name" in sql
    assert "%(a_exit_message)s::VARCHAR(2500)[]" in sql, "a clipping column keeps its type"


def test_a_placement_and_its_wake_ups_are_one_statement_where_the_database_allows() -> None:
    def together(name: str) -> Any:
        provider = provider_for_name(name)
        insert = provider.insert_partitions_from_arrays() or provider.insert_partitions()
        return provider.together(insert, "unused: no statement is made")

    found = {n: together(n) for n in BUILTIN_NAMES if n != "postgresql"}
    assert found == dict.fromkeys(found), "only PostgreSQL has both a writable CTE and NOTIFY"
    provider = provider_for_name("postgresql")
    stmt = provider.together(
        provider.insert_partitions_from_arrays(),  # type: ignore[arg-type]
        provider.notify(
            provider.notify_parameter("b_channels"), provider.notify_parameter("b_payloads")
        ),
    )
    sql = str(stmt.compile(dialect=provider.dialect))
    # The INSERT is a CTE of the notifying SELECT: both run, in that order, in one round trip.
    assert sql.startswith("WITH dbc_first AS \n(INSERT INTO batch_partitions (")
    assert sql.index("INSERT INTO batch_partitions") < sql.index("pg_notify(")
    assert "%(a_step_execution_id)s::BIGINT[]" in sql and "%(b_payloads)s::TEXT[]" in sql


def test_a_step_and_its_context_are_one_insert_where_the_database_allows() -> None:
    from sqlalchemy import insert

    from dbcluster.batch.dao.statements import NEW_CONTEXT_COLUMNS

    se, sc = schema.step_execution, schema.step_execution_context
    made = {
        n: provider_for_name(n).insert_child_row(
            insert(se), se.c.step_execution_id, sc, NEW_CONTEXT_COLUMNS
        )
        for n in BUILTIN_NAMES
    }
    assert sorted(n for n, found in made.items() if found is not None) == ["postgresql"]
    provider = provider_for_name("postgresql")
    sql = str(made["postgresql"].compile(dialect=provider.dialect))  # type: ignore[union-attr]
    # The step row is a CTE at the top (PostgreSQL refuses one nested in the INSERT's SELECT).
    assert sql.startswith("WITH dbc_parent AS \n(INSERT INTO batch_step_execution ")
    assert "INSERT INTO batch_step_execution_context (step_execution_id, short_context, " in sql
    assert sql.rstrip().endswith("SELECT dbc_parent.step_execution_id \nFROM dbc_parent")


def test_a_job_execution_its_context_and_parameters_are_one_insert_where_the_database_allows() -> (
    None
):
    """The parameters go as arrays, a row per element (none for a job without parameters)."""
    from dbcluster.batch.dao.combined import execution_with_children

    found = {n: execution_with_children(provider_for_name(n)) for n in BUILTIN_NAMES}
    assert sorted(n for n, f in found.items() if f is not None) == ["postgresql"]
    sql = str(found["postgresql"].compile(dialect=provider_for_name("postgresql").dialect))
    assert sql.startswith("WITH dbc_parent AS \n(INSERT INTO batch_job_execution (")
    assert "INSERT INTO batch_job_execution_context (job_execution_id, short_context, " in sql
    assert "unnest(%(a_parameter_name)s::TEXT[])" in sql
    assert "unnest(%(a_identifying)s::BOOLEAN[])" in sql
    assert sql.rstrip().endswith("SELECT dbc_parent.job_execution_id \nFROM dbc_parent")
    # A first launch's: its new instance first, and both ids back.
    first = execution_with_children(provider_for_name("postgresql"), new_instance=True)
    sql = str(first.compile(dialect=provider_for_name("postgresql").dialect))
    assert sql.startswith("WITH dbc_instance AS \n(INSERT INTO batch_job_instance (")
    assert "SELECT dbc_instance.job_instance_id AS job_instance_id," in sql
    assert sql.rstrip().endswith(
        "SELECT dbc_parent.job_execution_id, dbc_parent.job_instance_id \nFROM dbc_parent"
    )
    assert [
        n for n in BUILTIN_NAMES if execution_with_children(provider_for_name(n), True) is not None
    ] == ["postgresql"]


def test_a_final_write_carries_its_fence_in_one_statement_where_the_database_allows() -> None:
    from dbcluster.batch.dao.statements import UPDATE_STEP, UPDATE_STEP_CONTEXT

    def folded(name: str, context: bool) -> Any:
        provider = provider_for_name(name)
        guard = provider.finish_partition(
            bindparam("b_id"), bindparam("b_node"), bindparam("b_attempt"), PARTITION_COMPLETED
        )
        return provider.fold_guard(guard, UPDATE_STEP, UPDATE_STEP_CONTEXT if context else None)

    assert [n for n in BUILTIN_NAMES if folded(n, False) is not None] == ["postgresql"]
    dialect = provider_for_name("postgresql").dialect
    plain = str(folded("postgresql", False).compile(dialect=dialect))
    with_context = str(folded("postgresql", True).compile(dialect=dialect))
    # The partition row first; each later write only if the one before changed its row.
    assert plain.startswith("WITH dbc_guard AS \n(UPDATE batch_partitions SET status=")
    assert "EXISTS (SELECT dbc_guard.dbc_held" in plain
    assert plain.index("dbc_guard AS") < plain.index("dbc_written AS")
    assert with_context.index("dbc_guard AS") < with_context.index("dbc_context AS")
    assert with_context.index("dbc_context AS") < with_context.index("dbc_written AS")
    assert "IN (SELECT dbc_context.step_execution_id" in with_context
    assert "AS guarded" in plain and "AS written" in plain
