"""SQL readers and writers on SQLAlchemy Core."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    CursorResult,
    Engine,
    FromClause,
    Select,
    Table,
    and_,
    bindparam,
    insert,
    or_,
    select,
    update,
)

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.items.base import refuse_code
from dbcluster.batch.scope import ChunkContext
from dbcluster.inlists import IN_LIST_MAX, in_batches


def to_position(value: Any) -> Any:
    """A key value as JSON the step context can hold (dates, times, decimals and bytes are
    tagged, so :func:`from_position` gives back the same type)."""
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    return value


def from_position(value: Any) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        ((tag, text),) = value.items()
        if tag == "$datetime":
            return datetime.fromisoformat(text)
        if tag == "$date":
            return date.fromisoformat(text)
        if tag == "$decimal":
            return Decimal(text)
        if tag == "$bytes":
            return base64.b64decode(text)
    return value


def read_page(engine: Engine, stmt: Any, params: Mapping[str, Any] | None = None) -> list[dict]:
    """Run a page's query on its own connection, outside any transaction where the database
    allows it cheaply (one round trip), and return its rows as dicts."""
    from dbcluster.dialects import get_provider

    with engine.connect() as conn:
        options = get_provider(engine).standalone_read_options()
        if options:
            conn = conn.execution_options(**options)
        result = conn.execute(stmt, params or {})
        keys = tuple(result.keys())
        return [dict(zip(keys, row)) for row in result.all()]  # noqa: B905 - a row has every key


class _PagedReader:
    """Hands out the rows of one page after another: ``_fetch`` fills ``_buffer`` with the next
    page (setting ``_exhausted`` on a short one), ``_remember`` keeps the position of a row."""

    _buffer: list[dict[str, Any]]
    _position: int
    _exhausted: bool

    def _fetch(self) -> None:
        raise NotImplementedError

    def _remember(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def read(self) -> dict[str, Any] | None:
        if self._position >= len(self._buffer):
            if self._exhausted:
                return None
            self._fetch()
            if not self._buffer:
                return None
        row = self._buffer[self._position]
        self._position += 1
        self._remember(row)
        return row

    def read_chunk(self, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` of the rows :meth:`read` would hand out next, at once: the rest of
        the current page, or the first rows of the next one; empty at the end. A chunk step
        without read listeners takes its items this way (no call per row)."""
        if self._position >= len(self._buffer):
            if self._exhausted:
                return []
            self._fetch()
            if not self._buffer:
                return []
        start = self._position
        rows = self._buffer[start : start + limit]
        self._position = start + len(rows)
        self._remember(rows[-1])
        return rows


class SqlKeyRangeReader(_PagedReader):
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
        self._statements: dict[bool, Select[Any]] = {}

    @property
    def _state_key(self) -> str:
        return f"{self.name}.last_key"

    def open(self, context: ExecutionContext) -> None:
        self._last_key = context.get(self._state_key)
        self._buffer = []
        self._position = 0
        self._exhausted = False

    def _statement(self, after_last: bool) -> Select[Any]:
        """The page query, built once per reader: the first page from ``lo``, the next ones after
        the last key read (bound at each page)."""
        stmt = select(*self.columns)
        # One lower bound only: after the first page, "key > last" replaces "key >= lo" (it is
        # tighter). Given both, SQLite's planner may start its index range at lo on every page,
        # which makes reading a slice quadratic.
        if after_last:
            stmt = stmt.where(self.key > bindparam("dbc_last_key", type_=self.key.type))
        elif self.lo is not None:
            stmt = stmt.where(self.key >= bindparam("dbc_lo", self.lo, type_=self.key.type))
        if self.hi is not None:
            stmt = stmt.where(self.key < bindparam("dbc_hi", self.hi, type_=self.key.type))
        return stmt.order_by(self.key).limit(self.page_size)

    def _fetch(self) -> None:
        after_last = self._last_key is not None
        stmt = self._statements.get(after_last)
        if stmt is None:
            stmt = self._statements[after_last] = self._statement(after_last)
        params = {"dbc_last_key": self._last_key} if after_last else {}
        self._buffer = read_page(self.engine, stmt, params)
        self._position = 0
        if len(self._buffer) < self.page_size:
            self._exhausted = True

    def _remember(self, row: dict[str, Any]) -> None:
        self._last_key = row[self.key.name]

    def update(self, context: ExecutionContext) -> None:
        context.put(self._state_key, self._last_key)

    def close(self) -> None:
        self._buffer = []


