"""SQL readers and writers on SQLAlchemy Core."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Column, Engine, Table, insert, select

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.scope import ChunkContext


class SqlKeyRangeReader:
    """Reads the rows of ``table`` whose ``key`` lies in ``[lo, hi)`` in key order, ``page_size``
    rows per query, as dicts. Restartable: it saves the last key it returned and resumes after it.

    ``lo`` / ``hi`` may be None (unbounded). The key must be unique and JSON-representable (an
    int or a str).
    """

    def __init__(
        self,
        engine: Engine,
        table: Table,
        key: str | Column[Any],
        lo: Any = None,
        hi: Any = None,
        *,
        columns: Sequence[str | Column[Any]] | None = None,
        page_size: int = 1000,
        name: str | None = None,
    ) -> None:
        self.engine = engine
        self.table = table
        self.key = table.c[key] if isinstance(key, str) else key
        self.lo = lo
        self.hi = hi
        self.columns = [table.c[c] if isinstance(c, str) else c for c in (columns or list(table.c))]
        if self.key not in self.columns:
            self.columns.append(self.key)
        self.page_size = page_size
        self.name = name or f"{table.name}.{self.key.name}"
        self._last_key: Any = None
        self._buffer: list[dict[str, Any]] = []
        self._position = 0
        self._exhausted = False

    @property
    def _state_key(self) -> str:
        return f"{self.name}.last_key"

    def open(self, context: ExecutionContext) -> None:
        self._last_key = context.get(self._state_key)
        self._buffer = []
        self._position = 0
        self._exhausted = False

    def _fetch(self) -> None:
        stmt = select(*self.columns)
        # One lower bound only: after the first page, "key > last" replaces "key >= lo" (it is
        # tighter). Given both, SQLite's planner may start its index range at lo on every page,
        # which makes reading a slice quadratic.
        if self._last_key is not None:
            stmt = stmt.where(self.key > self._last_key)
        elif self.lo is not None:
            stmt = stmt.where(self.key >= self.lo)
        if self.hi is not None:
            stmt = stmt.where(self.key < self.hi)
        stmt = stmt.order_by(self.key).limit(self.page_size)
        with self.engine.connect() as conn:
            self._buffer = [dict(row._mapping) for row in conn.execute(stmt)]
        self._position = 0
        if len(self._buffer) < self.page_size:
            self._exhausted = True

    def read(self) -> dict[str, Any] | None:
        if self._position >= len(self._buffer):
            if self._exhausted:
                return None
            self._fetch()
            if not self._buffer:
                return None
        row = self._buffer[self._position]
        self._position += 1
        self._last_key = row[self.key.name]
        return row

    def update(self, context: ExecutionContext) -> None:
        context.put(self._state_key, self._last_key)

    def close(self) -> None:
        self._buffer = []


class SqlItemWriter:
    """Inserts each chunk into ``table`` in the chunk's transaction (one executemany).

    Items are mappings of column name to value, or are turned into one by ``to_row``.
    """

    def __init__(
        self, table: Table, to_row: Callable[[Any], Mapping[str, Any]] | None = None
    ) -> None:
        self.table = table
        self.to_row = to_row

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        if not items:
            return
        rows = [dict(self.to_row(i)) if self.to_row else dict(i) for i in items]
        ctx.connection.execute(insert(self.table), rows)
