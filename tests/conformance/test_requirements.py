"""Capabilities are judged by the provider, never by a database's name (issue 17, item 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from dbcluster.dialects import get_provider, make_engine
from dbcluster.dialects.sqlite import SQLiteProvider
from dbcluster.testing.requirements import missing

HERE = __name__


class MemDialect(SQLiteDialect_pysqlite):
    name = "memlite"
    supports_statement_cache = True


class MemProvider(SQLiteProvider):
    """A third party's SQLite-like database; in memory without a path (private_to_engine)."""

    name = "memlite"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("memlite",)
    example_url = "memlite://"


@pytest.fixture
def memlite(register_provider: Any) -> None:
    register_provider("memlite", f"{HERE}:MemProvider", ("memlite", HERE, "MemDialect"))


@pytest.mark.parametrize(
    ("url", "private"),
    [("memlite://", True), ("memlite:///{tmp}/x.db", False), ("sqlite://", True)],
)
def test_the_in_memory_skip_asks_the_provider(
    memlite: None, url: str, private: bool, tmp_path: Path
) -> None:
    engine = make_engine(url.format(tmp=tmp_path))
    try:
        reason = missing(get_provider(engine), engine, ("multiple_processes",))
    finally:
        engine.dispose()
    assert (reason is not None) == private, reason
    if private:
        assert "private_to_engine" in reason  # type: ignore[operator]


def test_ddl_help_lists_third_party_providers(memlite: None) -> None:
    from dbcluster.cli import cli

    result = CliRunner().invoke(cli, ["ddl", "--help"])
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())
    assert "postgresql" in help_text and "memlite" in help_text, result.output
