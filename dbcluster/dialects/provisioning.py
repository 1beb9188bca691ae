"""Scratch databases: the test backends and the conformance suite make a database of their own
for a run and drop it at the end (where ``can_create_database``), as SQLAlchemy's
``testing/provision.py`` does.

Override ``create_database_sql`` / ``drop_database_sql`` where the server creates databases with
other SQL, or the pair ``create_scratch_database`` / ``drop_scratch_database`` where a database is
not made by ``CREATE DATABASE`` at all (a file made by a driver call).
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from dbcluster.dialects.family import StatementFamily


class ScratchDatabases(StatementFamily):
    """Making and dropping a scratch database."""

    def create_database_sql(self, name: str) -> str:
        """DDL for a scratch database; ``name`` is generated, never user input."""
        return f"CREATE DATABASE {name}"

    def drop_database_sql(self, name: str) -> str:
        return f"DROP DATABASE {name}"

    def create_scratch_database(self, admin: Engine, name: str) -> URL:
        """Create an empty database called ``name`` where ``admin`` (an AUTOCOMMIT engine on the
        URL the user gave) points, and return its URL; the test backends and the conformance
        suite work in it and drop it at the end (only when :attr:`can_create_database`).

        The default runs :meth:`create_database_sql` on the server. A database that is a file
        made by a driver call, not by ``CREATE DATABASE``, overrides this pair of hooks."""
        from sqlalchemy import text

        with admin.connect() as conn:
            conn.execute(text(self.create_database_sql(name)))
        return admin.url.set(database=name)

    def drop_scratch_database(self, admin: Engine, url: URL) -> None:
        """Drop a database :meth:`create_scratch_database` made (its URL)."""
        from sqlalchemy import text

        with admin.connect() as conn:
            conn.execute(text(self.drop_database_sql(str(url.database))))
