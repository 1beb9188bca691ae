"""Db2 (LUW). The clock is ``CURRENT TIMESTAMP - CURRENT TIMEZONE`` (two words each, and a
TIMESTAMP(6) by default); staleness shifts it with ``ADD_SECONDS``, which takes fractional
seconds. SQLAlchemy names this dialect ``ibm_db_sa``.

In a Unicode database (the default) ``VARCHAR(n)`` counts bytes, so clipped text is measured in
UTF-8 bytes; text compares byte for byte under the default ``IDENTITY`` collation. Serialized
contexts are ``CLOB(1G)``: a bare ``CLOB`` holds 1 MB, and 1 GB is the largest LOB Db2 logs (a
longer one must be ``NOT LOGGED``, which crash recovery could not restore).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from sqlalchemy import CLOB, Numeric, bindparam, cast, func
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider, SessionLimits

#: Deadlock or lock timeout rollback (-911, reason 2 or 68), statement-level deadlock or timeout
#: (-913), transaction rolled back by a system error such as an HADR takeover (-1229, SQLSTATE
#: 40504), communication error (-30081, e.g. the connection refused), client reroute (-30108),
#: connection lost or agent not started (-1224, -30080).
_TRANSIENT_SQLCODES = {-911, -913, -1229, -30081, -30108, -1224, -30080}
_TRANSIENT_SQLSTATES = {"40001", "40504", "08001"}
#: ibm_db puts both in its message: "... SQLSTATE=40001 SQLCODE=-911"; the CLI prefix "SQL0911N"
#: carries the code too.
_SQLCODE = re.compile(r"SQLCODE=(-?\d+)|SQL(\d{4,5})N")
_SQLSTATE = re.compile(r"SQLSTATE=(\w{5})")
#: Serialized execution contexts: the largest LOB Db2 logs.
_CLOB_BYTES = 1024**3


class _SizedClob(CLOB):
    """A CLOB that keeps its length in the DDL (ibm_db_sa renders a bare ``CLOB``: 1 MB)."""

    cache_ok = True


@compiles(_SizedClob, "ibm_db_sa")
def _render_sized_clob(type_: _SizedClob, compiler: Any, **kw: Any) -> str:
    return f"CLOB({type_.length})"


class Db2Provider(QueryProvider):
    name = "db2"
    sqlalchemy_names = ("ibm_db_sa", "db2")
    example_url = "db2+ibm_db://"
    default_port = 50000
    can_create_database = False
    drivers: ClassVar[dict[str, str]] = {"ibm_db": "db2", "ibm_db_dbi": "db2"}
    min_server_version = (11, 5)

    def alter_column_type_sql(
        self, table: str, column: str, old_type: str, new_type: str, nullable: bool
    ) -> list[str]:
        # Some type changes leave the table REORG-pending (no access until reorganized).
        return [
            *super().alter_column_type_sql(table, column, old_type, new_type, nullable),
            f"CALL SYSPROC.ADMIN_CMD('REORG TABLE {table}')",
        ]

    text_length_unit = "byte"
    #: ibm_db_sa has no AUTOCOMMIT isolation level: single statements run in short transactions.
    supports_autocommit = False

    @classmethod
    def offline_dialect(
        cls, dialect_class: type[Dialect], server_version: tuple[int, ...] | None = None
    ) -> Dialect:
        # ibm_db_sa decides some DDL from the server it is connected to; compile for Db2 LUW.
        dialect = super().offline_dialect(dialect_class, server_version)
        dialect.dbms_name = "DB2/LINUXX8664"
        dialect.dbms_ver = "{:02}.{:02}.0900".format(*(dialect.server_version_info + (0,))[:2])
        return dialect

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "long_text":
            return _SizedClob(_CLOB_BYTES)
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("(CURRENT TIMESTAMP - CURRENT TIMEZONE)")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        # A parameter marker inside a function's arguments has no type the server can infer
        # (SQL0418N at prepare time): cast it.
        shift = bindparam(None, -ms / 1000, type_=Numeric(18, 3), unique=True)
        return column < func.add_seconds(self.now(), cast(shift, Numeric(18, 3)))

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        message = str(orig or "")
        for match in _SQLCODE.finditer(message):
            code = int(match.group(1)) if match.group(1) else -int(match.group(2))
            if code in _TRANSIENT_SQLCODES:
                return True
        return any(m.group(1) in _TRANSIENT_SQLSTATES for m in _SQLSTATE.finditer(message))

    def session_statements(self, limits: SessionLimits) -> list[str]:
        """``CURRENT LOCK TIMEOUT`` (whole seconds) bounds every lock wait of the session
        (SQL0911N reason 68, transient). Db2 has no per-session idle-in-transaction timeout; a
        DBA bounds idle connections with a WLM threshold (``CONNECTIONIDLETIME``)."""
        return [f"SET CURRENT LOCK TIMEOUT = {max(1, -(-int(limits.lock_timeout_ms) // 1000))}"]
