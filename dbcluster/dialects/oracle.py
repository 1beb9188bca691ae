"""Oracle. ``DATE`` keeps whole seconds, so timestamps are ``TIMESTAMP(6)``; the clock is
``SYS_EXTRACT_UTC(SYSTIMESTAMP)`` and intervals are built with ``NUMTODSINTERVAL``, which takes
fractional seconds.

Flags are ``SMALLINT`` on every version: 19c and 21c have no ``BOOLEAN`` column type
(ORA-00902), and one schema for every version keeps ``init`` on any server, the checked-in
script and a database upgraded to 23ai in agreement. ``VARCHAR2(n CHAR)`` still holds at most
4,000 bytes (with the default ``MAX_STRING_SIZE = STANDARD``), which clipped text respects.
``VARCHAR2`` compares byte for byte under the default ``NLS_COMP = BINARY``.

Oracle bounds no lock wait per session and ends no idle transaction, so every round trip of a
dbcluster session has python-oracledb's ``call_timeout`` (:meth:`OracleProvider.call_timeout_ms`):
an UPDATE queued behind a frozen holder's row lock, a plain ``FOR UPDATE`` read, a statement on a
connection whose server went silent all end with DPY-4024, a transient error, and the session,
whose state the interrupted call leaves unknown, is thrown away rather than pooled again.

DDL commits statement by statement here, so a migration's step checks the data dictionary before
it runs (:meth:`OracleProvider.unless_present`, :meth:`OracleProvider.alter_column_type_sql`): a
``dbcluster migrate`` or a DBA's script cut short at any step runs again cleanly.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from sqlalchemy import (
    SMALLINT,
    Delete,
    Engine,
    Numeric,
    String,
    Update,
    bindparam,
    event,
    func,
    literal,
    select,
)
from sqlalchemy.dialects import oracle
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider, SessionLimits

#: Lock wait bound when the engine was made without :class:`SessionLimits`.
_DEFAULT_WAIT_S = 5

#: ORA- codes worth repeating: deadlock (60), serialization failure (8177), resource busy with
#: NOWAIT or after a WAIT timeout (54, 30006); a lost session: killed (28), not logged on (1012),
#: idle time exceeded (2396), end-of-file or not connected on the channel (3113, 3114, 3135),
#: failover in progress (25408); an instance starting or stopping (1033, 1089); and a listener
#: that cannot hand the connection to the service during a restart or failover (12514, 12516,
#: 12520, 12528, 12537, 12541, 12170).
_TRANSIENT_ORA = {60, 8177, 54, 30006, 28, 1012, 2396, 3113, 3114, 3135, 25408, 1033, 1089}
_TRANSIENT_ORA |= {12514, 12516, 12520, 12528, 12537, 12541, 12170}
#: python-oracledb's own codes for a lost or refused connection: not connected (DPY-1001), the
#: database or network closed the connection (DPY-4011), cannot connect (DPY-6005); and a round
#: trip that outlasted the connection's call_timeout (DPY-4024; thick mode's DPI-1067 with
#: ORA-03156 is reported as DPY-4024 too).
_TRANSIENT_DPY = ("DPY-1001", "DPY-4011", "DPY-6005", "DPY-4024")
_CALL_TIMEOUT = "DPY-4024"
#: ORA-03156: OCI call timed out (thick mode, before the driver maps it).
_CALL_TIMEOUT_ORA = 3156
#: ORA-16000: the database (or pluggable database) is open for read-only access: a standby, as
#: the old primary is after a Data Guard switchover.
_READ_ONLY_ORA = {16000}
#: The margin by which a round trip's bound exceeds the longest lock wait a statement asks for
#: itself (:meth:`OracleProvider.bounded`'s ``WAIT n``), so that wait ends first and cleanly.
_CALL_MARGIN_MS = 1000
#: The thin driver reports a listener refusal as DPY-6000 "... (Similar to ORA-12516)".
_ORA_CODE = re.compile(r"ORA-(\d{5})")


class OracleProvider(QueryProvider):
    name = "oracle"
    sqlalchemy_names = ("oracle",)
    example_url = "oracle+oracledb://"
    default_port = 1521
    can_create_database = False
    drivers: ClassVar[dict[str, str]] = {"oracledb": "oracle", "cx_oracle": "oracle-cx"}
    supports_skip_locked = True
    min_server_version = (19,)
    text_max_bytes = 4000
    #: Each DDL statement commits on its own.
    transactional_ddl = False

    def add_column_sql(self, table: str, column_spec: str) -> list[str]:
        return [f"ALTER TABLE {self.quote(table)} ADD ({column_spec})"]

    def alter_column_type_sql(
        self, table: str, column: str, old_type: str, new_type: str, nullable: bool
    ) -> list[str]:
        quoted_table, quoted = self.quote(table), self.quote(column)
        if old_type.split("(")[0] != "BOOLEAN":
            return [f"ALTER TABLE {quoted_table} MODIFY ({quoted} {new_type})"]
        # A column that holds data keeps its type family (ORA-01439): 0.1.0's BOOLEAN flags (23ai
        # only) become numbers through a copy, in five steps. Each runs only while the data
        # dictionary says it is still to do, so a run cut short between two of them (each DDL
        # commits on its own) completes when run again; on 19c and 21c, where 0.1.0 made the
        # flag a number already, none runs.
        copy = f"{column}_new"
        quoted_copy = self.quote(copy)
        is_boolean = _column_is(table, column, "data_type = 'BOOLEAN'")
        has_copy, has_column = _column_is(table, copy), _column_is(table, column)
        steps = [
            (
                f"{is_boolean} AND NOT {has_copy}",
                f"ALTER TABLE {quoted_table} ADD ({quoted_copy} {new_type})",
            ),
            (
                f"{is_boolean} AND {has_copy}",
                f"UPDATE {quoted_table} SET {quoted_copy} = CASE WHEN {quoted} THEN 1 ELSE 0 END",
            ),
            (f"{is_boolean} AND {has_copy}", f"ALTER TABLE {quoted_table} DROP COLUMN {quoted}"),
            (
                f"{has_copy} AND NOT {has_column}",
                f"ALTER TABLE {quoted_table} RENAME COLUMN {quoted_copy} TO {quoted}",
            ),
        ]
        if not nullable:
            steps.append(
                (
                    _column_is(table, column, "nullable = 'Y'"),
                    f"ALTER TABLE {quoted_table} MODIFY ({quoted} NOT NULL)",
                )
            )
        return [_when(condition, statement) for condition, statement in steps]

    def unless_present(
        self, kind: str, table: str, name: str | None, statements: list[str]
    ) -> list[str]:
        """Each statement as a PL/SQL block that runs it only while the data dictionary has no
        such table, index or column: the same text re-runs cleanly, in ``dbcluster migrate``
        and in a DBA's script."""
        if kind == "table":
            absent = f"NOT EXISTS (SELECT 1 FROM user_tables WHERE table_name = {_upper(table)})"
        elif kind == "index":
            absent = (
                f"NOT EXISTS (SELECT 1 FROM user_indexes WHERE index_name = {_upper(str(name))})"
            )
        elif kind == "column":
            absent = f"NOT {_column_is(table, str(name))}"
        else:
            raise ValueError(f"no check for a {kind}")
        return [_when(absent, statement) for statement in statements]

    def script_line(self, sql: str) -> str:
        # SQL*Plus and SQLcl end a PL/SQL block with "/" on a line of its own.
        return f"{sql}\n/" if sql.startswith(("BEGIN", "DECLARE")) else f"{sql};"

    #: SQL*Plus commits on exit by default; SQLcl and SQL Developer do not.
    scripts_commit = True

    @classmethod
    def offline_dialect(
        cls, dialect_class: type[Dialect], server_version: tuple[int, ...] | None = None
    ) -> Dialect:
        dialect = super().offline_dialect(dialect_class, server_version)
        # What a live connection's initialize() derives from the server version (the offline
        # dialect otherwise assumes 23ai).
        dialect.supports_native_boolean = dialect.server_version_info >= (23,)
        return dialect

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "timestamp":
            return oracle.TIMESTAMP()
        if kind == "long_text":
            return oracle.CLOB()
        if kind == "id":
            return oracle.NUMBER(19)
        if kind == "flag":
            return SMALLINT()
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("SYS_EXTRACT_UTC(SYSTIMESTAMP)")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        seconds = bindparam(None, ms / 1000, type_=Numeric(18, 3), unique=True)
        unit = bindparam(None, "SECOND", type_=String(), unique=True)
        return column < self.now() - func.numtodsinterval(seconds, unit)

    def call_timeout_ms(self, limits: SessionLimits) -> int:
        """python-oracledb's ``call_timeout`` for a session with these limits: the longest any
        round trip may take. Oracle ends no transaction that idles while holding locks, so this
        is the bound a waiter puts on a frozen holder instead: the idle-in-transaction bound
        the other databases enforce on the holder (at least the statement's own lock wait,
        which :meth:`bounded` asks for in whole seconds), plus a margin so that wait ends
        first."""
        wait_ms = _wait_seconds(limits.lock_timeout_ms) * 1000
        return max(wait_ms, limits.idle_in_transaction_ms or 0) + _CALL_MARGIN_MS

    def configure_session(self, dbapi_connection: Any, limits: SessionLimits) -> None:
        """Every round trip of the session is bounded (see :meth:`call_timeout_ms`)."""
        dbapi_connection.call_timeout = self.call_timeout_ms(limits)

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        super().configure_engine(engine, coordination=coordination, autocommit=autocommit)

        @event.listens_for(engine, "handle_error")
        def _discard_timed_out_session(context: Any) -> None:
            # The interrupted call leaves the session's state unknown (the driver may or may
            # not have reset it): it is not pooled again. The other pooled sessions are fine.
            if _timed_out(context.original_exception):
                context.is_disconnect = True
                context.invalidate_pool_on_disconnect = False

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        error = orig.args[0] if orig is not None and orig.args else None
        code = getattr(error, "code", None)
        if isinstance(code, int) and code:
            return code in _READ_ONLY_ORA
        quoted = _ORA_CODE.search(str(error or ""))
        return quoted is not None and int(quoted.group(1)) in _READ_ONLY_ORA

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        # python-oracledb raises DatabaseError(_Error): the _Error has the ORA- number as
        # ``code`` (0 for the driver's own DPY- errors) and the prefix of its message as
        # ``full_code``; it maps a lost session (ORA-00028, 01012, 02396, ...) to DPY-4011.
        error = orig.args[0] if orig is not None and orig.args else None
        code = getattr(error, "code", None)
        if isinstance(code, int) and code in _TRANSIENT_ORA:
            return True
        if getattr(error, "isrecoverable", False) is True:
            return True
        full_code = str(getattr(error, "full_code", "") or "")
        if full_code.startswith(_TRANSIENT_DPY):
            return True
        if code:
            return False
        quoted = _ORA_CODE.search(str(error or ""))
        return quoted is not None and int(quoted.group(1)) in _TRANSIENT_ORA

    def bounded(self, stmt: Update | Delete) -> list[Any]:
        """Oracle bounds no DML lock wait per session: lock the statement's rows first with
        ``SELECT ... FOR UPDATE WAIT n`` (ORA-30006 when it expires, a transient error), then
        run it. Oracle has no idle-in-transaction timeout either: a DBA bounds frozen sessions
        with a Resource Manager plan (``MAX_IDLE_BLOCKER_TIME``)."""
        limits: SessionLimits | None = self.limits
        wait = _DEFAULT_WAIT_S if limits is None else _wait_seconds(limits.lock_timeout_ms)
        # SQLAlchemy's with_for_update() has no WAIT n: the clause is this provider's suffix (an
        # integer from the settings, never user text).
        lock = (
            select(literal(1))
            .select_from(stmt.table)
            .where(stmt.whereclause)  # type: ignore[arg-type]
            .suffix_with(f"FOR UPDATE WAIT {int(wait)}", dialect="oracle")
        )
        return [lock, stmt]


