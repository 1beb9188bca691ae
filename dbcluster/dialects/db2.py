"""Db2 (LUW). The clock is ``CURRENT TIMESTAMP - CURRENT TIMEZONE`` (two words each, and a
TIMESTAMP(6) by default); staleness shifts it with ``ADD_SECONDS``, which takes fractional
seconds. SQLAlchemy names this dialect ``ibm_db_sa``."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from sqlalchemy import Numeric, bindparam, func
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider

#: Deadlock or lock timeout rollback (-911), statement-level deadlock (-913), communication
#: error (-30081), client reroute (-30108), connection lost (-1224, -30080).
_TRANSIENT_SQLCODES = {-911, -913, -30081, -30108, -1224, -30080}
_SQLCODE = re.compile(r"SQLCODE=(-?\d+)|SQL(\d{4,5})N")


class Db2Provider(QueryProvider):
    name = "db2"
    sqlalchemy_names = ("ibm_db_sa", "db2")
    example_url = "db2+ibm_db://"
    can_create_database = False
    drivers: ClassVar[dict[str, str]] = {"ibm_db": "db2", "ibm_db_dbi": "db2"}

    @classmethod
    def offline_dialect(cls, dialect_class: type[Dialect]) -> Dialect:
        # ibm_db_sa decides some DDL from the server it is connected to; compile for Db2 LUW 11.5.
        dialect = dialect_class()
        dialect.dbms_name = "DB2/LINUXX8664"
        dialect.dbms_ver = "11.05.0900"
        return dialect

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "long_text":
            from sqlalchemy import CLOB

            return CLOB()
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("(CURRENT TIMESTAMP - CURRENT TIMEZONE)")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        shift = bindparam(None, -ms / 1000, type_=Numeric(18, 3), unique=True)
        return column < func.add_seconds(self.now(), shift)

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        for match in _SQLCODE.finditer(str(orig or "")):
            code = int(match.group(1)) if match.group(1) else -int(match.group(2))
            if code in _TRANSIENT_SQLCODES:
                return True
        return False