class SqlPagingItemReader(_PagedReader):
    """Reads a query's rows page by page in the order of ``sort_keys``, as dicts; restartable.

    ``query``: a table, or a ``select()`` (its ``bindparam``s filled from ``parameters``).
    ``sort_keys``: columns of the query that together are unique (a primary key, composite or
    not), each a name or ``(name, "desc")``. Each page starts after the last row read ("keyset"
    paging: ``(a > :a) OR (a = :a AND b > :b)``), so it stays fast deep into the table and no
    row is read twice or skipped when rows before the position change. The last row's keys are
    saved in the step context at each commit; a restart goes on after them. Sort keys must not
    be NULL.
    """

    def __init__(
        self,
        engine: Engine,
        query: FromClause | Select[Any],
        sort_keys: Sequence[str | tuple[str, str]],
        *,
        parameters: Mapping[str, Any] | None = None,
        page_size: int = 1000,
        name: str | None = None,
    ) -> None:
        if not sort_keys:
            raise ValueError("a paging reader needs at least one sort key")
        self.engine = engine
        stmt = query if isinstance(query, Select) else select(query)
        columns = stmt.selected_columns
        keys: list[tuple[str, bool]] = []
        for key in sort_keys:
            column_name, direction = (key, "asc") if isinstance(key, str) else key
            if direction.lower() not in ("asc", "desc"):
                raise ValueError(f"sort direction of {column_name!r} must be asc or desc")
            if column_name not in columns:
                raise ValueError(f"sort key {column_name!r} is not a column of the query")
            keys.append((column_name, direction.lower() == "desc"))
        self.keys = keys
        self.parameters = dict(parameters or {})
        self.page_size = page_size
        self.name = name or f"paging:{'+'.join(k for k, _ in keys)}"
        order = [columns[k].desc() if d else columns[k].asc() for k, d in keys]
        # Both statements are built once; each page binds the last row's keys.
        self._first = stmt.order_by(*order).limit(page_size)
        self._after = stmt.where(self._after_last(columns)).order_by(*order).limit(page_size)
        self._last: list[Any] | None = None
        self._buffer: list[dict[str, Any]] = []
        self._position = 0
        self._exhausted = False

    def _after_last(self, columns: Any) -> ColumnElement[bool]:
        """``(k1 > :k1) OR (k1 = :k1 AND k2 > :k2) OR ...`` (``<`` for descending keys)."""
        terms = []
        for i, (name, descending) in enumerate(self.keys):
            equal = [
                columns[k] == bindparam(f"dbc_last_{j}", type_=columns[k].type)
                for j, (k, _) in enumerate(self.keys[:i])
            ]
            last = bindparam(f"dbc_last_{i}", type_=columns[name].type)
            beyond = columns[name] < last if descending else columns[name] > last
            terms.append(and_(*equal, beyond))
        return or_(*terms)

    @property
    def _state_key(self) -> str:
        return f"{self.name}.last"

    def open(self, context: ExecutionContext) -> None:
        saved = context.get(self._state_key)
        self._last = None if saved is None else [from_position(v) for v in saved]
        self._buffer, self._position, self._exhausted = [], 0, False

    def _fetch(self) -> None:
        params = dict(self.parameters)
        if self._last is None:
            stmt = self._first
        else:
            stmt = self._after
            params.update({f"dbc_last_{i}": v for i, v in enumerate(self._last)})
        self._buffer = read_page(self.engine, stmt, params)
        self._position = 0
        self._exhausted = len(self._buffer) < self.page_size

    def _remember(self, row: dict[str, Any]) -> None:
        self._last = [row[k] for k, _ in self.keys]

    def update(self, context: ExecutionContext) -> None:
        if self._last is not None:
            context.put(self._state_key, [to_position(v) for v in self._last])

    def close(self) -> None:
        self._buffer = []


