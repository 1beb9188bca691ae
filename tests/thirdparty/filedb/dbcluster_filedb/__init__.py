"""A third-party dbcluster provider, worked end to end: FileDB, a database kept in one file.

FileDB is SQLite under a name of its own, so that this example runs anywhere, but it is
written as a provider for a database dbcluster does not know would be (docs/PROVIDERS.md):

1. SQLAlchemy must reach the database: :class:`FileDBDialect` is SQLAlchemy's dialect under the
   name ``filedb`` (registered in the ``sqlalchemy.dialects`` entry-point group), so URLs look
   like ``filedb:///path/to/jobs.db``, with no host and no port.
2. :class:`FileDBProvider` subclasses the closest provider (for a database unlike any built-in
   one, :class:`dbcluster.dialects.QueryProvider`), lists its dialect's name in
   ``sqlalchemy_names``, declares its capabilities, and overrides only what FileDB does
   differently: a column type, how its driver is installed, and how a scratch database is made.
3. It registers in the ``dbcluster.dialects`` entry-point group under its ``name``, and proves
   itself with ``pytest -p dbcluster.testing.plugin --pyargs dbcluster.testing.suite
   --dbcluster-url filedb:///path/x.db``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import CLOB, Engine
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import URL
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.sqlite import SQLiteProvider


class FileDBDialect(SQLiteDialect_pysqlite):
    """SQLAlchemy's dialect for ``filedb://`` URLs (it compiles as SQLite does)."""

    name = "filedb"
    supports_statement_cache = True


class FileDBProvider(SQLiteProvider):
    """The query provider for FileDB: SQLite's statements, FileDB's types and files."""

    name = "filedb"
    #: ``engine.dialect.name`` of the dialects this provider serves: a dialect met anywhere
    #: (not only one built from a URL) finds this provider by it.
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("filedb",)
    example_url = "filedb://"

    # Capabilities, declared once (the suite skips what a provider says it cannot do).
    supports_multiple_processes = True  # several local processes share one file
    network_backend = False  # no TCP: the harness cuts a node's connection in-process
    can_create_database = True  # a scratch database is a new file (see the hooks below)
    default_port = None  # nothing to proxy; a server database declares its port here

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        # FileDB keeps long text out of the row as CLOB (SQLite reads the name as text).
        if kind == "long_text":
            return CLOB()
        return super().column_type(kind)

    @classmethod
    def driver_install_hint(cls, driver: str | None) -> str:
        # dbcluster has no extra for a database it does not ship: name your own package.
        if driver in (None, "pysqlite"):
            return "FileDB's driver is Python's sqlite3 module: use a Python built with it"
        return (
            f"FileDB has no {driver!r} driver; use filedb:///path/to/file.db "
            "(pip install dbcluster-filedb)"
        )

    def create_scratch_database(self, admin: Engine, name: str) -> URL:
        """FileDB has no ``CREATE DATABASE``: the driver makes a database by opening a new file,
        here beside the one the user named. An in-memory database is its own scratch."""
        if self.private_to_engine(admin):
            return admin.url
        path = Path(str(admin.url.database)).with_name(f"{name}.db")
        admin.dialect.loaded_dbapi.connect(str(path)).close()
        return admin.url.set(database=str(path))

    def drop_scratch_database(self, admin: Engine, url: URL) -> None:
        if self.private_to_engine(admin):
            return
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{url.database}{suffix}").unlink(missing_ok=True)
