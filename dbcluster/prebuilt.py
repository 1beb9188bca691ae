"""Hot statements compiled once per dialect and run as the driver's SQL.

SQLAlchemy finds a Core statement's compiled form again on every execution: it walks the whole
statement to compute its cache key, hashes that key, and builds the execution's parameters from
the compiled form. For a statement of several CTEs (a partition's final write with the claim of
the next one) that costs the client more than the round trip. A :class:`Prebuilt` statement is
compiled once: its SQL text, the names and processors of its bind parameters, and the values of
those bound to constants. It runs through ``Connection.exec_driver_sql``, so the connection's
transaction, its events (statement counters and test faults see it), SQLAlchemy's error wrapping
and its handling of a lost connection stay as they are.

Only a statement SQLAlchemy would send unchanged can be prebuilt: named parameters, an IN list
that SQLAlchemy expands per execution only when compiled for one length (``expand``), and result
columns the driver already returns as Python values (no
result processor on this dialect); :meth:`Prebuilt.build` answers None for any other, and the
caller executes it as usual.

**Rows straight from the driver.** :meth:`Prebuilt.one` and :meth:`Prebuilt.all` read a
statement's rows on the driver's own cursor when nothing would see the difference: the
connection is in a transaction and valid, it does not echo, the dialect does not rename
columns, and nothing waits on its statements (a ``before_cursor_execute`` or
``after_cursor_execute`` listener, a dialect's ``do_execute`` listener or the engine's own
replacement of it: statement counters, fault switches and a pooler's session limits keep the
usual path). SQLAlchemy's execution context and result (a result's metadata is built
from the cursor's description on every execution of driver SQL) cost a partition's final write
more than the database did. An error takes SQLAlchemy's own handling of a failed statement: the
same wrapped exception, the connection invalidated when it was lost, ``handle_error`` listeners
called. An autocommit connection (the claim's, the coordination reads') in no transaction takes
the driver's path too, where SQLAlchemy can tell it is one without a round trip and nothing
listens to the transaction SQLAlchemy would begin around the statement (no ``begin``, ``commit``
or ``rollback`` listener): the driver commits the statement on its own, as it would under
SQLAlchemy, and no transaction is left open for SQLAlchemy to end.
"""

from __future__ import annotations

import functools
import re
import sys
from collections import namedtuple
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import CursorResult, Dialect
from sqlalchemy.exc import MultipleResultsFound, NoResultFound

from dbcluster import points

_NAMED = ("pyformat", "named")
#: SQLAlchemy's handling of a failed statement (2.0 and 2.1); without it, every statement takes
#: the usual path.
_HANDLES_FAILURES = callable(getattr(Connection, "_handle_dbapi_exception", None))
#: SQLAlchemy's test of a connection in autocommit mode without a round trip (2.0 and 2.1);
#: without it, an autocommit connection takes the usual path.
_TELLS_AUTOCOMMIT = callable(getattr(Connection, "_is_autocommit_isolation", None))
#: A named placeholder (``%(name)s``) or an escaped ``%`` of a pyformat statement.
_PYFORMAT = re.compile(r"%%|%\(([^)]+)\)s")


