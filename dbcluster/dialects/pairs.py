"""Two statements in one request, where the driver can send them so and read each one's result
(MySQL and MariaDB through PyMySQL with the protocol's multi-statement capability): what a
provider's :meth:`~dbcluster.dialects.base.QueryProvider.read_then_write` builds.

Each statement is compiled once, its placeholders renamed apart (``%(r_name)s``,
``%(w_name)s``), and the two texts joined; a run sends them as one ``COM_QUERY`` through
SQLAlchemy (its error handling, statement events and lost-connection handling see it) and reads
the read's rows, then the write's row count, from the driver's cursor. The write's error, which
arrives only when its result is read, is given to SQLAlchemy's handling of a failed statement
too, so it is judged as any statement's error is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy.engine import Connection, Dialect

#: SQLAlchemy's handling of a failed statement (2.0 and 2.1), which the write's error takes.
_HANDLES_FAILURES = callable(getattr(Connection, "_handle_dbapi_exception", None))
#: A named placeholder (``%(name)s``) or an escaped ``%`` of a pyformat statement.
_PYFORMAT = re.compile(r"%%|%\(([^)]+)\)s")


class StatementPair(Protocol):
    """A read and a write sent together (see the module)."""

    def run(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Sequence[Any], int]:
        """The read's rows and the write's row count (``params`` bind both)."""


def _renamed(sql: str, prefix: str) -> str:
    return _PYFORMAT.sub(lambda m: "%%" if m.group(1) is None else f"%({prefix}{m.group(1)})s", sql)


class PyformatPair:
    """A read and a write of a pyformat dialect, joined into one request (see the module)."""

    def __init__(self, sql: str, constants: dict[str, Any], names: dict[str, str]) -> None:
        self.sql = sql
        #: The placeholders bound to constants, with their values.
        self.constants = constants
        #: Each placeholder that takes a caller's parameter: its name in ``params``.
        self.names = names

    @classmethod
    def build(cls, read: Any, write: Any, dialect: Dialect) -> PyformatPair | None:
        """None where either statement cannot be sent as plain pyformat text (an expanding
        IN list, a parameter the dialect processes before sending), or where SQLAlchemy has no
        handling of a failed statement to give the write's error to (then each goes alone)."""
        if dialect.paramstyle != "pyformat" or not _HANDLES_FAILURES:
            return None
        texts: list[str] = []
        constants: dict[str, Any] = {}
        names: dict[str, str] = {}
        for prefix, statement in (("r_", read), ("w_", write)):
            compiled = statement.compile(dialect=dialect)
            if compiled.positional or compiled.post_compile_params:
                return None
            for bind, name in compiled.bind_names.items():
                if bind.type.dialect_impl(dialect).bind_processor(dialect) is not None:
                    return None
                if bind.callable is None and bind.value is None and bind.required:
                    names[prefix + name] = bind.key
                else:
                    constants[prefix + name] = bind.effective_value
            texts.append(_renamed(compiled.string, prefix))
        return cls(";\n".join(texts), constants, names)

    def run(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Sequence[Any], int]:
        values = dict(self.constants)
        for placeholder, key in self.names.items():
            values[placeholder] = params[key]
        result = conn.exec_driver_sql(self.sql, values)
        cursor = result.cursor
        try:
            try:
                rows = list(cursor.fetchall())
                more = cursor.nextset()
                count = int(cursor.rowcount)
            except BaseException as error:
                # The write's error arrives with its result, after SQLAlchemy's execute
                # returned: it takes SQLAlchemy's own handling of a failed statement, as the
                # read's would (wrapped; the engine's handle_error listeners called, such as
                # the provider's that drops a session on a Galera node out of service; the
                # connection invalidated when it was lost).
                conn._handle_dbapi_exception(error, self.sql, values, cursor, result.context)
            if not more:
                # No second result: the write did not run (a proxy split or dropped it), and
                # the cursor's rowcount would still be the read's.
                raise RuntimeError("the statement pair's write returned no result")
            return rows, count
        finally:
            result.close()
