"""Oracle. ``DATE`` keeps whole seconds, so timestamps are ``TIMESTAMP(6)``; the clock is
``SYS_EXTRACT_UTC(SYSTIMESTAMP)`` and intervals are built with ``NUMTODSINTERVAL``, which takes
fractional seconds."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import Numeric, String, bindparam, func
from sqlalchemy.dialects import oracle
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider

#: Deadlock, serialization failure, resource busy (NOWAIT / WAIT timeout), and the lost- or
#: refused-connection family.
_TRANSIENT_ORA = {60, 8177, 54, 30006, 3113, 3114, 3135, 12541, 12514, 12537, 12170, 25408}
_TRANSIENT_DPY = ("DPY-1001", "DPY-4011", "DPY-6005")


class OracleProvider(QueryProvider):
    name = "oracle"
    sqlalchemy_names = ("oracle",)
    example_url = "oracle+oracledb://"
    can_create_database = False
    drivers: ClassVar[dict[str, str]] = {"oracledb": "oracle", "cx_oracle": "oracle"}

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "timestamp":
            return oracle.TIMESTAMP()
        if kind == "long_text":
            return oracle.CLOB()
        if kind == "id":
            return oracle.NUMBER(19)
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("SYS_EXTRACT_UTC(SYSTIMESTAMP)")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        seconds = bindparam(None, ms / 1000, type_=Numeric(18, 3), unique=True)
        unit = bindparam(None, "SECOND", type_=String(), unique=True)
        return column < self.now() - func.numtodsinterval(seconds, unit)

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        error = orig.args[0] if orig is not None and orig.args else None
        code = getattr(error, "code", None)
        if isinstance(code, int) and code in _TRANSIENT_ORA:
            return True
        full_code = str(getattr(error, "full_code", "") or error or "")
        return full_code.startswith(_TRANSIENT_DPY)
