"""MySQL and MariaDB. Both speak the same protocol and SQL for everything dbcluster needs; the
MariaDB provider differs only in the names it answers to.

``DATETIME`` without a precision keeps whole seconds, so timestamps are ``DATETIME(6)`` and the
clock is ``UTC_TIMESTAMP(6)``. Transactions run at READ COMMITTED: fewer gap locks, fewer of the
deadlocks other database-backed queues keep reporting on InnoDB.

Text columns are ``utf8mb4`` in the binary collation ``utf8mb4_bin``: the servers' defaults
(MySQL 8: ``utf8mb4_0900_ai_ci``, MariaDB: ``utf8mb4_general_ci``) would make 'Job' and 'job',
and on MySQL 8 'é' and 'e', one key.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import BigInteger, Engine, bindparam, event, func, literal_column
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider, SessionLimits, StatementPair
from dbcluster.dialects.pairs import PyformatPair
from dbcluster.schema import nodes

#: The server-status bit of an open transaction (the protocol's SERVER_STATUS_IN_TRANS).
_SERVER_STATUS_IN_TRANS = 0x0001
#: A Galera node that is not part of the cluster's primary component for now (joining,
#: resyncing, cut off from the majority, or one that rejoins after a restart) refuses every
#: statement with 1047 "WSREP has not yet prepared node for application use" (MySQL's
#: ER_UNKNOWN_COM_ERROR, which a client sending SQL never meets otherwise), and a write in
#: flight there fails with 1180 (ER_ERROR_DURING_COMMIT: "Error while appending streaming
#: replication fragment ... Not connected to Primary Component"): both pass once the node is
#: Synced again, and the session that met them is of no use until then.
_WSREP_NOT_READY_ERRNOS = {1047, 1180}
#: Deadlock (1213: also Galera's certification failure, which fails the losing transaction at
#: COMMIT), lock wait timeout (1205; MariaDB's answer to NOWAIT too), a row NOWAIT could not lock
#: at once (3572, MySQL 8), server shutdown (1053), the server closed an idle or
#: killed connection (4031; MariaDB's 1927), a Group Replication conflict rolled the commit back
#: (3101), a Galera node out of its primary component (above), and the client's lost or refused
#: connection: 2002 (local socket), 2003 (TCP), 2006 (server gone away), 2013 and 2055 (lost
#: during a query).
_TRANSIENT_ERRNOS = {
    1213,
    1205,
    3572,
    1053,
    4031,
    1927,
    3101,
    *_WSREP_NOT_READY_ERRNOS,
    2002,
    2003,
    2006,
    2013,
    2055,
}
#: ``wsrep_sync_wait`` of every session on a Galera node: reads (1) and UPDATE/DELETE (2) first
#: wait until the node has applied every write-set the cluster certified before them, so a
#: read or a guarded UPDATE that a fencing decision rests on sees the latest commit made on any
#: node (a row count judged on a lagging node would call a live partition lost, or a lost one
#: live). INSERTs (4) decide nothing that certification does not already refuse.
GALERA_SYNC_WAIT = 3
#: The protocol's CLIENT_MULTI_STATEMENTS capability (PyMySQL's ``client_flag``).
_MULTI_STATEMENTS = 1 << 16
#: The drivers whose autocommit connections are opened with it (a statement pair then costs one
#: round trip: see :meth:`MySQLProvider.read_then_write`).
_PAIRING_DRIVERS = ("pymysql",)


def _errno(orig: BaseException | None) -> int | None:
    """The server's error number: PyMySQL and mysqlclient give args = (errno, message);
    MariaDB Connector/Python gives args = (message,) with the number as ``errno``."""
    errno = getattr(orig, "errno", None)
    if not isinstance(errno, int):
        args = getattr(orig, "args", ())
        errno = args[0] if args and isinstance(args[0], int) else None
    return errno


class MySQLProvider(QueryProvider):
    name = "mysql"
    sqlalchemy_names = ("mysql",)
    example_url = "mysql+pymysql://"
    default_port = 3306
    drivers: ClassVar[dict[str, str]] = {
        "pymysql": "mysql",
        "mysqldb": "mysql-mysqlclient",
        "mariadbconnector": "mariadb-connector",
    }
    system_libraries: ClassVar[dict[str, str]] = {
        "libmysqlclient": "the MySQL client library (Debian/Ubuntu: libmysqlclient21)",
        "libmariadb": "MariaDB Connector/C (Debian/Ubuntu: libmariadb3)",
    }
    #: MySQL 8.0 and MariaDB 10.6 (the oldest supported) both have SKIP LOCKED.
    supports_skip_locked = True
    supports_multi_table_update = True
    min_server_version = (8, 0)
    text_collation = "utf8mb4_bin"
    #: Each DDL statement commits on its own.
    transactional_ddl = False
    #: Through PyMySQL, on the autocommit engine (see :meth:`read_then_write`).
    supports_statement_pairs = True

    def alter_column_type_sql(
        self, table: str, column: str, old_type: str, new_type: str, nullable: bool
    ) -> list[str]:
        # MODIFY restates the whole column: its nullability too (these columns have no default).
        null = "NULL" if nullable else "NOT NULL"
        return [f"ALTER TABLE {self.quote(table)} MODIFY {self.quote(column)} {new_type} {null}"]

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

    def session_engine_options(self, limits: SessionLimits) -> dict[str, Any]:
        """The lock wait bound (whole seconds, at least one) and the idle bound, in the session's
        ``init_command``. MySQL has no idle-in-transaction timeout: the closest is
        ``wait_timeout``, which ends any session idle that long, in a transaction or not; the
        pool then recycles connections at half that age so it never hands out one the server
        ended for idleness."""
        settings = [f"innodb_lock_wait_timeout = {_seconds(limits.lock_timeout_ms)}"]
        options: dict[str, Any] = {}
        if limits.idle_in_transaction_ms is not None:
            idle = _seconds(limits.idle_in_transaction_ms)
            settings.append(self._idle_setting(idle))
            options.update(self._idle_engine_options(idle))
        init = "SET SESSION " + ", ".join(settings)
        return {**options, "connect_args": {"init_command": init}}

    def _idle_setting(self, seconds: int) -> str:
        return f"wait_timeout = {seconds}"

    def _idle_engine_options(self, seconds: int) -> dict[str, Any]:
        return {"pool_recycle": max(1, seconds // 2)}

    #: Whether the server is a Galera node (``wsrep_on``), read on the engine's first
    #: connection; None until then.
    galera: bool | None = None

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        """Every session on a Galera node is causal (:meth:`_causal_on_galera`) and one that met
        a node out of its primary component is dropped; an autocommit engine's PyMySQL
        connections are opened with the multi-statement capability (its statements are
        dbcluster's own, with bound parameters), so a read and a write can share a request
        (:meth:`read_then_write`)."""
        super().configure_engine(engine, coordination=coordination, autocommit=autocommit)
        event.listen(engine, "connect", self._causal_on_galera)

        @event.listens_for(engine, "handle_error")
        def _drop_unready_session(context: Any) -> None:
            # A session on a Galera node out of its primary component is of no use until the
            # node is Synced again (and its rollback on the way back to the pool fails too):
            # it is dropped. The pool's other sessions are judged when they are used.
            if _errno(context.original_exception) in _WSREP_NOT_READY_ERRNOS:
                context.is_disconnect = True
                context.invalidate_pool_on_disconnect = False

        if not autocommit or engine.dialect.driver not in _PAIRING_DRIVERS:
            return

        @event.listens_for(engine, "do_connect")
        def _multi_statements(dialect: Any, record: Any, cargs: Any, cparams: Any) -> None:
            cparams["client_flag"] = int(cparams.get("client_flag", 0)) | _MULTI_STATEMENTS

    def read_then_write(self, read: Any, write: Any, dialect: Dialect) -> StatementPair | None:
        """The two joined into one ``COM_QUERY`` (:mod:`dbcluster.dialects.pairs`), through
        PyMySQL on an autocommit engine (whose connections :meth:`configure_engine` opened with
        the multi-statement capability)."""
        if dialect.driver not in _PAIRING_DRIVERS:
            return None
        return PyformatPair.build(read, write, dialect)

    def _causal_on_galera(self, dbapi_connection: Any, _record: Any) -> None:
        """On a Galera node, every session's reads and guarded UPDATEs are causal (see
        :data:`GALERA_SYNC_WAIT`); elsewhere nothing (one ``SHOW VARIABLES`` on the engine's
        first connection tells)."""
        cursor = dbapi_connection.cursor()
        try:
            if self.galera is None:
                cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
                row = cursor.fetchone()
                self.galera = row is not None and str(row[1]).upper() == "ON"
            if self.galera:
                cursor.execute(f"SET SESSION wsrep_sync_wait = {GALERA_SYNC_WAIT}")
        finally:
            cursor.close()

    def in_transaction(self, dbapi_connection: Any) -> bool | None:
        """From the status flags of the server's last reply (PyMySQL keeps them): PyMySQL sends
        a ROLLBACK whenever asked, even with no transaction open."""
        status = getattr(dbapi_connection, "server_status", None)
        if not isinstance(status, int):
            return None
        return bool(status & _SERVER_STATUS_IN_TRANS)

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        values = self._node_values(host, capacity)
        stmt = mysql_insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
        conn.execute(stmt.on_duplicate_key_update(**values))

    def connect_error_hint(self, error: BaseException) -> str | None:
        # PyMySQL raises a bare RuntimeError when the server's authentication plugin needs a
        # package it lacks: caching_sha2_password (MySQL 8's default) or MariaDB's ed25519.
        message = str(error) if isinstance(error, RuntimeError) else ""
        if "'cryptography' package is required" in message:
            return (
                "the server authenticates with caching_sha2_password (MySQL 8's default), "
                "for which PyMySQL needs the 'cryptography' package: "
                f"pip install 'dbcluster[{self.name}]'"
            )
        if "'pynacl' package is required" in message:
            return (
                "the server authenticates with ed25519, for which PyMySQL needs the 'pynacl' "
                "package: pip install pynacl"
            )
        return None

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        # 1290: the server runs with --read-only (or super_read_only); 1792: a write in a
        # READ ONLY transaction.
        return _errno(orig) in (1290, 1792)

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        return _errno(orig) in _TRANSIENT_ERRNOS


class MariaDBProvider(MySQLProvider):
    name = "mariadb"
    sqlalchemy_names = ("mariadb",)
    example_url = "mariadb+pymysql://"
    drivers: ClassVar[dict[str, str]] = {
        "pymysql": "mariadb",
        "mysqldb": "mysql-mysqlclient",
        "mariadbconnector": "mariadb-connector",
    }
    min_server_version = (10, 6)

    def _idle_setting(self, seconds: int) -> str:
        # MariaDB ends only sessions idle *inside* a transaction (10.3 and later).
        return f"idle_transaction_timeout = {seconds}"

    def _idle_engine_options(self, seconds: int) -> dict[str, Any]:
        return {}


def _seconds(ms: int) -> int:
    """Whole seconds for a MySQL/MariaDB timeout variable, rounded up, at least one."""
    return max(1, -(-int(ms) // 1000))
