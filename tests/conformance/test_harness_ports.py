"""The fault harness proxies a URL without a port to the provider's declared default port
(issue 17, item 1): the URL forms the README documents must reach the conformance suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy.engine import make_url

from dbcluster.dialects.postgresql import PostgreSQLProvider
from dbcluster.errors import ConfigurationError
from dbcluster.testing.harness import Harness

HERE = __name__


class NoPortProvider(PostgreSQLProvider):
    """A network database whose provider forgot to declare its port."""

    name = "noportdb"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ()
    default_port = None


def proxied(url: str, workdir: Path) -> tuple[str, tuple[str, int]]:
    harness = Harness(url, workdir)
    node_url, proxy = harness._node_url()
    assert proxy is not None, f"{url} was not proxied ({harness.cut_method})"
    proxy.close()
    return node_url, proxy.target


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("postgresql+psycopg://u@db.example/batch", 5432),
        ("mysql+pymysql://u@db.example/batch", 3306),
        ("mariadb+pymysql://u@db.example/batch", 3306),
        ("oracle+oracledb://u@db.example/?service_name=FREEPDB1", 1521),
        ("mssql+pyodbc://u@db.example/batch?driver=ODBC+Driver+18+for+SQL+Server", 1433),
        ("db2+ibm_db://u@db.example/batch", 50000),
    ],
)
def test_a_url_without_a_port_is_proxied_to_the_default_port(
    url: str, port: int, tmp_path: Path
) -> None:
    if url.startswith("db2"):
        pytest.importorskip("ibm_db_sa")
    node_url, target = proxied(url, tmp_path)
    assert target == ("db.example", port)
    assert make_url(node_url).host == "127.0.0.1" and make_url(node_url).port


def test_a_port_in_the_url_wins(tmp_path: Path) -> None:
    _, target = proxied("oracle+oracledb://u@db.example:1600/?service_name=X", tmp_path)
    assert target == ("db.example", 1600)


def test_no_port_anywhere_is_one_clear_error(register_provider: Any, tmp_path: Path) -> None:
    psycopg = ("noportdb.psycopg", "sqlalchemy.dialects.postgresql.psycopg", "PGDialect_psycopg")
    register_provider("noportdb", f"{HERE}:NoPortProvider", psycopg)
    harness = Harness("noportdb+psycopg://u:s3cret@db.example/batch", tmp_path)
    with pytest.raises(ConfigurationError, match="declares no default_port") as caught:
        harness._node_url()
    assert "s3cret" not in str(caught.value)
