"""PostgreSQL. ``clock_timestamp()`` is the wall clock at the moment of the call; the usual
``CURRENT_TIMESTAMP`` is frozen at transaction start and would age every heartbeat."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

from sqlalchemy import Interval, literal
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from dbcluster.dialects.base import QueryProvider
from dbcluster.schema import nodes

#: SQLSTATEs worth repeating: serialization failure, deadlock, lock not available, admin/crash
#: shutdown, cannot connect now, too many connections.
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300"}


class PostgreSQLProvider(QueryProvider):
    name = "postgresql"
    sqlalchemy_names = ("postgresql",)
    example_url = "postgresql+psycopg://"
    drivers: ClassVar[dict[str, str]] = {"psycopg": "postgresql", "psycopg2": "postgresql"}

    def now(self) -> ColumnElement[Any]:
        return self._clock("timezone('UTC', clock_timestamp())")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        return column < self.now() - literal(timedelta(milliseconds=ms), Interval())

    def drop_database_sql(self, name: str) -> str:
        return f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"

    def coordination_engine_options(self) -> dict[str, Any]:
        return {"connect_args": {"options": "-c lock_timeout=5000"}}

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        values = self._node_values(host, capacity)
        stmt = pg_insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
        conn.execute(stmt.on_conflict_do_update(index_elements=[nodes.c.node_id], set_=values))

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if not sqlstate:
            return False
        return sqlstate in _TRANSIENT_SQLSTATES or sqlstate.startswith("08")
