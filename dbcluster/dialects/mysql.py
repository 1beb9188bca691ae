"""MySQL and MariaDB. Both speak the same protocol and SQL for everything dbcluster needs; the
MariaDB provider differs only in the names it answers to.

``DATETIME`` without a precision keeps whole seconds, so timestamps are ``DATETIME(6)`` and the
clock is ``UTC_TIMESTAMP(6)``. Transactions run at READ COMMITTED: fewer gap locks, fewer of the
deadlocks other database-backed queues keep reporting on InnoDB.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import BigInteger, bindparam, func, literal_column
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider
from dbcluster.schema import nodes

#: Deadlock, lock wait timeout, server gone away, lost connection, cannot connect, shutdown,
#: client disconnected by the server.
_TRANSIENT_ERRNOS = {1213, 1205, 2006, 2013, 2003, 1053, 4031}


class MySQLProvider(QueryProvider):
    name = "mysql"
    sqlalchemy_names = ("mysql",)
    example_url = "mysql+pymysql://"
    drivers: ClassVar[dict[str, str]] = {"pymysql": "mysql", "mysqldb": "mysql"}

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "timestamp":
            return mysql.DATETIME(fsp=6)
        if kind == "long_text":
            return mysql.LONGTEXT()
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("UTC_TIMESTAMP(6)")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        shift = bindparam(None, -ms * 1000, type_=BigInteger(), unique=True)
        return column < func.timestampadd(literal_column("MICROSECOND"), shift, self.now())

    def engine_options(self) -> dict[str, Any]:
        return {**super().engine_options(), "isolation_level": "READ COMMITTED"}

    def coordination_engine_options(self) -> dict[str, Any]:
        return {"connect_args": {"init_command": "SET SESSION innodb_lock_wait_timeout = 5"}}

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        values = self._node_values(host, capacity)
        stmt = mysql_insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
        conn.execute(stmt.on_duplicate_key_update(**values))

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        args = getattr(orig, "args", ())
        return bool(args) and isinstance(args[0], int) and args[0] in _TRANSIENT_ERRNOS


class MariaDBProvider(MySQLProvider):
    name = "mariadb"
    sqlalchemy_names = ("mariadb",)
    example_url = "mariadb+pymysql://"
    drivers: ClassVar[dict[str, str]] = {"pymysql": "mariadb", "mariadbconnector": "mariadb"}
