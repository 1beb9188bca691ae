"""A scratch database that is a file made by a driver call, not by ``CREATE DATABASE``
(issue 17, item 6): the provider's hooks make it, and the test backend works in it and drops it.
The provider is the worked example's (``tests/thirdparty/filedb``), imported in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect

from dbcluster import schema
from dbcluster.testing.backends import open_url

FILEDB = Path(__file__).resolve().parents[1] / "thirdparty" / "filedb"


@pytest.fixture
def filedb(register_provider: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FILEDB))
    dialect = ("filedb", "dbcluster_filedb", "FileDBDialect")
    register_provider("filedb", "dbcluster_filedb:FileDBProvider", dialect)


def test_the_suite_works_in_a_scratch_file_and_drops_it(filedb: None, tmp_path: Path) -> None:
    given = tmp_path / "given.db"
    backend = open_url(f"filedb:///{given}")
    try:
        scratch = Path(str(backend.engine.url.database))
        assert scratch.parent == tmp_path and scratch.name.startswith("dbc_"), scratch
        assert backend.provider.name == "filedb"
        assert {t.name for t in schema.ALL_TABLES} <= set(inspect(backend.engine).get_table_names())
    finally:
        backend.close()
    assert not scratch.exists(), "the scratch database was not dropped"
    assert not given.exists(), "the given database was touched"


def test_an_in_memory_database_is_its_own_scratch(filedb: None) -> None:
    backend = open_url("filedb://")
    try:
        assert backend.engine.url.database in (None, "")
    finally:
        backend.close()
