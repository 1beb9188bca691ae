"""Hot statements compiled once per dialect and run as the driver's SQL.

SQLAlchemy finds a Core statement's compiled form again on every execution: it walks the whole
statement to compute its cache key, hashes that key, and builds the execution's parameters from
the compiled form. For a statement of several CTEs (a partition's final write with the claim of
the next one) that costs the client more than the round trip. A :class:`Prebuilt` statement is
compiled once: its SQL text, the names and processors of its bind parameters, and the values of
those bound to constants. It runs through ``Connection.exec_driver_sql``, so the connection's
transaction, its events (statement counters and test faults see it), SQLAlchemy's error wrapping
and its handling of a lost connection stay as they are.

Only a statement SQLAlchemy would send unchanged can be prebuilt: named parameters, no IN list
expanded per execution, and result columns the driver already returns as Python values (no
result processor on this dialect); :meth:`Prebuilt.build` answers None for any other, and the
caller executes it as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import CursorResult, Dialect

_NAMED = ("pyformat", "named")


class Prebuilt:
    """One statement compiled for one dialect (see the module)."""

    def __init__(
        self,
        sql: str,
        names: tuple[str, ...],
        constants: dict[str, Any],
        processors: dict[str, Callable[[Any], Any]],
    ) -> None:
        self.sql = sql
        self.names = names
        self.constants = constants
        self.processors = processors

    @classmethod
    def build(cls, statement: Any, dialect: Dialect) -> Prebuilt | None:
        """``statement`` compiled for ``dialect``, or None where it cannot run prebuilt."""
        if dialect.paramstyle not in _NAMED:
            return None
        compiled = statement.compile(dialect=dialect)
        if compiled.positional or compiled.literal_execute_params or compiled.post_compile_params:
            return None
        for column in getattr(statement, "selected_columns", ()):
            if column.type.dialect_impl(dialect).result_processor(dialect, None) is not None:
                return None
        names: list[str] = []
        constants: dict[str, Any] = {}
        processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            if name not in names:
                names.append(name)
            if not bind.required:
                constants[name] = bind.effective_value
            # Of the binds sharing a name, the last with a processor, as SQLAlchemy takes it.
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = process
        return cls(compiled.string, tuple(names), constants, processors)

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> CursorResult[Any]:
        """Run it in ``conn``'s transaction with ``params`` (each bind parameter not bound to a
        constant by name; unknown names are ignored, as SQLAlchemy ignores them)."""
        constants = self.constants
        try:
            values = {
                name: params[name] if name in params else constants[name] for name in self.names
            }
        except KeyError as missing:
            raise TypeError(f"a value is required for bind parameter {missing}") from None
        for name, process in self.processors.items():
            values[name] = process(values[name])
        return conn.exec_driver_sql(self.sql, values)