class SqlCursorItemReader:
    """Streams a query's rows through one open cursor (a server-side cursor where the driver
    has one), as dicts; restartable by count: at each commit it saves how many rows it
    returned, and a restart runs the query again and passes over that many (so the query must
    give the same rows in the same order: give it an ORDER BY on unique columns).

    The cursor holds a connection, and on PostgreSQL a read transaction, for the whole step:
    give it an engine whose sessions are not ended when idle in a transaction (not a cluster
    node's work engine), or prefer :class:`SqlPagingItemReader` for long steps.
    """

    def __init__(
        self,
        engine: Engine,
        query: Select[Any] | Any,
        parameters: Mapping[str, Any] | None = None,
        *,
        fetch_size: int = 1000,
        name: str | None = None,
    ) -> None:
        self.engine = engine
        self.query = query
        self.parameters = dict(parameters or {})
        self.fetch_size = fetch_size
        self.name = name or "cursor"
        self._conn: Connection | None = None
        self._result: CursorResult[Any] | None = None
        self._count = 0

    @property
    def _state_key(self) -> str:
        return f"{self.name}.read_count"

    def open(self, context: ExecutionContext) -> None:
        self.close()
        self._conn = self.engine.connect()
        streaming = self._conn.execution_options(stream_results=True, yield_per=self.fetch_size)
        self._result = streaming.execute(self.query, self.parameters)
        self._count = 0
        for _ in range(int(context.get(self._state_key, 0))):
            if self._result.fetchone() is None:
                break
            self._count += 1

    def read(self) -> dict[str, Any] | None:
        if self._result is None:
            self.open(ExecutionContext())
        assert self._result is not None
        row = self._result.fetchone()
        if row is None:
            return None
        self._count += 1
        return dict(row._mapping)

    def update(self, context: ExecutionContext) -> None:
        context.put(self._state_key, self._count)

    def close(self) -> None:
        if self._result is not None:
            self._result.close()
            self._result = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SqlItemWriter:
    """Inserts each chunk into ``table`` in the chunk's transaction (one executemany).

    Items are mappings of column name to value, or are turned into one by ``to_row``.

    ``upsert_on`` (column names that are unique together, e.g. the primary key): rows whose keys
    exist are updated instead (the other columns of the row), the rest inserted, in portable SQL
    on every database: the chunk's existing keys are read, then one executemany UPDATE and one
    INSERT. Within a chunk the last row of a key wins. Two steps that upsert the same new key at
    once may meet a unique-key error (retried as the step is configured): give partitions
    disjoint keys.
    """

    def __init__(
        self,
        table: Table,
        to_row: Callable[[Any], Mapping[str, Any]] | None = None,
        *,
        upsert_on: Sequence[str] | None = None,
    ) -> None:
        self.table = table
        self.to_row = to_row
        self.upsert_on = list(upsert_on or ())
        for key in self.upsert_on:
            if key not in table.c:
                raise ValueError(f"upsert key {key!r} is not a column of {table.name}")
        self._insert = insert(table)
        self._update_stmt: dict[tuple[str, ...], Any] = {}

    def _rows(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        refuse_code(items, self)
        rows = []
        for item in items:
            row = self.to_row(item) if self.to_row else item
            if not isinstance(row, Mapping):
                raise TypeError(
                    f"SqlItemWriter({self.table.name}) was given {row!r}, not a mapping of "
                    f"column to value; give it to_row"
                )
            rows.append(dict(row))
        return rows

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        if not items:
            return
        rows = self._rows(items)
        if not self.upsert_on:
            ctx.connection.execute(self._insert, rows)
            return
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in rows:
            by_key[tuple(row[k] for k in self.upsert_on)] = row
        existing = self._existing(ctx.connection, list(by_key))
        updates = [row for key, row in by_key.items() if key in existing]
        inserts = [row for key, row in by_key.items() if key not in existing]
        for columns, group in self._by_columns(updates).items():
            ctx.connection.execute(self._update(columns), group)
        if inserts:
            ctx.connection.execute(self._insert, inserts)

    def _existing(self, conn: Connection, keys: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
        columns = [self.table.c[k] for k in self.upsert_on]
        found: set[tuple[Any, ...]] = set()
        # Composite keys take one parameter per column per key: keep a slice under the limits.
        for batch in in_batches(keys, max(1, IN_LIST_MAX // len(columns))):
            if len(columns) == 1:
                where = columns[0].in_([k[0] for k in batch])
            else:
                where = or_(
                    *(and_(*(c == v for c, v in zip(columns, k, strict=True))) for k in batch)
                )
            found.update(tuple(r) for r in conn.execute(select(*columns).where(where)))
        return found

    def _by_columns(
        self, rows: list[dict[str, Any]]
    ) -> dict[tuple[str, ...], list[dict[str, Any]]]:
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for row in rows:
            values = tuple(sorted(c for c in row if c not in self.upsert_on))
            groups.setdefault(values, []).append({f"dbc_{c}": v for c, v in row.items()})
        return groups

    def _update(self, columns: tuple[str, ...]) -> Any:
        """``UPDATE table SET c = :dbc_c ... WHERE key = :dbc_key``, built once per column set."""
        stmt = self._update_stmt.get(columns)
        if stmt is None:
            table = self.table
            stmt = (
                update(table)
                .where(*(table.c[k] == bindparam(f"dbc_{k}") for k in self.upsert_on))
                .values({c: bindparam(f"dbc_{c}") for c in columns})
            )
            self._update_stmt[columns] = stmt
        return stmt
