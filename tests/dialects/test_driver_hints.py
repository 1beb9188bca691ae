"""A missing driver, system library, authentication package or trusted certificate is named in
one line, with what to install or set."""

from __future__ import annotations

import re
import socket
import tomllib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from dbcluster.dialects import BUILTIN_NAMES, make_engine, provider_class, provider_for_name
from dbcluster.dialects.registry import check_driver
from dbcluster.errors import MissingDriverError

ROOT = Path(__file__).resolve().parents[2]
EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]
#: SQLAlchemy's driver name -> the PyPI distribution that provides that module.
DISTRIBUTION = {
    "psycopg": "psycopg",
    "psycopg2": "psycopg2-binary",
    "pymysql": "PyMySQL",
    "mysqldb": "mysqlclient",
    "mariadbconnector": "mariadb",
    "oracledb": "oracledb",
    "cx_oracle": "cx_Oracle",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
    "ibm_db": "ibm-db",
    "ibm_db_dbi": "ibm-db",
}


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_driver_names_an_extra_that_installs_it(name: str) -> None:
    for driver, extra in provider_class(name).drivers.items():
        assert extra in EXTRAS, f"{name}: no extra {extra!r} for {driver}"
        packages = [re.split(r"[\[<>=]", p)[0] for p in EXTRAS[extra]]
        assert DISTRIBUTION[driver] in packages, f"dbcluster[{extra}] does not install {driver}"


@pytest.mark.parametrize(
    ("url", "extra"),
    [
        ("oracle+cx_oracle://u:pw@h/db", "oracle-cx"),
        ("mssql+pymssql://u:pw@h/db", "mssql-pymssql"),
        ("mysql+mysqldb://u:pw@h/db", "mysql-mysqlclient"),
        ("mariadb+mariadbconnector://u:pw@h/db", "mariadb-connector"),
        ("mysql+mariadbconnector://u:pw@h/db", "mariadb-connector"),
    ],
)
def test_missing_driver_names_its_own_extra(url: str, extra: str, monkeypatch: Any) -> None:
    parsed = make_url(url)
    dialect_class = parsed.get_dialect()

    def not_installed() -> None:
        raise ModuleNotFoundError(f"No module named {parsed.get_driver_name()!r}")

    monkeypatch.setattr(dialect_class, "import_dbapi", staticmethod(not_installed))
    provider = provider_class(parsed.get_backend_name())
    with pytest.raises(MissingDriverError, match=re.escape(f"pip install 'dbcluster[{extra}]'")):
        check_driver(parsed, provider)


def test_a_url_without_driver_names_the_installed_one(monkeypatch: Any) -> None:
    """mysql:// is SQLAlchemy's mysqlclient; with the mysql extra's PyMySQL installed the fix is
    mysql+pymysql://, not a C driver to build."""
    pytest.importorskip("pymysql")
    parsed = make_url("mysql://u:pw@h/db")
    dialect_class = parsed.get_dialect()

    def not_installed() -> None:
        raise ModuleNotFoundError("No module named 'MySQLdb'")

    monkeypatch.setattr(dialect_class, "import_dbapi", staticmethod(not_installed))
    with pytest.raises(MissingDriverError, match=re.escape("use mysql+pymysql:// in the URL")):
        check_driver(parsed, provider_class("mysql"))


def test_pyodbc_without_unixodbc_names_the_system_library(monkeypatch: Any) -> None:
    """pyodbc imports only where unixODBC is installed: without it the import fails with
    exactly this ImportError (observed on this machine), and pip cannot help."""
    parsed = make_url("mssql+pyodbc://u:pw@h/db?driver=ODBC+Driver+18+for+SQL+Server")
    dialect_class = parsed.get_dialect()

    def cannot_load() -> None:
        raise ImportError(
            "libodbc.so.2: cannot open shared object file: No such file or directory",
            name="pyodbc",
        )

    monkeypatch.setattr(dialect_class, "import_dbapi", staticmethod(cannot_load))
    with pytest.raises(MissingDriverError) as raised:
        check_driver(parsed, provider_class("mssql"))
    message = str(raised.value)
    assert "libodbc.so.2" in message and "unixODBC" in message and "msodbcsql18" in message
    assert "pip install" not in message


def _pyodbc_error(sqlstate: str, message: str) -> BaseException:
    """pyodbc's error shape (args = (sqlstate, message)); a stand-in when pyodbc cannot load."""
    try:
        import pyodbc

        return pyodbc.Error(sqlstate, message)
    except ImportError:
        return type("Error", (Exception,), {})(sqlstate, message)


def test_sql_server_connect_hints() -> None:
    provider = provider_for_name("mssql")
    untrusted = _pyodbc_error(
        "08001",
        "[08001] [Microsoft][ODBC Driver 18 for SQL Server]SSL Provider: [error:0A000086:SSL "
        "routines::certificate verify failed:self-signed certificate] (-1) (SQLDriverConnect)",
    )
    assert "TrustServerCertificate=yes" in (provider.connect_error_hint(untrusted) or "")
    no_driver = _pyodbc_error(
        "01000",
        "[01000] [unixODBC][Driver Manager]Can't open lib 'ODBC Driver 18 for SQL Server' : "
        "file not found (0) (SQLDriverConnect)",
    )
    hint = provider.connect_error_hint(no_driver) or ""
    assert "ODBC Driver 18 for SQL Server" in hint and "msodbcsql18" in hint
    refused = _pyodbc_error("08001", "[08001] TCP Provider: Error code 0x2749 (10057)")
    assert provider.connect_error_hint(refused) is None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pymysql_without_cryptography_gets_one_clear_line(monkeypatch: Any) -> None:
    """PyMySQL's own RuntimeError (its text read from the installed PyMySQL) raised while
    connecting becomes a MissingDriverError naming the extra, through the engine's error hook:
    the CLI prints it on one line."""
    import inspect

    import pymysql._auth

    source = inspect.getsource(pymysql._auth)
    assert "'cryptography' package is required for sha256_password or" in source
    text = "'cryptography' package is required for sha256_password or caching_sha2_password"
    text += " auth methods"
    engine = make_engine(f"mysql+pymysql://u@127.0.0.1:{_closed_port()}/db")

    def connect(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(text)

    monkeypatch.setattr(engine.dialect, "connect", connect)
    with pytest.raises(MissingDriverError, match=re.escape("pip install 'dbcluster[mysql]'")):
        engine.connect()
    from dbcluster.dialects import get_provider

    assert not get_provider(engine).is_transient(RuntimeError(text))
    engine.dispose()