def _native_placeholders(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` (pyformat) with the server's own numbered placeholders (``$1``, a name's every
    use the same number), and the names in their numbers' order."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        return f"${numbers.setdefault(name, len(numbers) + 1)}"

    return _PYFORMAT.sub(number, sql), tuple(numbers)


class _RowBase(tuple):  # type: ignore[type-arg]
    """What :meth:`Prebuilt.one` answers on the driver's path: a named tuple that also has
    SQLAlchemy ``Row``'s ``_mapping``."""

    __slots__ = ()
    #: The columns' names as the driver described them (a name that cannot be an attribute is
    #: still a key of ``_mapping``).
    _names: tuple[str, ...]

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._names, self, strict=True))


def _row_type(names: tuple[str, ...]) -> type[_RowBase]:
    if len(set(names)) != len(names):
        # SQLAlchemy would refuse to pick one of them; so does a prebuilt statement.
        raise ValueError(f"a prebuilt statement returns ambiguous column names: {names}")
    base = namedtuple("PrebuiltRow", names, rename=True)  # type: ignore[misc]  # noqa: PYI024
    return type("PrebuiltRow", (base, _RowBase), {"__slots__": (), "_names": names})


class Prebuilt:
    """One statement compiled for one dialect (see the module)."""

    def __init__(
        self,
        sql: str,
        names: tuple[str, ...],
        constants: dict[str, Any],
        processors: dict[str, Callable[[Any], Any]],
        expansions: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.sql = sql
        self.names = names
        self.constants = constants
        self.processors = processors
        #: Each IN list compiled for a fixed length: its parameter's name and the names its
        #: values take, as SQLAlchemy expands it (``b_ids`` -> ``b_ids_1``, ``b_ids_2``...).
        self.expansions = expansions or {}
        #: The row type of :meth:`one` on the driver's path, from the first row's description.
        self._row: type[_RowBase] | None = None
        #: Where the driver takes the server's own placeholders as they are (psycopg's
        #: ``RawCursor``): its cursor class, the statement so written and its parameters' order.
        #: The driver's path then sends it without parsing it again: psycopg caches the
        #: conversion of a statement up to 4 KB only, and a claim or a final write with the
        #: claim of the next is longer (parsed again on every execution otherwise).
        self.raw: tuple[Any, str, tuple[str, ...]] | None = None

    @classmethod
    def build(
        cls, statement: Any, dialect: Dialect, expand: Mapping[str, int] | None = None
    ) -> Prebuilt | None:
        """``statement`` compiled for ``dialect``, or None where it cannot run prebuilt.
        ``expand`` names each IN list SQLAlchemy would expand per execution and the length to
        compile it for: the text SQLAlchemy sends for a list of that length (one prebuilt
        statement per length; the server plans each as it plans SQLAlchemy's)."""
        if dialect.paramstyle not in _NAMED:
            return None
        compiled = statement.compile(dialect=dialect)
        expand = dict(expand or {})
        expanding = {bind.key for bind in compiled.post_compile_params}
        if compiled.positional or compiled.literal_execute_params or expanding != set(expand):
            return None
        for column in getattr(statement, "selected_columns", ()):
            if column.type.dialect_impl(dialect).result_processor(dialect, None) is not None:
                return None
        names: list[str] = []
        constants: dict[str, Any] = {}
        processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            # Of the binds sharing a name, the last with a processor, as SQLAlchemy takes it.
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = process
            if name in expand:
                continue
            if name not in names:
                names.append(name)
            if not bind.required:
                constants[name] = bind.effective_value
        sql, expansions = compiled.string, {}
        if expand:
            stand_ins = {bind.key: None for bind in compiled.binds.values() if bind.required}
            state = compiled.construct_expanded_state(
                {**stand_ins, **{name: [0] * length for name, length in expand.items()}}
            )
            sql = state.statement
            expansions = {name: tuple(state.parameter_expansion[name]) for name in expand}
        built = cls(sql, tuple(names), constants, processors, expansions)
        raw_cursor = getattr(dialect.dbapi, "RawCursor", None)
        if raw_cursor is not None and dialect.paramstyle == "pyformat":
            built.raw = (raw_cursor, *_native_placeholders(sql))
        return built

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> CursorResult[Any]:
        """Run it in ``conn``'s transaction with ``params`` (each bind parameter not bound to a
        constant by name; unknown names are ignored, as SQLAlchemy ignores them)."""
        return conn.exec_driver_sql(self.sql, self._values(params))

    def one(self, conn: Connection, params: Mapping[str, Any]) -> Any:
        """Its one row (as :meth:`execute` then ``.one()``), read on the driver's cursor where
        nothing would see the difference (see the module)."""
        rows = self._rows(conn, self._values(params), 2)
        if len(rows) != 1:
            if not rows:
                raise NoResultFound("No row was found when one was required")
            raise MultipleResultsFound("Multiple rows were found when exactly one was required")
        return rows[0]

    def one_committing(self, conn: Connection, params: Mapping[str, Any]) -> Any | None:
        """Its one row, the statement sent with ``COMMIT`` behind it in one round trip (the
        driver's pipeline: psycopg): the last statement of ``conn``'s transaction and its
        commit. None, having sent nothing, where that cannot be done unseen (see
        :func:`commits_in_pipeline`): the caller runs it and commits as usual.

        An error of the statement fails the pipeline: the ``COMMIT`` behind it is not run, the
        transaction is left failed for the caller to roll back, and the error is raised as
        SQLAlchemy raises a statement's. A connection lost on the way leaves the outcome
        unclear, as a lost ``COMMIT`` does (the caller settles the session before it reads
        the outcome: see ``Transactions``). Once it returns, the transaction has committed
        (SQLAlchemy's own commit that follows finds nothing left to commit)."""
        if self.raw is None or not commits_in_pipeline(conn):
            return None
        values = self._values(params)
        dbapi_connection: Any = conn.connection.dbapi_connection
        raw_cursor, raw_sql, order = self.raw
        cursor = raw_cursor(dbapi_connection)
        rows: list[Any] = []
        try:
            points.reach("driver.execute", conn=conn, sql=self.sql)
            with dbapi_connection.pipeline():
                cursor.execute(raw_sql, [values[name] for name in order])
                dbapi_connection.cursor().execute(b"COMMIT")
            points.reach("transaction.commit_sent", conn=conn, sql=self.sql)
            rows = cursor.fetchmany(2)
            row_type = self._row
            if row_type is None:
                row_type = self._row = _row_type(tuple(d[0] for d in cursor.description))
            cursor.close()
        except BaseException as error:
            try:
                cursor.close()
            except Exception:  # noqa: BLE001, S110 - the statement's own error is raised
                pass
            conn._handle_dbapi_exception(error, self.sql, values, cursor, None)
        if len(rows) != 1:
            if not rows:
                raise NoResultFound("No row was found when one was required")
            raise MultipleResultsFound("Multiple rows were found when exactly one was required")
        return tuple.__new__(row_type, rows[0])

    def all(self, conn: Connection, params: Mapping[str, Any]) -> list[Any]:
        """Its rows (as :meth:`execute` then ``.all()``), read as :meth:`one` reads."""
        return self._rows(conn, self._values(params), None)

    def _rows(self, conn: Connection, values: dict[str, Any], most: int | None) -> list[Any]:
        """The statement's rows (up to ``most``): SQLAlchemy's, or off the driver's cursor."""
        if not _direct(conn):
            with conn.exec_driver_sql(self.sql, values) as result:
                return list(result.fetchmany(most) if most is not None else result.all())
        # Outside the try, as SQLAlchemy takes it: a connection that must be rolled back first
        # raises its own error here, unwrapped.
        dbapi_connection = conn.connection.dbapi_connection
        cursor = None
        try:
            points.reach("driver.execute", conn=conn, sql=self.sql)
            if self.raw is not None:
                raw_cursor, raw_sql, order = self.raw
                cursor = raw_cursor(dbapi_connection)
                cursor.execute(raw_sql, [values[name] for name in order])
            else:
                cursor = dbapi_connection.cursor()  # type: ignore[union-attr]
                cursor.execute(self.sql, values)
            rows = cursor.fetchmany(most) if most is not None else cursor.fetchall()
            row_type = self._row
            if row_type is None:
                row_type = self._row = _row_type(tuple(d[0] for d in cursor.description))
            cursor.close()
        except BaseException as error:
            if cursor is not None:
                try:
                    cursor.close()
                except Exception:  # noqa: BLE001, S110 - the statement's own error is raised
                    pass
            conn._handle_dbapi_exception(error, self.sql, values, cursor, None)
        new = tuple.__new__
        return [new(row_type, row) for row in rows]

    def _values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        constants = self.constants
        try:
            values = {
                name: params[name] if name in params else constants[name] for name in self.names
            }
        except KeyError as missing:
            raise TypeError(f"a value is required for bind parameter {missing}") from None
        processors = self.processors
        for name, expanded in self.expansions.items():
            items = params[name]
            if len(items) != len(expanded):
                raise ValueError(
                    f"{name} has {len(items)} values; this statement was built for {len(expanded)}"
                )
            process = processors.get(name)
            values.update(
                zip(expanded, items if process is None else map(process, items), strict=True)
            )
        for name, process in processors.items():
            if name not in self.expansions:
                values[name] = process(values[name])
        return values


class PrebuiltStatements:
    """The prebuilt forms of statements built once (a launch's, which SQLAlchemy would look up
    again on every launch), made on first use for one dialect; a statement that cannot run
    prebuilt runs as usual. It holds each statement it saw: give it only statements that live
    as long as their owner (built once, with bound parameters for what varies)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._built: dict[Any, Prebuilt | None] = {}

    def rows(self, conn: Connection, statement: Any, params: Mapping[str, Any]) -> list[Any]:
        """``statement``'s rows with ``params`` (as ``conn.execute(...).all()``; none for a
        statement that returns none)."""
        try:
            built = self._built[statement]
        except KeyError:
            # Only a statement that returns rows: the driver's path reads them.
            returns_rows = len(getattr(statement, "exported_columns", ())) > 0
            built = Prebuilt.build(statement, self.dialect) if returns_rows else None
            self._built[statement] = built
        if built is None:
            result = conn.execute(statement, params)
            return list(result.all()) if result.returns_rows else []
        return built.all(conn, params)


def _direct(conn: Connection) -> bool:
    """Whether a statement may run on ``conn``'s driver cursor unseen (see the module)."""
    return (
        _HANDLES_FAILURES
        and (conn.in_transaction() or _autocommit_unseen(conn))
        and not conn.invalidated
        and not getattr(conn, "_echo", True)
        and not conn.dialect.requires_name_normalize
        and not conn.dispatch.before_cursor_execute
        and not conn.dispatch.after_cursor_execute
        and all(_sees_driver_path(f) for f in conn.dialect.dispatch.do_execute)
        # A dialect whose own do_execute is replaced on this engine (a pooler's session limits
        # sent with each statement: dbcluster.dialects.postgresql_pooler) must see each one.
        and "do_execute" not in vars(conn.dialect)
    )


def _sees_driver_path(listener: Any) -> bool:
    """Whether a ``do_execute`` listener also watches the driver's path (through the fault
    point ``driver.execute``, as the fault harness's cut switch does), so the path need not
    be given up for it: a function marked ``sees_driver_path = True``."""
    return getattr(listener, "sees_driver_path", False) is True


def commits_in_pipeline(conn: Connection) -> bool:
    """Whether a statement and the ``COMMIT`` of ``conn``'s transaction can be sent together,
    unseen: the driver has a pipeline (psycopg 3 on libpq 14 or later), the statement may run
    on the driver's path (see :func:`_direct`), the connection is in a transaction SQLAlchemy
    began, and nothing would see the commit happen before SQLAlchemy's own: no ``commit``
    listener, no commit of the dialect's replaced on this engine (a test's fault)."""
    if not (conn.in_transaction() and _direct(conn)):
        return False
    if conn.dispatch.commit or "do_commit" in vars(conn.dialect):
        return False
    dbapi_connection: Any = conn.connection.dbapi_connection
    if getattr(dbapi_connection, "autocommit", True):
        return False
    return _pipelines(type(dbapi_connection))


def driver_pipelines(dialect: Dialect) -> bool:
    """Whether the dialect's driver can send a statement and ``COMMIT`` in one round trip
    (see :meth:`Prebuilt.one_committing`)."""
    connection = getattr(dialect.dbapi, "Connection", None)
    return isinstance(connection, type) and _pipelines(connection)


@functools.cache
def _pipelines(driver_connection: type) -> bool:
    """Whether connections of this class have a pipeline the linked client library supports."""
    if getattr(driver_connection, "pipeline", None) is None:
        return False
    module = sys.modules.get(driver_connection.__module__.split(".")[0])
    supported = getattr(getattr(module, "Pipeline", None), "is_supported", None)
    return bool(supported is not None and supported())


def _autocommit_unseen(conn: Connection) -> bool:
    """Whether ``conn`` commits each statement on its own and nothing listens to the transaction
    SQLAlchemy would begin (and end) around one: its statements then need no transaction."""
    dispatch = conn.dispatch
    return (
        _TELLS_AUTOCOMMIT
        and not dispatch.begin
        and not dispatch.commit
        and not dispatch.rollback
        and conn._is_autocommit_isolation()
    )
