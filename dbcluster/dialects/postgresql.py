"""PostgreSQL. ``clock_timestamp()`` is the wall clock at the moment of the call; the usual
``CURRENT_TIMESTAMP`` is frozen at transaction start and would age every heartbeat."""

from __future__ import annotations

import os
import re
import select as select_module
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar

from sqlalchemy import (
    Engine,
    Insert,
    Integer,
    Interval,
    Select,
    String,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
    table,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL, Connection, Dialect
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import NullType, TypeDecorator, TypeEngine

from dbcluster.dialects import postgresql_pooler, psycopg_logs
from dbcluster.dialects.base import POOLER_OPTION, Listener, SessionLimits
from dbcluster.dialects.postgresql_ctes import WritableCTEProvider
from dbcluster.errors import ConfigurationError
from dbcluster.schema import PARAMETER_COLUMNS, ShortText, nodes

# psycopg's own echo of a lost connection is no WARNING of a routine outage (see the module).
psycopg_logs.install()

#: What a channel name made by :meth:`QueryProvider.wake_channel` looks like (it goes into
#: ``LISTEN`` as an identifier, which cannot be a bound parameter).
_CHANNEL = re.compile(r"^[a-z0-9_]{1,63}$")

#: SQLSTATEs worth repeating: serialization failure, deadlock, lock not available, admin/crash
#: shutdown, cannot connect now, too many connections, a session ended for idling in a
#: transaction (or idling at all).
_TRANSIENT_SQLSTATES = {
    "40001",
    "40P01",
    "55P03",
    "57P01",
    "57P02",
    "57P03",
    "53300",
    "25P03",
    "57P05",
}
#: Connect failures that repeating will not cure.
_PERMANENT_CONNECT_ERRORS = (
    "authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "unsupported startup parameter",
)


def _array_element(column_type: TypeEngine[Any]) -> TypeEngine[Any]:
    """The element type of a column's array parameter: bounded text binds as unbounded
    ``TEXT`` (an explicit cast to ``VARCHAR(n)`` would cut an over-long value where the column's
    own assignment refuses it, as a plain INSERT does); a column that clips its values keeps its
    type, whose processor clips them first."""
    if isinstance(column_type, ShortText) and column_type.clip:
        return column_type
    if isinstance(column_type, (String, ShortText)):
        return Text()
    return column_type


class _BinaryList(list):  # type: ignore[type-arg]
    """A list psycopg sends in the binary format (see :class:`_Array`)."""


def _send_binary_lists() -> None:
    """Have psycopg send :class:`_BinaryList` in the binary format (on connections made from
    now on: called before an engine makes its first)."""
    from psycopg import adapters
    from psycopg.types.array import ListBinaryDumper

    adapters.register_dumper(_BinaryList, ListBinaryDumper)


class _Array(TypeDecorator[list[Any]]):
    """An array parameter. On psycopg its list goes in the binary format: psycopg sends a list
    in PostgreSQL's array text otherwise, quoting each string through regular expressions
    (25 ms for the contexts of a 2,000-partition launch, against 0.5 ms). Other lists a user
    binds on the same engine are left as psycopg sends them."""

    impl = ARRAY
    cache_ok = True

    def __init__(self, item_type: TypeEngine[Any]) -> None:
        super().__init__(item_type)

    def bind_processor(self, dialect: Any) -> Any:
        process = self.impl_instance.dialect_impl(dialect).bind_processor(dialect)
        if dialect.driver != "psycopg":
            return process
        if process is None:
            return lambda value: value if value is None else _BinaryList(value)
        return lambda value: value if value is None else _BinaryList(process(value))


#: What a refused folded final write's error carries (see :meth:`PostgreSQLProvider.refusal`),
#: then its two counts. The server quotes the value in its own language's marks; the value
#: itself is never translated.
_REFUSED = "dbcluster refused"
_REFUSED_COUNTS = re.compile(rf"{_REFUSED} (\d+) (\d+)")
#: The server's sessions, as ``pg_stat_activity`` lists them (to end one by pid and port).
_ACTIVITY = table("pg_stat_activity", column("pid", Integer()), column("client_port", Integer()))


def _sqlstate(orig: BaseException | None) -> str | None:
    """The error's SQLSTATE: psycopg gives ``sqlstate``, psycopg2 ``pgcode``."""
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


class PostgreSQLProvider(WritableCTEProvider):
    name = "postgresql"
    sqlalchemy_names = ("postgresql",)
    example_url = "postgresql+psycopg://"
    default_port = 5432
    drivers: ClassVar[dict[str, str]] = {
        "psycopg": "postgresql",
        "psycopg2": "postgresql-psycopg2",
    }
    supports_skip_locked = True
    supports_listen_notify = True
    #: NOTIFY's limit is 8,000 bytes in the default configuration.
    notify_payload_max = 7900
    supports_array_insert = True
    places_at_launch = True
    min_server_version = (13,)

    def now(self) -> ColumnElement[Any]:
        return self._clock("timezone('UTC', clock_timestamp())")

    def _node_registered(self, node_id: Any) -> ColumnElement[bool]:
        """The node's own row, locked ``FOR KEY SHARE`` as a claim's first CTE locks it: its
        removal (a ``DELETE``) waits for the transaction, or went first and is seen."""
        return exists(
            select(nodes.c.node_id)
            .where(nodes.c.node_id == node_id)
            .with_for_update(read=True, key_share=True)
        )

    def insert_from_arrays(
        self,
        table: Table,
        columns: Sequence[str],
        values: Mapping[str, Any] | None = None,
    ) -> Insert | None:
        """``INSERT INTO t (...) SELECT ... FROM unnest(%(a_x)s::T[], ...) AS rows(x, ...)``."""
        arrays = [
            bindparam(f"a_{name}", type_=_Array(_array_element(table.c[name].type)))
            for name in columns
        ]
        rows = func.unnest(*arrays).table_valued(*columns).render_derived(name="dbc_rows")
        extra = dict(values or {})
        return insert(table).from_select(
            [*columns, *extra], select(*(rows.c[name] for name in columns), *extra.values())
        )

    def update_from_arrays(
        self,
        table: Table,
        match: Sequence[str],
        columns: Sequence[str],
        values: Mapping[str, Any] | None = None,
    ) -> Update | None:
        """``UPDATE t SET x = dbc_rows.x, ... FROM unnest(%(a_k)s::T[], ...) AS dbc_rows(k, x,
        ...) WHERE t.k = dbc_rows.k``."""
        names = [*match, *(name for name in columns if name not in match)]
        arrays = [
            bindparam(f"a_{name}", type_=_Array(_array_element(table.c[name].type)))
            for name in names
        ]
        rows = func.unnest(*arrays).table_valued(*names).render_derived(name="dbc_rows")
        return (
            update(table)
            .where(*(table.c[name] == rows.c[name] for name in match))
            .values({**{name: rows.c[name] for name in columns}, **dict(values or {})})
        )

    def read_url_options(self, url: URL) -> None:
        """``dbcluster_pooler=transaction``: a pooler in transaction mode (PgBouncer's
        ``pool_mode = transaction``) sits between dbcluster and the server (see
        :mod:`~dbcluster.dialects.postgresql_pooler`); ``none`` or ``session`` (each connection
        keeps its server session): none does."""
        value = url.query.get(POOLER_OPTION)
        if value is None or value in ("none", "session"):
            return
        if value != "transaction":
            raise ConfigurationError(
                f"{POOLER_OPTION}={value!r} is not a pooling mode dbcluster knows: use "
                f"{POOLER_OPTION}=transaction (PgBouncer's pool_mode = transaction) or none"
            )
        if url.get_driver_name() != "psycopg":
            raise ConfigurationError(
                f"{POOLER_OPTION}=transaction needs the psycopg driver: use a "
                "postgresql+psycopg:// URL"
            )
        if not postgresql_pooler.pipelines():
            raise ConfigurationError(
                f"{POOLER_OPTION}=transaction needs psycopg's pipeline mode (libpq 14 or later): "
                "install psycopg[binary], which ships one"
            )
        self.keeps_session = False

    def engine_options(self) -> dict[str, Any]:
        if self.keeps_session:
            return {}
        # A statement prepared on one server session is unknown to the next (PgBouncer 1.18
        # cannot carry prepared statements in transaction mode).
        return {"connect_args": {"prepare_threshold": None}}

    def connect(self, dialect: Dialect, cargs: Any, cparams: dict[str, Any]) -> Any:
        if self.keeps_session:
            return super().connect(dialect, cargs, cparams)
        return postgresql_pooler.connect(cparams, cargs, self.limits)

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        super().configure_engine(engine, coordination=coordination, autocommit=autocommit)
        if engine.dialect.driver == "psycopg":
            _send_binary_lists()
        if autocommit and not self.keeps_session and self.limits is not None:
            postgresql_pooler.limit_each_statement(engine, self.limits)

    def refusal(self, guarded: Any, written: Any) -> ColumnElement[Any] | None:
        """``CASE WHEN guarded = 1 AND written = 1 THEN NULL ELSE CAST('dbcluster refused ' ||
        guarded || ' ' || written AS INTEGER) END``: a text that is no integer fails the cast
        (``invalid_text_representation``), only when the counts are not both 1. The text is
        made from the counts, so the planner cannot fold the cast (and fail) ahead of time."""
        one = literal_column("1")
        text = (
            literal_column(f"'{_REFUSED} '", Text())
            .concat(guarded)
            .concat(literal_column("' '", Text()))
            .concat(written)
        )
        return case((and_(guarded == one, written == one), null()), else_=cast(text, Integer()))

    def refusal_of(self, error: BaseException) -> tuple[int, int] | None:
        """Judged by its SQLSTATE, in any language the server speaks: the counts are read from
        the value the message quotes; a message without them (cut, or an unusual server) is a
        refused guard, the safe reading (nothing of the transaction commits either way)."""
        orig = getattr(error, "orig", None) or error
        if _sqlstate(orig) != "22P02":  # invalid_text_representation
            return None
        found = _REFUSED_COUNTS.search(str(orig))
        return (0, 0) if found is None else (int(found.group(1)), int(found.group(2)))

    def session_of(self, dbapi_connection: Any) -> tuple[int, int] | None:
        """The server process (pid) and the client port of a psycopg connection, read from
        the driver without a round trip; None where it cannot be told (behind a pooler in
        transaction mode: the pid the client sees is the pooler's, and the server session
        passes from client to client)."""
        if not self.keeps_session:
            return None
        info = getattr(dbapi_connection, "info", None)
        pid = getattr(info, "backend_pid", None)
        pgconn = getattr(dbapi_connection, "pgconn", None)
        if not pid or pgconn is None:
            return None
        try:
            with socket.socket(fileno=os.dup(pgconn.socket)) as sock:
                address = sock.getsockname()
        except OSError:
            return None
        # A local socket has no port: pg_stat_activity says -1 for it.
        port = address[1] if isinstance(address, tuple) else -1
        return int(pid), int(port)

    def end_session(self, session: Any) -> Select[Any] | None:
        """``pg_terminate_backend`` of the session's process, waiting up to 1 s for it to end,
        only while that pid still serves that client port (a new session never reuses both)."""
        pid, port = session
        return select(func.pg_terminate_backend(_ACTIVITY.c.pid, 1000)).where(
            _ACTIVITY.c.pid == pid, _ACTIVITY.c.client_port == port
        )

    def session_alive(self, session: Any) -> Select[Any] | None:
        pid, port = session
        return select(_ACTIVITY.c.pid).where(
            _ACTIVITY.c.pid == pid, _ACTIVITY.c.client_port == port
        )

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        return column < self.now() - literal(timedelta(milliseconds=ms), Interval())

    def standalone_read_options(self) -> dict[str, Any]:
        # psycopg switches autocommit on and off without a round trip.
        return {"isolation_level": "AUTOCOMMIT"}

    def drop_database_sql(self, name: str) -> str:
        return f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"

    def session_engine_options(self, limits: SessionLimits) -> dict[str, Any]:
        """Both bounds as server settings of the session, sent with the connection request;
        behind a pooler in transaction mode, with each transaction instead (see
        :mod:`~dbcluster.dialects.postgresql_pooler`)."""
        if not self.keeps_session:
            return {}
        options = f"-c lock_timeout={int(limits.lock_timeout_ms)}"
        if limits.idle_in_transaction_ms is not None:
            idle = int(limits.idle_in_transaction_ms)
            options += f" -c idle_in_transaction_session_timeout={idle}"
        return {"connect_args": {"options": options}}

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        values = self._node_values(host, capacity)
        stmt = pg_insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
        conn.execute(stmt.on_conflict_do_update(index_elements=[nodes.c.node_id], set_=values))

    def connect_error_hint(self, error: BaseException) -> str | None:
        if "unsupported startup parameter" in str(error) and self.keeps_session:
            return (
                f"the server refused a startup parameter ({str(error).strip().splitlines()[-1]}), "
                f"as PgBouncer does: behind a pooler in transaction mode add "
                f"?{POOLER_OPTION}=transaction to the URL (docs/databases.md, PgBouncer)"
            )
        return None

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        return _sqlstate(orig) == "25006"  # read_only_sql_transaction

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        sqlstate = _sqlstate(orig)
        if not sqlstate:
            # A failed connect (refused, reset, the server starting or stopping) is an
            # OperationalError without a SQLSTATE; a wrong role, password or database is not
            # worth repeating.
            operational = any(c.__name__ == "OperationalError" for c in type(orig).__mro__)
            message = str(orig).lower()
            return operational and not any(p in message for p in _PERMANENT_CONNECT_ERRORS)
        return sqlstate in _TRANSIENT_SQLSTATES or sqlstate.startswith("08")

    # --- wake-ups -------------------------------------------------------------------------------

    def notify(self, channels: Any, payloads: Any = None) -> Select[Any]:
        """``pg_notify`` on each channel of the (array) parameter, in one statement, with the
        payload at the same place of ``payloads`` (or none); delivered when the transaction
        commits."""
        channel = column("channel", Text())
        if payloads is None:
            names = func.unnest(channels).table_valued(channel).render_derived()
            return select(func.count(func.pg_notify(names.c.channel, ""))).select_from(names)
        payload = column("payload", Text())
        pairs = func.unnest(channels, payloads).table_valued(channel, payload).render_derived()
        return select(func.count(func.pg_notify(pairs.c.channel, pairs.c.payload))).select_from(
            pairs
        )

    def notify_from(self, source: Any, channel: Any, payload: Any) -> Select[Any] | None:
        return select(func.count(func.pg_notify(channel, payload))).select_from(source)

    def insert_with_children(
        self,
        parent: Insert,
        parent_key: Any,
        children: Sequence[tuple[Table, Sequence[str], Sequence[str]]],
    ) -> Select[Any] | None:
        # Data-modifying CTEs run to completion whether or not the statement reads them; the
        # arrays unnest side by side (PostgreSQL 10 and later: as many rows as elements).
        made = parent.returning(parent_key).cte("dbc_parent")
        key = made.c[parent_key.name]
        statement = select(key)
        for index, (child, columns, arrays) in enumerate(children):
            first, *others = columns
            rows = select(
                key,
                *(bindparam(name, type_=child.c[name].type) for name in others),
                *(
                    func.unnest(
                        bindparam(f"a_{name}", type_=_Array(_array_element(child.c[name].type)))
                    )
                    for name in arrays
                ),
            )
            written = insert(child).from_select([first, *others, *arrays], rows)
            statement = statement.add_cte(written.cte(f"dbc_child{index}"))
        return statement

    def aggregate_parameters(self, params: Any, order_by: Any) -> list[Any] | None:
        # psycopg returns each array as a list of its elements' Python values: no result
        # processor (which would also keep the claim from running prebuilt).
        return [
            type_coerce(func.array_agg(aggregate_order_by(params.c[name], order_by)), NullType())
            for name in PARAMETER_COLUMNS
        ]

    def insert_unless_present(self, table: Table, key: Sequence[str]) -> Insert | None:
        # ON CONFLICT DO NOTHING on that unique key only: any other violation still raises.
        return pg_insert(table).on_conflict_do_nothing(index_elements=[table.c[k] for k in key])

    def together(self, write: Insert, then: Any) -> Any | None:
        # A data-modifying CTE runs whether or not the statement reads it, in the same snapshot
        # as the statement (neither sees the other's rows); constraints are checked at the end.
        return then.add_cte(write.cte("dbc_first"))

    def notify_parameter(self, name: str) -> Any:
        return bindparam(name, type_=_Array(Text()))

    def open_listener(self, engine: Engine, channel: str) -> Listener:
        if not _CHANNEL.match(channel):
            raise ValueError(f"not a wake-up channel: {channel!r}")
        return _PostgreSQLListener(engine, channel)


class _PostgreSQLListener:
    """One pooled connection of its own (autocommit), listening on one channel; invalidated (not
    returned to the pool) when closed."""

    def __init__(self, engine: Engine, channel: str) -> None:
        self._raw = engine.raw_connection()
        try:
            driver = self._raw.driver_connection
            driver.autocommit = True
            cursor = driver.cursor()
            try:
                cursor.execute(f"LISTEN {channel}")
            finally:
                cursor.close()
        except BaseException:
            self._raw.invalidate()
            raise
        self._driver = driver

    def wait(self, timeout: float) -> list[str] | None:
        driver = self._driver
        notifies = getattr(driver, "notifies", None)
        if callable(notifies):  # psycopg 3.2 and later
            for notify in notifies(timeout=timeout, stop_after=1):
                return [notify.payload]
            return None
        # psycopg2: wait for the socket, then let the driver read what arrived.
        if not driver.notifies:
            ready, _, _ = select_module.select([driver], [], [], timeout)
            if ready:
                driver.poll()
        payloads = [getattr(n, "payload", "") for n in driver.notifies]
        driver.notifies.clear()
        return payloads or None

    def close(self) -> None:
        self._raw.invalidate()
