"""Provider selection, user errors, and the DDL commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from dbcluster.dialects import BUILTIN_NAMES, get_provider, provider_for_name, provider_for_url
from dbcluster.errors import MissingDriverError, UnsupportedBackendError

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg://u@h/db", "postgresql"),
        ("postgresql://u@h/db", "postgresql"),
        ("mysql+pymysql://u@h/db", "mysql"),
        ("mariadb+pymysql://u@h/db", "mariadb"),
        ("oracle+oracledb://u@h/db", "oracle"),
        ("db2+ibm_db://u@h/db", "db2"),
        ("sqlite:///x.db", "sqlite"),
        ("sqlite://", "sqlite"),
    ],
)
def test_provider_from_url(url: str, expected: str) -> None:
    assert provider_for_url(url).name == expected


def test_provider_from_engine_dialect_names() -> None:
    assert get_provider(create_engine("sqlite://")).name == "sqlite"
    # SQLAlchemy reports mariadb+pymysql as "mariadb" and Db2 as "ibm_db_sa".
    assert provider_for_name("db2").dialect.name in ("ibm_db_sa", "db2")
    from dbcluster.dialects.registry import provider_class_for_dialect_name

    assert provider_class_for_dialect_name("ibm_db_sa").name == "db2"  # type: ignore[union-attr]
    assert provider_class_for_dialect_name("mariadb").name == "mariadb"  # type: ignore[union-attr]


def test_unknown_and_malformed_urls_name_the_supported_backends() -> None:
    with pytest.raises(UnsupportedBackendError, match="supported: postgresql, mysql"):
        provider_for_url("informix://u@h/db")
    with pytest.raises(UnsupportedBackendError, match="cannot parse"):
        provider_for_url("not a url")
    with pytest.raises(UnsupportedBackendError, match="supported"):
        provider_for_name("nosuch")


def test_missing_driver_names_the_extra() -> None:
    from dbcluster.dialects import make_engine

    with pytest.raises(MissingDriverError, match=r"pip install 'dbcluster\[postgresql\]'"):
        make_engine("postgresql+pg8000://u:pw@h/db")


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_checked_in_schema_is_current(name: str) -> None:
    result = run_cli("ddl", "--dialect", name)
    assert result.returncode == 0, result.stderr
    checked_in = (ROOT / "schemas" / f"{name}.sql").read_text()
    assert result.stdout == checked_in, (
        f"schemas/{name}.sql is out of date: run `dbcluster ddl --dialect {name} "
        f"> schemas/{name}.sql`"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ddl", "--dialect", "informix"], "no dbcluster provider for 'informix'"),
        (["ddl", "--url", "::nonsense::"], "cannot parse database URL"),
        (["init", "--url", "postgresql+pg8000://u:s3cret@h/db"], "pip install"),
        (["init", "--url", "informix://u:s3cret@h/db"], "supported: postgresql"),
        (
            [
                "init",
                "--url",
                "postgresql+psycopg://u:s3cret@127.0.0.1:9/db",
                "--connect-timeout=0",
            ],
            "cannot connect",
        ),
    ],
)
def test_cli_errors_are_one_line_exit_2_no_traceback(args: list[str], message: str) -> None:
    result = run_cli(*args)
    # 3: the database is unavailable (docs/cli.md); 2: every other mistake.
    assert result.returncode == (3 if message == "cannot connect" else 2)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "s3cret" not in result.stderr + result.stdout


def test_init_creates_missing_tables_from_concurrent_processes(backend) -> None:
    from dbcluster.testing.backends import drop_tables

    drop_tables(backend.engine)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dbcluster.cli", "init", "--url", backend.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(code == 0 for code, _ in results), results
    again = run_cli("init", "--url", backend.url)
    assert again.returncode == 0 and "already exist" in again.stdout


def test_init_creates_an_index_missing_from_an_existing_table(backend) -> None:
    """DDL is not transactional on Oracle and MySQL: a crash between CREATE TABLE and CREATE
    INDEX leaves the table without its index, and a later init must add it."""
    from sqlalchemy import inspect

    from dbcluster.schema import nodes

    index = next(i for i in nodes.indexes if i.name == "ix_nodes_status_hb")
    with backend.engine.begin() as conn:
        index.drop(conn)
    assert "ix_nodes_status_hb" not in {
        i["name"] for i in inspect(backend.engine).get_indexes(nodes.name)
    }
    result = run_cli("init", "--url", backend.url)
    assert result.returncode == 0, result.stderr
    assert "created 1 missing index(es): ix_nodes_status_hb" in result.stdout
    names = {str(i["name"]).lower() for i in inspect(backend.engine).get_indexes(nodes.name)}
    assert "ix_nodes_status_hb" in names
    assert (
        run_cli("init", "--url", backend.url).stdout.strip() == "all dbcluster tables already exist"
    )
