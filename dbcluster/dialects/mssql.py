"""SQL Server. ``DATETIME`` rounds to ~3 ms, so timestamps are ``DATETIME2(6)``; the clock is
``SYSUTCDATETIME()``. Staleness shifts the clock with ``DATEADD`` rather than taking a difference on
the column (``DATEDIFF`` overflows after ~24 days of milliseconds and defeats the index)."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import BigInteger, bindparam, func, literal_column
from sqlalchemy.dialects import mssql
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider

#: Deadlock victim, lock request timeout, snapshot update conflict.
_TRANSIENT_ERRORS = ("(1205)", "(1222)", "(3960)")
#: Serialization failure, timeout, communication link failure, cannot connect, connection broken.
_TRANSIENT_SQLSTATES = {"40001", "HYT00", "HYT01", "08S01", "08001", "08003", "08004", "08007"}


class MSSQLProvider(QueryProvider):
    name = "mssql"
    sqlalchemy_names = ("mssql",)
    example_url = "mssql+pyodbc://"
    drivers: ClassVar[dict[str, str]] = {"pyodbc": "mssql", "pymssql": "mssql"}

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "timestamp":
            return mssql.DATETIME2(precision=6)
        if kind == "long_text":
            return mssql.NVARCHAR(None)
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("SYSUTCDATETIME()")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        # Microseconds as BIGINT would overflow DATEADD's int argument; split into ms.
        shift = bindparam(None, -ms, type_=BigInteger(), unique=True)
        return column < func.dateadd(literal_column("millisecond"), shift, self.now())

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        args = getattr(orig, "args", ())
        if not args:
            return False
        sqlstate = str(args[0])
        message = " ".join(str(a) for a in args[1:])
        return sqlstate in _TRANSIENT_SQLSTATES or any(e in message for e in _TRANSIENT_ERRORS)
