"""A third-party query provider: SQLite, reached as ``sqlitex:///path``.

A new database's provider subclasses :class:`dbcluster.dialects.QueryProvider` (or, as here, the
closest built-in one), overrides only what its database expresses differently, declares its
capabilities, and registers under its name in the ``dbcluster.dialects`` entry-point group.
This one is only a second URL scheme for SQLite; ``tests/thirdparty/filedb`` is the example to
copy for a database of its own (docs/PROVIDERS.md).
"""

from __future__ import annotations

from typing import ClassVar

from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from dbcluster.dialects.sqlite import SQLiteProvider


class SQLiteXDialect(SQLiteDialect_pysqlite):
    """The SQLAlchemy dialect behind ``sqlitex://`` (it compiles exactly as SQLite does)."""

    supports_statement_cache = True


class SQLiteXProvider(SQLiteProvider):
    name = "sqlitex"
    #: Served by URL scheme only (its dialect keeps the name ``sqlite``, which stays with the
    #: built-in provider); engines dbcluster makes for ``sqlitex://`` are bound to this one.
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ()
    example_url = "sqlitex://"
    # Capabilities (the conformance suite skips what a provider declares it cannot do).
    supports_multiple_processes = True
    network_backend = False
    can_create_database = False
    busy_timeout_s: ClassVar[float] = 20.0
