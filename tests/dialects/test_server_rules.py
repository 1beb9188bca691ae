"""What a real Oracle, SQL Server, Db2 or MySQL 8 server would reject or silently change, pinned
by compiling with each database's own SQLAlchemy dialect (no server is needed).

Oracle is compiled for 19c and for 23ai: the offline dialect otherwise assumes 23ai.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.schema import CreateTable
from test_provider_compile import statements

from dbcluster import schema
from dbcluster.dialects import BUILTIN_NAMES, provider_for_name

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["identifying", "transferable"]


def _text_columns() -> list[Any]:
    return [
        column
        for table in schema.ALL_TABLES
        for column in table.columns
        if isinstance(column.type, schema.ShortText)
    ]


# --- Oracle: DDL that 19c loads, the same on every version ----------------------------------------


@pytest.mark.parametrize("version", [(19,), (21,), (23,)])
def test_oracle_ddl_has_no_boolean_column_on_any_version(version: tuple[int, ...]) -> None:
    provider = provider_for_name("oracle", version)
    ddl = provider.ddl_script()
    assert ddl.startswith(f"-- dbcluster schema for oracle {version[0]} and later")
    assert "BOOLEAN" not in ddl, "ORA-00902 on 19c and 21c"
    for column in FLAGS:
        assert re.search(rf"\b{column} SMALLINT NOT NULL", ddl), column


def test_oracle_init_on_a_live_23ai_agrees_with_the_checked_in_script() -> None:
    """``init`` compiles with the connected dialect, whose initialize() turned native BOOLEAN
    on for a 23ai server; the checked-in script targets 19c. They must create the same tables."""
    checked_in = provider_for_name("oracle")
    live_23ai = provider_for_name("oracle", (23, 4))
    live_23ai.dialect.supports_native_boolean = True
    for table in schema.ALL_TABLES:
        offline = str(CreateTable(table).compile(dialect=checked_in.dialect))
        live = str(CreateTable(table).compile(dialect=live_23ai.dialect))
        assert offline == live, table.name


@pytest.mark.parametrize("version", [(19,), (23,)])
def test_oracle_statements_compile_and_flags_bind_as_numbers(version: tuple[int, ...]) -> None:
    provider = provider_for_name("oracle", version)
    assert provider.dialect.supports_native_boolean is (version >= (23,))
    for stmt in statements(provider):
        assert str(stmt.compile(dialect=provider.dialect)).strip()
    flag = schema.partitions.c.transferable.type.dialect_impl(provider.dialect)
    bind = flag.bind_processor(provider.dialect)
    result = flag.result_processor(provider.dialect, None)
    assert bind is not None and result is not None
    assert (bind(True), bind(False), bind(None)) == (1, 0, None)
    assert (result(1), result(0)) == (True, False)


def test_flags_stay_native_booleans_elsewhere() -> None:
    provider = provider_for_name("postgresql")
    assert "transferable BOOLEAN NOT NULL" in provider.ddl_script()
    flag = schema.partitions.c.transferable.type.dialect_impl(provider.dialect)
    bind = flag.bind_processor(provider.dialect)
    assert bind is None or bind(True) is True


def test_ddl_cli_names_and_checks_the_server_version() -> None:
    from test_registry_and_cli import run_cli

    result = run_cli("ddl", "--dialect", "oracle", "--server-version", "23")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("-- dbcluster schema for oracle 23 and later")
    assert "BOOLEAN" not in result.stdout
    checked_in = (ROOT / "schemas" / "oracle.sql").read_text()
    assert checked_in.startswith("-- dbcluster schema for oracle 19 and later")
    for args, message in [
        (["--server-version", "12.2"], "dbcluster supports oracle 19 and later, not 12.2"),
        (["--server-version", "xix"], "is not a version such as 19 or 11.5"),
    ]:
        refused = run_cli("ddl", "--dialect", "oracle", *args)
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [f"error: {refused.stderr.strip()[7:]}"]
        assert message in refused.stderr and "Traceback" not in refused.stderr


# --- text: clipped by the database's own measure --------------------------------------------------


def _stored(name: str, value: str) -> str:
    """The exit message as it is bound for ``name``'s dialect."""
    provider = provider_for_name(name)
    stmt = update(schema.step_execution).values(exit_message=value)
    compiled = stmt.compile(dialect=provider.dialect)
    processors = compiled._bind_processors
    param = next(k for k in compiled.binds if "exit_message" in k)
    return processors[param](value)


