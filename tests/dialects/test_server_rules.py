"""What a real Oracle, SQL Server, Db2 or MySQL 8 server would reject or silently change, pinned
by compiling with each database's own SQLAlchemy dialect (no server is needed).

Oracle is compiled for 19c and for 23ai: the offline dialect otherwise assumes 23ai.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
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
    assert widest > 4005, "the rows fit 4 KB pages again: the README's Db2 note can go"
    readme = (ROOT / "README.md").read_text()
    documented = re.search(r"rows\s+of\s+up\s+to\s+([\d.,]+)\s+bytes", readme)
    assert documented, "README must say how wide a Db2 row gets and that 4 KB pages are short"
    assert int(documented.group(1).replace(",", "")) >= widest
    assert re.search(r"8\s+KB\s+pages", readme) and "EXTENDED_ROW_SZ" in readme


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