def _wait_seconds(ms: int) -> int:
    """A lock wait in whole seconds (``FOR UPDATE WAIT n``), rounded up, at least one."""
    return max(1, -(-int(ms) // 1000))


def _timed_out(error: BaseException | None) -> bool:
    """Whether a driver error is a round trip cut by the connection's ``call_timeout``."""
    inner = getattr(error, "args", None)
    detail = inner[0] if inner else None
    full_code = str(getattr(detail, "full_code", "") or "")
    return full_code.startswith(_CALL_TIMEOUT) or getattr(detail, "code", None) == (
        _CALL_TIMEOUT_ORA
    )


def _upper(name: str) -> str:
    """An unquoted identifier as the data dictionary stores it, as a SQL string literal."""
    return "'" + name.upper().replace("'", "''") + "'"


def _column_is(table: str, column: str, condition: str | None = None) -> str:
    """A SQL condition: ``table`` has ``column`` (satisfying ``condition`` on its row of
    ``user_tab_columns``)."""
    where = f"table_name = {_upper(table)} AND column_name = {_upper(column)}"
    if condition:
        where += f" AND {condition}"
    return f"EXISTS (SELECT 1 FROM user_tab_columns WHERE {where})"


def _when(condition: str, statement: str) -> str:
    """``statement`` as a PL/SQL block that runs it once if ``condition`` holds, else not at
    all (dynamic SQL: the block compiles whatever the columns it names)."""
    text = statement.replace("'", "''")
    return (
        f"BEGIN\n  FOR pending IN (SELECT 1 FROM dual WHERE {condition}) LOOP\n"
        f"    EXECUTE IMMEDIATE '{text}';\n  END LOOP;\nEND;"
    )
