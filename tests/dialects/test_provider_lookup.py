"""One way to find a provider, wherever it is asked (issue 17, items 2-4).

The providers here are registered in this process as their entry points would be (the
``register_provider`` fixture); ``tests/conformance/test_thirdparty_provider.py`` installs the
worked examples for real.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import CLOB, text
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateTable
from sqlalchemy.types import TypeEngine

from dbcluster import schema
from dbcluster.dialects import get_provider, make_engine, provider_for_url
from dbcluster.dialects.registry import provider_class_for_dialect
from dbcluster.dialects.sqlite import SQLiteProvider
from dbcluster.errors import MissingDriverError, UnsupportedBackendError

HERE = __name__


class AliasDialect(SQLiteDialect_pysqlite):
    """A URL scheme of its own for a dialect that keeps the name ``sqlite``."""

    supports_statement_cache = True


class AliasProvider(SQLiteProvider):
    """Chosen by URL scheme only (``sqlalchemy_names = ()``), with a type of its own."""

    name = "aliasdb"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ()
    example_url = "aliasdb://"

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        return CLOB() if kind == "long_text" else super().column_type(kind)

    @classmethod
    def driver_install_hint(cls, driver: str | None) -> str:
        return f"aliasdb has no {driver!r} driver; use aliasdb:///path (pip install aliasdb-x)"


class OfflineDialect(SQLiteDialect_pysqlite):
    name = "offlinedb"
    supports_statement_cache = True
    prepared_offline = False


class OfflineProvider(SQLiteProvider):
    """A provider whose dialect must be prepared before it compiles anything."""

    name = "offlinedb"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("offlinedb",)
    example_url = "offlinedb://"

    @classmethod
    def offline_dialect(cls, dialect_class: type[Dialect]) -> Dialect:
        dialect = dialect_class()
        dialect.prepared_offline = True  # type: ignore[attr-defined]
        return dialect


class UnservedDialect(SQLiteDialect_pysqlite):
    """A dialect no provider serves."""

    name = "unserved"
    supports_statement_cache = True


class PlainThirdParty(SQLiteProvider):
    """A provider from elsewhere that declares no install hint."""

    name = "plaindb"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("plaindb",)
    example_url = "plaindb://"
    drivers: ClassVar[dict[str, str]] = {}


class PlainDialect(SQLiteDialect_pysqlite):
    name = "plaindb"
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> Any:
        raise ImportError("No module named 'plaindb_driver'")


@pytest.fixture
def alias(register_provider: Any) -> None:
    register_provider("aliasdb", f"{HERE}:AliasProvider", ("aliasdb", HERE, "AliasDialect"))


# --- item 3: column types come from the provider that was chosen ----------------------------------


def test_types_come_from_the_provider_chosen_by_url_scheme(alias: None, tmp_path: Path) -> None:
    script = provider_for_url(f"aliasdb:///{tmp_path}/x.db").ddl_script()
    assert "serialized_context CLOB" in script, script
    engine = make_engine(f"aliasdb:///{tmp_path}/x.db")
    try:
        assert type(get_provider(engine)) is AliasProvider
        schema.metadata.create_all(engine)
        with engine.connect() as conn:
            created = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE name = :name"),
                {"name": "batch_step_execution_context"},
            ).scalar_one()
        assert "serialized_context CLOB" in created, created
    finally:
        engine.dispose()
    # The plain SQLite provider keeps its own types beside it.
    assert "serialized_context TEXT" in provider_for_url("sqlite://").ddl_script()


def test_a_dialect_no_provider_serves_is_an_error_not_generic_types() -> None:
    with pytest.raises(UnsupportedBackendError, match="'unserved'.*sqlalchemy_names"):
        str(CreateTable(schema.job_execution_context).compile(dialect=UnservedDialect()))
    # SQLAlchemy's own string dialect is no database: generic types, no error.
    assert "TEXT" in str(CreateTable(schema.job_execution_context))


def test_a_dialect_met_without_the_registry_goes_by_its_name(register_provider: Any) -> None:
    register_provider("offlinedb", f"{HERE}:OfflineProvider")
    assert provider_class_for_dialect(OfflineDialect()) is OfflineProvider
    assert provider_class_for_dialect(SQLiteDialect_pysqlite()) is SQLiteProvider


# --- item 2: a URL's provider compiles with its offline dialect -----------------------------------


def test_provider_for_url_prepares_the_dialect_with_offline_dialect(register_provider: Any) -> None:
    register_provider("offlinedb", f"{HERE}:OfflineProvider", ("offlinedb", HERE, "OfflineDialect"))
    assert provider_for_url("offlinedb:///x.db").dialect.prepared_offline is True


def test_ddl_by_url_equals_ddl_by_name_for_db2() -> None:
    """ibm_db_sa compiles some DDL from the server it is connected to; Db2's offline_dialect says
    which server to assume. Without it each table logs a warning and guesses."""
    pytest.importorskip("ibm_db_sa")
    assert provider_for_url("db2+ibm_db://u@h/db").dialect.dbms_name == "DB2/LINUXX8664"

    def ddl(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "dbcluster.cli", "ddl", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    by_url, by_name = ddl("--url", "db2+ibm_db://u@h/db"), ddl("--dialect", "db2")
    assert by_url.returncode == 0 and by_name.returncode == 0, by_url.stderr + by_name.stderr
    assert by_url.stdout == by_name.stdout
    assert by_url.stderr == "", by_url.stderr


# --- item 4: the missing-driver message is the provider's own -------------------------------------


def test_a_third_party_provider_gives_its_own_install_hint(alias: None) -> None:
    with pytest.raises(MissingDriverError) as caught:
        make_engine("aliasdb+nosuchdriver:///x.db")
    assert "aliasdb has no 'nosuchdriver' driver; use aliasdb:///path" in str(caught.value)
    assert "dbcluster[" not in str(caught.value)


def test_without_a_hint_no_dbcluster_extra_is_invented(register_provider: Any) -> None:
    register_provider("plaindb", f"{HERE}:PlainThirdParty", ("plaindb", HERE, "PlainDialect"))
    with pytest.raises(MissingDriverError) as caught:
        make_engine("plaindb:///x.db")
    message = str(caught.value)
    assert "dbcluster[" not in message, message
    assert "plaindb provider's documentation" in message, message


def test_built_in_providers_name_their_extra() -> None:
    with pytest.raises(MissingDriverError, match=r"pip install 'dbcluster\[oracle-cx\]'"):
        make_engine("oracle+cx_oracle://u:pw@h/db")


def test_cli_reports_a_third_party_hint_on_one_line(
    alias: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from dbcluster.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["init", "--url", "aliasdb+nosuchdriver:///x.db"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "aliasdb has no 'nosuchdriver' driver" in err
    assert len(err.strip().splitlines()) == 1, err
