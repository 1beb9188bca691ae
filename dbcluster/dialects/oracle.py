"""Oracle. ``DATE`` keeps whole seconds, so timestamps are ``TIMESTAMP(6)``; the clock is
``SYS_EXTRACT_UTC(SYSTIMESTAMP)`` and intervals are built with ``NUMTODSINTERVAL``, which takes
fractional seconds.

Flags are ``SMALLINT`` on every version: 19c and 21c have no ``BOOLEAN`` column type
(ORA-00902), and one schema for every version keeps ``init`` on any server, the checked-in
script and a database upgraded to 23ai in agreement. ``VARCHAR2(n CHAR)`` still holds at most
4,000 bytes (with the default ``MAX_STRING_SIZE = STANDARD``), which clipped text respects.
``VARCHAR2`` compares byte for byte under the default ``NLS_COMP = BINARY``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from sqlalchemy import SMALLINT, Delete, Numeric, String, Update, bindparam, func, literal, select
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
#: database or network closed the connection (DPY-4011), cannot connect (DPY-6005).
_TRANSIENT_DPY = ("DPY-1001", "DPY-4011", "DPY-6005")
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
        # only) become numbers through a copy.
        copy = self.quote(f"{column}_new")
        return [
            f"ALTER TABLE {quoted_table} ADD ({copy} {new_type})",
            f"UPDATE {quoted_table} SET {copy} = CASE WHEN {quoted} THEN 1 ELSE 0 END",
            f"ALTER TABLE {quoted_table} DROP COLUMN {quoted}",
            f"ALTER TABLE {quoted_table} RENAME COLUMN {copy} TO {quoted}",
            *([] if nullable else [f"ALTER TABLE {quoted_table} MODIFY ({quoted} NOT NULL)"]),
        ]

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
        wait = _DEFAULT_WAIT_S if limits is None else max(1, -(-limits.lock_timeout_ms // 1000))
        # SQLAlchemy's with_for_update() has no WAIT n: the clause is this provider's suffix (an
        # integer from the settings, never user text).
        lock = (
            select(literal(1))
            .select_from(stmt.table)
            .where(stmt.whereclause)  # type: ignore[arg-type]
            .suffix_with(f"FOR UPDATE WAIT {int(wait)}", dialect="oracle")
        )
        return [lock, stmt]
