"""SQLite: the embedded default, a file database that several local processes share.

Timestamps are stored as text, so "now" must produce exactly SQLAlchemy's storage format
(``YYYY-MM-DD HH:MM:SS.ffffff``) for string comparison to order correctly: ``strftime('%f')``
gives milliseconds, and three zeros pad it to microseconds.
"""

from __future__ import annotations

import sqlite3
from typing import Any, ClassVar

from sqlalchemy import Engine, Integer, String, event, func, literal
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider
from dbcluster.schema import nodes

_FORMAT = "%Y-%m-%d %H:%M:%f"


class SQLiteProvider(QueryProvider):
    name = "sqlite"
    sqlalchemy_names = ("sqlite",)
    example_url = "sqlite://"
    can_create_database = False
    drivers: ClassVar[dict[str, str]] = {}
    network_backend = False
    #: Its id columns are rowid aliases without ``AUTOINCREMENT``: a deleted newest row's id
    #: comes back.
    reuses_ids = True
    #: ``INSERT ... ON CONFLICT DO UPDATE``.
    min_server_version = (3, 24)

    #: Seconds a connection waits for another process's write lock before giving up.
    busy_timeout_s: ClassVar[float] = 30.0

    def alter_column_type_sql(
        self, table: str, column: str, old_type: str, new_type: str, nullable: bool
    ) -> list[str]:
        # SQLite has no ALTER COLUMN; its types are affinities, and every revision so far keeps
        # SQLite's rendered types, so none asks for this.
        raise NotImplementedError(f"SQLite cannot change {table}.{column} to {new_type}")

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        # Only "INTEGER PRIMARY KEY" is SQLite's auto-incrementing rowid alias.
        return Integer() if kind == "id" else None

    def now(self) -> ColumnElement[Any]:
        return self._clock(f"(strftime('{_FORMAT}', 'now') || '000')")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        modifier = f"-{ms / 1000:.3f} seconds"
        threshold = func.strftime(
            literal(_FORMAT), literal("now"), literal(modifier), type_=String()
        ).concat(literal("000"))
        return column < threshold

    def private_to_engine(self, engine: Engine) -> bool:
        return engine.url.database in (None, "", ":memory:")

    def engine_options(self) -> dict[str, Any]:
        return {"connect_args": {"timeout": self.busy_timeout_s, "check_same_thread": False}}

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        """WAL so readers do not block the writer. Coordination engines begin ``IMMEDIATE``:
        their transactions are short and some read before they write, and a deferred
        transaction that upgrades after another writer committed fails at once with
        SQLITE_BUSY instead of waiting for the busy timeout. Application engines begin
        deferred, so a step that works for a while before its first write does not hold the
        database's single write lock (and starve every heartbeat) while it works."""
        begin = "BEGIN IMMEDIATE" if coordination else "BEGIN"

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            if engine.url.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.close()

        if autocommit:
            return

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql(begin)

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        values = self._node_values(host, capacity)
        stmt = sqlite_insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
        conn.execute(stmt.on_conflict_do_update(index_elements=[nodes.c.node_id], set_=values))

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        # SQLITE_READONLY: "attempt to write a readonly database" (a read-only file or mount).
        return isinstance(orig, sqlite3.OperationalError) and "readonly" in str(orig).lower()

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        if isinstance(orig, sqlite3.OperationalError):
            message = str(orig).lower()
            return "locked" in message or "busy" in message
        return False