LIMITS = {
    # name: (what the database counts, its cap)
    "oracle": (len, 2500),
    "db2": (lambda s: len(s.encode()), 2500),
    "mssql": (lambda s: len(s.encode("utf-16-le")) // 2, 2500),
    "postgresql": (len, 2500),
    "mysql": (len, 2500),
    "mariadb": (len, 2500),
    "sqlite": (len, 2500),
}


@pytest.mark.parametrize("name", BUILTIN_NAMES)
@pytest.mark.parametrize("char", ["a", "é", "日", "😀"])
def test_exit_messages_are_clipped_to_what_the_column_holds(name: str, char: str) -> None:
    size, cap = LIMITS[name]
    long = "Traceback: " + char * 3000
    stored = _stored(name, long)
    assert stored.endswith("...") and long.startswith(stored[:-3])
    assert size(stored) <= cap, f"{name}: {size(stored)} > {cap} for {char!r}"
    if name == "oracle":
        assert len(stored.encode()) <= 4000, "VARCHAR2(n CHAR) still holds at most 4,000 bytes"
    short = "failed: " + char * 10
    assert _stored(name, short) == short


# --- keys compare case- and accent-sensitively; text is Unicode -----------------------------------


def test_sql_server_text_is_nvarchar_in_a_binary_collation() -> None:
    ddl = provider_for_name("mssql").ddl_script()
    for column in _text_columns():
        expected = f"{column.name} NVARCHAR({column.type.length}) COLLATE Latin1_General_100_BIN2"
        assert expected in ddl, expected
    assert " VARCHAR(" not in ddl


@pytest.mark.parametrize("name", ["mysql", "mariadb"])
def test_mysql_text_is_in_a_binary_collation(name: str) -> None:
    ddl = provider_for_name(name).ddl_script()
    for column in _text_columns():
        assert f"{column.name} VARCHAR({column.type.length}) COLLATE utf8mb4_bin" in ddl


@pytest.mark.parametrize("name", ["postgresql", "oracle", "db2", "sqlite"])
def test_other_databases_keep_their_exact_default_comparison(name: str) -> None:
    """PostgreSQL's deterministic collations, Oracle's NLS_COMP=BINARY, Db2's IDENTITY and
    SQLite's BINARY already compare keys exactly; no collation is named for them."""
    provider = provider_for_name(name)
    assert provider.text_collation is None
    assert "COLLATE" not in provider.ddl_script()


# --- Db2 ------------------------------------------------------------------------------------------


def _call_arguments(sql: str, start: int) -> str:
    """The text between the parenthesis opening at ``start`` and its match."""
    depth = 0
    for index in range(start, len(sql)):
        depth += {"(": 1, ")": -1}.get(sql[index], 0)
        if depth == 0:
            return sql[start + 1 : index]
    raise AssertionError(f"unbalanced parentheses in {sql}")


def test_db2_parameter_markers_in_function_arguments_are_cast() -> None:
    provider = provider_for_name("db2")
    calls = 0
    for stmt in statements(provider):
        sql = str(stmt.compile(dialect=provider.dialect))
        for call in re.finditer(r"\b(add_seconds|timestampadd|dateadd)\(", sql):
            args = _call_arguments(sql, call.end() - 1)
            calls += 1
            assert "?" not in args.replace("CAST(? AS DECIMAL(18, 3))", ""), sql
    assert calls, "no statement shifts the clock: the check saw nothing"


def test_db2_clob_is_sized_deliberately() -> None:
    ddl = provider_for_name("db2").ddl_script()
    assert ddl.count("serialized_context CLOB(1073741824)") == 2
    assert not re.search(r"\bCLOB\b(?!\()", ddl), "a bare CLOB holds 1 MB"


def _db2_row_bytes(table: Any) -> int:
    """Db2's row length: each column's width plus 4 for varying length and 1 if nullable."""
    sizes = {"BIGINT": 8, "INT": 4, "INTEGER": 4, "SMALLINT": 2, "BOOLEAN": 1, "TIMESTAMP": 10}
    dialect = provider_for_name("db2").dialect
    total = 0
    for column in table.columns:
        rendered = column.type.compile(dialect=dialect)
        varchar = re.fullmatch(r"VARCHAR\((\d+)\)", rendered)
        if varchar:
            total += int(varchar.group(1)) + 4
        elif rendered.startswith("CLOB"):
            total += 256  # the LOB descriptor kept in the row
        else:
            total += sizes[rendered.split("(")[0]]
        total += 1 if column.nullable else 0
    return total


def test_db2_row_size_is_documented() -> None:
    widest = max(_db2_row_bytes(table) for table in schema.ALL_TABLES)
    assert widest > 4005, "the rows fit 4 KB pages again: the Db2 note of docs/databases.md can go"
    page = (ROOT / "docs" / "databases.md").read_text()
    documented = re.search(r"rows\s+of\s+up\s+to\s+([\d.,]+)\s+bytes", page)
    assert documented, (
        "docs/databases.md must say how wide a Db2 row gets and that 4 KB pages are short"
    )
    assert int(documented.group(1).replace(",", "")) >= widest
    assert re.search(r"8\s+KB\s+pages", page) and "EXTENDED_ROW_SZ" in page


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_chaos_reads_flags_with_a_bound_value(name: str) -> None:
    """The shipped chaos harness compared ``transferable IS true``: no SQL on SQL Server, nor on
    Oracle, whose flags are SMALLINT."""
    from dbcluster.testing.chaos import held_transferable_statement

    provider = provider_for_name(name)
    sql = str(held_transferable_statement("n").compile(dialect=provider.dialect))
    assert re.search(r"transferable = (\?|:\w+|%s|%\(\w+\)s)", sql), sql


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_what_a_partitioned_step_aggregates_binds_no_untyped_result(name: str) -> None:
    """The sums a partitioned step's end reads compile on every database, and no CASE inside
    them returns a bound value (Db2: SQL0418N, an untyped marker in a function's arguments)."""
    from dbcluster.batch.dao.statements import (
        PARTITION_TOTALS,
        PARTITION_TOTALS_BETWEEN,
        PARTITIONS_UNFINISHED,
        PARTITIONS_UNFINISHED_BETWEEN,
    )

    provider = provider_for_name(name)
    for stmt in (
        PARTITION_TOTALS,
        PARTITION_TOTALS_BETWEEN,
        PARTITIONS_UNFINISHED,
        PARTITIONS_UNFINISHED_BETWEEN,
    ):
        sql = str(stmt.compile(dialect=provider.dialect))
        assert not re.search(r"\b(THEN|ELSE)\s+(\?|:\w+|%\(\w+\)s|\$\d+|@\w+)", sql), sql


# --- SQL Server: DATEADD's number is an int ------------------------------------------------------

_INT_MAX = 2**31 - 1


def _dateadd_numbers(provider: Any, stmt: Any) -> list[int]:
    """The numbers every DATEADD of ``stmt`` gets, as SQL Server would receive them."""
    sql = str(stmt.compile(dialect=provider.dialect, compile_kwargs={"literal_binds": True}))
    numbers = [int(n) for n in re.findall(r"dateadd\(\w+, (-?\d+),", sql)]
    assert numbers, sql
    return numbers


@pytest.mark.parametrize("days", [1, 24, 25, 30, 365, 3653])
def test_sql_server_staleness_fits_dateadds_int(days: int) -> None:
    """``older_than`` past ~24.8 days of milliseconds overflowed DATEADD's int (Msg 8115, a
    permanent error): ``prune --older-than 30d`` failed on SQL Server."""
    from dbcluster.testing.suite.statements import AGES_MS

    provider = provider_for_name("mssql")
    for ms in (*AGES_MS, days * 86_400_000, days * 86_400_000 + 1234):
        stmt = select(schema.nodes.c.node_id).where(
            provider.older_than(schema.nodes.c.last_heartbeat, ms)
        )
        numbers = _dateadd_numbers(provider, stmt)
        assert all(-_INT_MAX <= n <= _INT_MAX for n in numbers), (ms, numbers)
        sql = str(stmt.compile(dialect=provider.dialect, compile_kwargs={"literal_binds": True}))
        # The shift is the whole age: days, then the milliseconds left over.
        units = dict(re.findall(r"dateadd\((\w+), (-?\d+),", sql))
        shift = -int(units.get("day", 0)) * 86_400_000 - int(units.get("millisecond", 0))
        assert shift == ms, (ms, sql)


def test_sql_server_prunes_what_prune_after_30d_asks_without_an_overflow() -> None:
    """``DBCLUSTER_PRUNE_AFTER=30d`` (and ``prune --older-than 30d``): every statement the
    pruning sends gets its age as whole days."""
    from dbcluster.cluster.maintenance.pruner import PrunePolicy
    from dbcluster.cluster.settings import ClusterSettings

    age = ClusterSettings.from_env({"DBCLUSTER_PRUNE_AFTER": "30d"}).prune_after
    assert age == 30 * 86_400_000
    policy = PrunePolicy(older_than_ms=age)
    provider = provider_for_name("mssql")
    prunable = provider.select_prunable(policy.statuses, age, "COMPLETED", policy.keep_last)
    for stmt in (
        prunable,
        provider.select_prunable(policy.statuses, age, "COMPLETED", 5),
        provider.select_prunable_recheck(policy.statuses, age, "COMPLETED"),
        *provider.count_prunable(prunable).values(),
    ):
        numbers = _dateadd_numbers(provider, stmt)
        assert set(numbers) == {-30}, numbers  # a count's IN list repeats the condition


# --- Db2: the version columns are the ones an unquoted VERSION names ------------------------------


def test_db2_quotes_a_reserved_name_as_db2_folds_it() -> None:
    """ibm_db_sa quoted ``version`` as written, ``"version"``: a column no unquoted ``SELECT
    VERSION`` finds. The provider's dialect writes ``"VERSION"`` in the DDL and in every
    statement; names that need no quotes stay as they are."""
    provider = provider_for_name("db2")
    ddl = provider.ddl_script()
    assert '"version"' not in ddl and ddl.count('"VERSION" BIGINT NOT NULL') == 3
    assert "CREATE TABLE batch_job_instance" in ddl and '"' not in ddl.replace('"VERSION"', "")
    written = [str(s.compile(dialect=provider.dialect)) for s in statements(provider)]
    assert not [sql for sql in written if '"version"' in sql]
    step = update(schema.step_execution).values(version=schema.step_execution.c.version + 1)
    assert 'SET "VERSION"=(batch_step_execution."VERSION" + ?)' in str(
        step.compile(dialect=provider.dialect)
    )


def test_db2_migration_renames_the_lower_case_version_columns() -> None:
    """0.1.0 created ``"version"`` on Db2; 0002 renames it ``"VERSION"`` (and only on Db2)."""
    from dbcluster import migrations

    db2 = migrations.upgrade_sql(provider_for_name("db2"))
    for table in ("batch_job_instance", "batch_job_execution", "batch_step_execution"):
        assert f'ALTER TABLE {table} RENAME COLUMN "version" TO "VERSION";' in db2
    for name in BUILTIN_NAMES:
        if name != "db2":
            assert 'RENAME COLUMN "version"' not in migrations.upgrade_sql(provider_for_name(name))


def test_db2_locking_reads_render_db2s_clauses_on_the_providers_dialects_only() -> None:
    """Each with_for_update() form in Db2's words, on a dialect the provider serves; a dialect
    made elsewhere in the process keeps ibm_db_sa's own compiler (no process-wide patch)."""
    from ibm_db_sa.base import DB2Compiler
    from ibm_db_sa.ibm_db import DB2Dialect_ibm_db

    provider = provider_for_name("db2")
    nodes = schema.nodes
    read = select(nodes.c.node_id).where(nodes.c.node_id == "n")
    forms = {
        "FOR UPDATE": read.with_for_update(),
        "FOR UPDATE SKIP LOCKED DATA": read.with_for_update(skip_locked=True),
        "FOR UPDATE NOWAIT": read.with_for_update(nowait=True),
        "FOR UPDATE OF node_id": read.with_for_update(of=nodes.c.node_id),
        "WITH RS USE AND KEEP SHARE LOCKS SKIP LOCKED DATA": read.with_for_update(
            read=True, skip_locked=True
        ),
    }
    for clause, stmt in forms.items():
        assert str(stmt.compile(dialect=provider.dialect)).endswith(f"= ? {clause}"), clause
    assert DB2Dialect_ibm_db().statement_compiler is DB2Compiler
