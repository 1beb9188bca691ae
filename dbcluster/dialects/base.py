"""The query provider contract and everything portable about it.

A provider says how one database expresses each coordination statement; it holds no coordination
logic. Everything expressible in portable SQLAlchemy Core lives here, once. A subclass overrides
only what its database does differently: the clock, "older than N ms", column types, an upsert,
which driver errors are transient, and capability flags.

Statement builders return SQLAlchemy executables with bound parameters; the caller executes them
and judges the row count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol

from sqlalchemy import (
    DateTime,
    Delete,
    Engine,
    Insert,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import URL, Connection, Dialect
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.elements import BindParameter, ClauseElement, ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster import schema
from dbcluster.schema import (
    job_coordination,
    job_masters,
    launch_requests,
    nodes,
    partitions,
    schedule_fires,
)

# Statuses are plain strings in the database, spelled in dbcluster.states only (named here too,
# for the providers and their callers that import them from this module).
from dbcluster.states import (  # noqa: F401 - re-exported
    COORD_ABANDONED,
    COORD_COMPLETED,
    COORD_CREATED,
    COORD_FAILED,
    COORD_IN_FLIGHT,
    COORD_MASTERED,
    COORD_RECOVERING,
    COORD_STARTED,
    JOB_STARTED,
    JOB_STARTING,
    JOB_STOPPING,
    LAUNCH_CLAIMED,
    LAUNCH_FAILED,
    LAUNCH_LAUNCHED,
    LAUNCH_PENDING,
    NODE_ACTIVE,
    NODE_REMOVING,
    NODE_UNREACHABLE,
    PARTITION_CLAIMED,
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_IN_FLIGHT,
    PARTITION_PENDING,
    STEP_EXECUTING,
    STEP_STARTED,
)

#: The prefix of the job execution's columns a claim reads back where it can (see
#: ``QueryProvider._claimed_job``).
CLAIMED_JOB_PREFIX = "j_"

#: The columns a placement gives each partition row it inserts (the others: see
#: :meth:`QueryProvider.insert_partitions`).
PLACED_COLUMNS = (
    "step_execution_id",
    "job_execution_id",
    "master_step_execution_id",
    "partition_name",
    "assigned_node",
    "transferable",
    "max_attempts",
    "trace_context",
)


def array_parameters(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> dict[str, list[Any]]:
    """Rows as the parameters of an :meth:`QueryProvider.insert_from_arrays` statement: one list
    per column, named ``a_<column>`` (a column a row leaves out is None there)."""
    return {f"a_{name}": [row.get(name) for row in rows] for name in columns}


@dataclass(frozen=True)
class SessionLimits:
    """Bounds every dbcluster session gets from its server.

    ``lock_timeout_ms``: the longest a statement waits for a row lock before failing (as a
    transient error, repeated by the caller). ``idle_in_transaction_ms``: the longest a session may
    sit idle inside an open transaction before the server ends it and rolls it back, so a frozen
    process cannot hold a partition's row (and stall its master) past the cleanup threshold.
    None where the engine must not get it.
    """

    lock_timeout_ms: int
    idle_in_transaction_ms: int | None = None


class Listener(Protocol):
    """A connection listening for wake-ups (see :meth:`QueryProvider.open_listener`)."""

    def wait(self, timeout: float) -> list[str] | None:
        """Block up to ``timeout`` seconds; the payloads of the notifications that arrived
        (empty strings for those without one), or None when none did."""
        ...

    def close(self) -> None: ...


def insert_from(table: Table, values: Mapping[str, Any], source: Any | None) -> Insert:
    """An INSERT of one row of ``values``; with ``source`` (a FROM clause of at most one row:
    a statement's CTE), an INSERT ... SELECT of those values from it, which ``values`` may
    take columns of and which writes nothing where ``source`` has no row (a launch's ownership
    rows in the statement that creates the execution, where its instance existed)."""
    if source is None:
        return insert(table).values(**values)
    return insert(table).from_select(
        list(values),
        select(*(_typed(table.c[name].type, value) for name, value in values.items())).select_from(
            source
        ),
    )


def _typed(type_: TypeEngine[Any], value: Any) -> Any:
    """``value`` as a column of a SELECT that fills a column of ``type_``: a constant or an
    untyped bound parameter takes that type (in a SELECT list the server would read an untyped
    parameter as text)."""
    if isinstance(value, BindParameter):
        if value.type._isnull:
            if value.required:
                return bindparam(value.key, type_=type_)
            return literal(value.value, type_=type_)
        return value
    if isinstance(value, ClauseElement):
        return value
    return literal(value, type_=type_)


class QueryProvider:
    """The portable provider. Subclasses set the class attributes and override what differs."""

    #: The name users type: ``dbcluster ddl --dialect NAME``.
    name: ClassVar[str] = ""
    #: SQLAlchemy dialect names (``engine.dialect.name``) this provider serves.
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ()
    #: URL used to build a dialect for compiling DDL without a server.
    example_url: ClassVar[str] = ""
    #: Driver module -> the pip extra of dbcluster that installs it (built-in providers; a
    #: provider shipped elsewhere overrides :meth:`driver_install_hint` instead).
    drivers: ClassVar[dict[str, str]] = {}
    #: The server's port when a URL names none (the test harness proxies each node's connection
    #: to it); None for a database that is not reached over TCP.
    default_port: ClassVar[int | None] = None
    #: Shared library a driver loads (name prefix) -> what installs it, for a driver that is
    #: installed but cannot load it.
    system_libraries: ClassVar[dict[str, str]] = {}

    # Capability flags (the conformance suite skips what a provider declares it cannot do).
    #: Several OS processes may share the database (false only for in-memory databases).
    supports_multiple_processes: ClassVar[bool] = True
    #: The database is reached over TCP, so a proxy can cut a node's connection.
    network_backend: ClassVar[bool] = True

    #: The server can create and drop a database cheaply (tests isolate each run in one).
    can_create_database: ClassVar[bool] = True
    #: A locking read can pass over rows another transaction holds (``FOR UPDATE SKIP LOCKED``;
    #: Db2's ``SKIP LOCKED DATA``, SQL Server's ``READPAST``: see :meth:`locked`): concurrent
    #: claimers pass over each other's rows instead of queueing on them.
    supports_skip_locked: ClassVar[bool] = False
    #: ``LISTEN``/``NOTIFY``: a placement wakes the nodes it assigned work to (see
    #: :meth:`open_listener`); without it nodes poll (adaptively).
    supports_listen_notify: ClassVar[bool] = False
    #: The longest notification payload, in bytes (a wake-up names the partitions it placed
    #: on the node, as many as fit).
    notify_payload_max: ClassVar[int] = 0
    #: Data-modifying statements in ``WITH`` (PostgreSQL's writable CTEs): one statement may update
    #: two tables, so a chunk writes its step execution row and its context in one round trip.
    supports_writable_cte: ClassVar[bool] = False
    #: ``UPDATE a, b SET a.x = ..., b.y = ... WHERE ...`` (MySQL, MariaDB): the same, one
    #: statement changing the rows of two tables (both or neither).
    supports_multi_table_update: ClassVar[bool] = False
    #: A multi-row INSERT can take each column's values as one array parameter and unnest them
    #: (see :meth:`insert_from_arrays`).
    supports_array_insert: ClassVar[bool] = False
    #: A launch may place its first step's partitions in the transaction that creates the job
    #: execution (one COMMIT before the partitions are visible). It runs the partitioner in that
    #: transaction, so a database whose write transaction locks more than the rows it writes
    #: (SQLite's one writer; MySQL's gap locks on the instance key) keeps the two transactions.
    places_at_launch: ClassVar[bool] = False
    #: The driver has an autocommit mode SQLAlchemy can set (``isolation_level="AUTOCOMMIT"``):
    #: single statements then cost one round trip. Without it they run in short transactions.
    supports_autocommit: ClassVar[bool] = True
    #: Pooled connections of a network database are pinged before use when they sat idle longer
    #: than this (seconds); a connection used moments ago is not.
    ping_idle_after_s: ClassVar[float] = 5.0

    #: The oldest server version supported; ``dbcluster ddl`` targets it unless told otherwise.
    min_server_version: ClassVar[tuple[int, ...]] = ()

    # How the database stores bounded text (``VARCHAR(n)``), so that keys compare alike and
    # clipped text fits everywhere.
    #: Collation of every bounded text column, where the database's default would compare keys
    #: ignoring case or accents (None: the default already compares them exactly).
    text_collation: ClassVar[str | None] = None
    #: What the ``n`` of ``VARCHAR(n)`` counts: "char" (code points), "utf16" (UTF-16 code
    #: units) or "byte" (UTF-8 bytes).
    text_length_unit: ClassVar[str] = "char"
    #: A cap in UTF-8 bytes over every declared length (None: no cap below the declared length).
    text_max_bytes: ClassVar[int | None] = None

    #: Partition rows one statement (and, when failing them, one transaction) writes when many
    #: are placed or failed at once: under SQL Server's lock escalation threshold (5,000 locks
    #: taken by one statement; a row takes a key lock in each index it changes) and Db2's
    #: per-transaction MAXLOCKS share, so a big job never takes a table lock that stops every
    #: poll and claim. Also an IN list's length (see :mod:`dbcluster.inlists`).
    partition_write_batch: ClassVar[int] = 500

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    @classmethod
    def offline_dialect(
        cls, dialect_class: type[Dialect], server_version: tuple[int, ...] | None = None
    ) -> Dialect:
        """A dialect to compile statements and DDL with when no server is connected, for
        ``server_version`` (default: :attr:`min_server_version`)."""
        dialect = dialect_class()
        version = server_version or cls.min_server_version
        if version:
            dialect.server_version_info = version
        return dialect

    @classmethod
    def driver_install_hint(cls, driver: str | None) -> str:
        """How a user gets the driver a URL asks for (``driver``: its name, e.g. ``psycopg``;
        None when the URL names none): the end of the one-line error, after "...; ".

        The default names the dbcluster extra from :attr:`drivers`; a provider that is not part
        of dbcluster overrides this with its own package, since no such extra exists."""
        extra = cls.drivers.get(driver or "") or next(iter(cls.drivers.values()), None)
        if extra is not None:
            return f"install it with: pip install 'dbcluster[{extra}]'"
        wanted = f"the {driver!r} driver" if driver else "its driver"
        return f"install {wanted} as the {cls.name} provider's documentation says"

    # --- types ----------------------------------------------------------------------------------

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        """The concrete type for a schema type kind (``timestamp``, ``long_text``, ``id``).

        None means "the generic SQLAlchemy type is right here".
        """
        return None

    @classmethod
    def text_type(cls, length: int) -> TypeEngine[Any]:
        """The type of a bounded text column of ``length`` characters: Unicode on every
        database, in :attr:`text_collation` where one is set."""
        return String(length, collation=cls.text_collation)

    @classmethod
    def clip_text(cls, text: str, length: int) -> str:
        """``text`` if a ``VARCHAR(length)`` column of this database holds it, else its longest
        head that fits with "..." after it (by :attr:`text_length_unit` and
        :attr:`text_max_bytes`, not by Python's character count)."""
        if cls._text_fits(text, length):
            return text
        room, bytes_room = length - 3, (cls.text_max_bytes or 0) - 3
        end = 0
        for char in text:
            room -= cls._text_units(char)
            bytes_room -= len(char.encode("utf-8"))
            if room < 0 or (cls.text_max_bytes is not None and bytes_room < 0):
                break
            end += 1
        return text[:end] + "..."

    @classmethod
    def _text_fits(cls, text: str, length: int) -> bool:
        if cls.text_max_bytes is not None and len(text.encode("utf-8")) > cls.text_max_bytes:
            return False
        if cls.text_length_unit == "char":
            return len(text) <= length
        return sum(cls._text_units(c) for c in text) <= length

    @classmethod
    def _text_units(cls, char: str) -> int:
        if cls.text_length_unit == "byte":
            return len(char.encode("utf-8"))
        if cls.text_length_unit == "utf16":
            return 2 if ord(char) > 0xFFFF else 1
        return 1

    # --- the database clock ---------------------------------------------------------------------

    def now(self) -> ColumnElement[datetime]:
        """The database clock, in UTC, with at least millisecond precision."""
        raise NotImplementedError

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        """``column`` is more than ``ms`` milliseconds before the database clock.

        Compare the bare column with "now minus N" so an index on it can be used.
        """
        raise NotImplementedError

    def select_now(self) -> Select[Any]:
        return select(self.now().label("now"))

    # --- engine set-up --------------------------------------------------------------------------

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for ``create_engine`` that this database needs. (Pooled connections
        are pinged only after sitting idle a while: see ``make_engine``.)"""
        return {}

    def autocommit_engine_options(self) -> dict[str, Any]:
        """``create_engine`` arguments for an engine whose every statement commits on its own:
        a read or a single-statement write is then one round trip (no ``BEGIN``, ``COMMIT`` or
        ``ROLLBACK``), and a connection goes back to the pool without a rollback."""
        options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None}
        # Skip the driver's rollback() on an autocommit connection where the dialect can tell
        # without a round trip that it is one (PyMySQL would send a ROLLBACK each time).
        detect = type(self.dialect).detect_autocommit_setting
        if detect is not DefaultDialect.detect_autocommit_setting:
            options["skip_autocommit_rollback"] = True
        return options

    def standalone_read_options(self) -> dict[str, Any]:
        """Connection execution options for a read made outside any transaction (a chunk
        step's page read): where the driver can switch to autocommit without a round trip, the
        read then costs one (no ``BEGIN``, no ``ROLLBACK``). Default: none."""
        return {}

    def update_step_and_context(
        self, step_update: Update, context_update: Update, context_values: Mapping[str, Any]
    ) -> Update | None:
        """One statement doing both of a step's per-chunk writes, where the database can: it
        changes both rows or neither, so a row count of 0 says it was refused. ``step_update``
        is the guarded UPDATE of the step execution row; ``context_update`` the UPDATE of its
        context row (the two share their bind parameters: ``b_id`` names the step execution in
        both) and ``context_values`` its SET clause. With :attr:`supports_writable_cte` the
        context update runs in a ``WITH`` and the step's row is updated only if it did (1
        row); with :attr:`supports_multi_table_update` one UPDATE joins both rows (2 rows
        matched with ``CLIENT_FOUND_ROWS``, which SQLAlchemy's MySQL drivers set; 1 or 2
        changed without it, as the context may be unchanged). None: two statements."""
        se, sc = schema.step_execution, schema.step_execution_context
        if self.supports_writable_cte:
            written = context_update.returning(sc.c.step_execution_id).cte("dbc_context")
            return step_update.where(
                se.c.step_execution_id.in_(select(written.c.step_execution_id))
            )
        if self.supports_multi_table_update:
            return step_update.where(sc.c.step_execution_id == se.c.step_execution_id).values(
                {sc.c[name]: value for name, value in context_values.items()}
            )
        return None

    def fold_guard(
        self,
        guard: Update,
        step_update: Update,
        context_update: Update | None = None,
        *,
        claim_next: bool = False,
    ) -> Select[Any] | None:
        """Where :attr:`supports_writable_cte`: a step's final write and the guarded UPDATE of
        its owner row (``guard``, e.g. a partition's finish) as one statement, in the lock order
        of the transaction it replaces: the guard's row first; then the context row (when
        ``context_update`` is given) and the step execution row, each written only if the one
        before changed. It answers one row: ``guarded`` (rows the guard changed: 1 or 0) and
        ``written`` (step execution rows written: 1, or 0 when the guard refused or the version
        was stale). The three share their bind parameters (``b_id`` names the step execution).
        With ``claim_next``, the same statement then claims one more partition for the node
        (see :meth:`_claim_after`), and the row carries what it won. None: the guard and the
        write are statements of their own."""
        if not self.supports_writable_cte:
            return None
        se, sc = schema.step_execution, schema.step_execution_context
        held_rows = guard.returning(literal_column("1").label("dbc_held")).cte("dbc_guard")
        held = exists(select(held_rows.c.dbc_held))
        if context_update is None:
            last = step_update.where(held)
        else:
            context = context_update.where(held).returning(sc.c.step_execution_id)
            written_context = context.cte("dbc_context")
            last = step_update.where(
                se.c.step_execution_id.in_(select(written_context.c.step_execution_id))
            )
        written = last.returning(se.c.step_execution_id).cte("dbc_written")
        counts = select(
            select(func.count()).select_from(held_rows).scalar_subquery().label("guarded"),
            select(func.count()).select_from(written).scalar_subquery().label("written"),
        )
        if not claim_next or not self.skip_locked():
            one = counts.subquery("dbc_counts")
            refused = self._refused_column(one)
            if refused is None:
                return counts
            return select(one.c.guarded, one.c.written, refused)
        return self._claim_after(counts, written)

    def refusal(self, guarded: Any, written: Any) -> ColumnElement[Any] | None:
        """An expression over a folded final write's two counts (see :meth:`fold_guard`) that
        raises an error, failing the statement and so its transaction, unless both are 1 (the
        guard changed its row and the step execution was written); :meth:`refusal_of` reads
        the counts back from that error. With it, the statement can be sent with its
        ``COMMIT`` in one round trip (``Prebuilt.one_committing``): a refused guard then fails
        the statement, and the ``COMMIT`` behind it is not run. None: the database has no such
        expression (the caller reads the counts and rolls back)."""
        return None

    def refusal_of(self, error: BaseException) -> tuple[int, int] | None:
        """The ``(guarded, written)`` counts of a folded final write whose :meth:`refusal`
        raised ``error``; None for any other error."""
        return None

    def session_of(self, dbapi_connection: Any) -> Any | None:
        """What identifies a driver connection's session on the server, read without a round
        trip, for :meth:`end_session` after its ``COMMIT`` went unanswered (the outcome is read
        only once that session is gone: ``batch.transactions.Settling``). None: unknown."""
        return None

    def end_session(self, session: Any) -> Select[Any] | None:
        """A statement (run from another session) that ends ``session``; None: none."""
        return None

    def session_alive(self, session: Any) -> Select[Any] | None:
        """A statement that returns a row while ``session`` still exists; None: none."""
        return None

    def _refused_column(self, counts: Any) -> Any | None:
        """:meth:`refusal` over the counts subquery ``counts``, labelled ``dbc_r`` (NULL when
        it does not raise); None where the database has none."""
        refused = self.refusal(counts.c.guarded, counts.c.written)
        return None if refused is None else refused.label("dbc_r")

    def _claim_after(self, counts: Select[Any], written: Any) -> Select[Any]:
        """A partition's final write that also claims the node's next partition (parameters
        ``n_id``, ``n_node``, ``n_started_at``), only once that write changed its rows: the
        partition that ends hands its slot to the next without a claim of its own (one
        statement, one COMMIT). The claim is :meth:`claim_and_start`'s for one partition, except
        for how it makes sure the node is still registered: it takes the node's row ``FOR KEY
        SHARE SKIP LOCKED`` (after the ending partition's rows) instead of updating it. That
        lock waits for nothing and holds up nothing that only updates the row (the node's other
        slots, its heartbeat, a sweep marking it UNREACHABLE). A removal or a node leaving
        takes the row ``FOR UPDATE`` before it fences the node's claims (:meth:`lock_removing`,
        :meth:`lock_node`): it waits for this COMMIT and then fences what this claimed too, and
        once it holds the row this claims nothing. The row answers ``p_id`` NULL when nothing
        was won. The tables go by short aliases, which keeps the statement short enough for the
        driver to cache its parsing (psycopg: 4,096 characters)."""
        pt, se = partitions.alias("p"), schema.step_execution.alias("s")
        nd, sc = nodes.alias("n"), schema.step_execution_context.alias("c")
        jc = job_coordination.alias("j")
        node = bindparam("n_node")
        registered = (
            select(nd.c.node_id)
            .where(nd.c.node_id == node, exists(select(written.c.step_execution_id)))
            .with_for_update(read=True, key_share=True, skip_locked=True)
            .cte("dbc_nn")
        )
        locked = (
            self.lock_claimable([bindparam("n_id", type_=pt.c.step_execution_id.type)], pt)
            .where(exists(select(registered.c.node_id)))
            .cte("dbc_nl")
        )
        claimed = self._claimed_cte(node, locked, "dbc_nc", pt)
        started = self._started_cte(claimed, bindparam("n_started_at"), "dbc_ns", se)
        won = self._won(claimed, started, jc, sc)
        one = counts.subquery("dbc_counts")
        refused = self._refused_column(one)
        return select(
            one.c.guarded,
            one.c.written,
            *(() if refused is None else (refused,)),
            *self._claimed_columns(claimed, started, jc, sc),
        ).select_from(one.outerjoin(won, true()))

    def insert_unless_present(self, table: Table, key: Sequence[str]) -> Insert | None:
        """An INSERT into ``table`` (values to be given) that inserts nothing, without an error
        and without ending the transaction, where a row with the same ``key`` columns (a unique
        key) exists or is being committed (it waits for that one's outcome, as a plain INSERT's
        unique check does), usable as a CTE. A first launch then creates its instance without
        reading first whether it exists. None: the database has no such statement (the caller
        reads first)."""
        return None

    def insert_child_row(
        self, parent: Insert, parent_key: Any, child: Table, child_columns: Sequence[str]
    ) -> Select[Any] | None:
        """Where :attr:`supports_writable_cte`: one statement that inserts ``parent`` (one row)
        and the row of ``child`` that belongs to it, whose first column of ``child_columns``
        takes the parent's new ``parent_key`` and the others the bound parameters of their
        names; it returns that key. A step execution and its context in one round trip. None:
        the caller runs the two INSERTs."""
        return self.insert_with_children(parent, parent_key, [(child, child_columns, ())])

    def insert_with_children(
        self,
        parent: Insert,
        parent_key: Any,
        children: Sequence[tuple[Table, Sequence[str], Sequence[str]]],
    ) -> Select[Any] | None:
        """Where :attr:`supports_writable_cte` (and, for array columns,
        :attr:`supports_array_insert`): one statement that inserts ``parent`` (one row) and,
        for each ``(child, columns, arrays)``, the rows of ``child`` that belong to it. Their
        first column of ``columns`` takes the parent's new ``parent_key``, the others the bound
        parameters of their names (the same in every row); each column of ``arrays`` takes one
        element of the array parameter ``a_<column>``, a row per element (no row for empty
        arrays; without arrays, one row). It returns that key. A job execution, its context and
        its parameters in one round trip. None: the caller runs the INSERTs."""
        return None

    def insert_from_arrays(
        self,
        table: Table,
        columns: Sequence[str],
        values: Mapping[str, Any] | None = None,
    ) -> Insert | None:
        """Where :attr:`supports_array_insert`: an INSERT of many rows whose every column in
        ``columns`` is one array parameter named ``a_<column>`` (the rows pass as a list per
        column), plus ``values``, expressions the same for every row. One short statement for
        any number of rows: no text of thousands of placeholders for the driver to parse on
        each execution, as an executemany folded into multi-row VALUES has. None: the caller
        runs an executemany."""
        return None

    def in_transaction(self, dbapi_connection: Any) -> bool | None:
        """Whether the driver connection has a transaction open, where the driver knows it
        without a round trip (None: unknown). A pooled connection coming back with none open is
        not rolled back again (see ``make_engine``)."""
        return None

    def private_to_engine(self, engine: Engine) -> bool:
        """The engine's database lives only inside that engine (an in-memory database): a second
        engine would see another, empty database."""
        return False

    #: The :class:`SessionLimits` of the engine this provider serves (set by ``make_engine``).
    limits: SessionLimits | None = None

    def session_engine_options(self, limits: SessionLimits) -> dict[str, Any]:
        """``create_engine`` arguments (``connect_args`` included) that put
        :class:`SessionLimits` on every new session where the driver can do it without a round
        trip of its own. Default: none."""
        return {}

    def bounded(self, stmt: Update | Delete) -> list[Any]:
        """The statements that run ``stmt`` with a bounded lock wait. Most databases bound every
        lock wait of a session (:meth:`session_engine_options`, :meth:`session_statements`), so
        this is ``[stmt]``; a database without such a setting first locks the same rows with a
        bounded wait (Oracle's ``FOR UPDATE WAIT n``). The caller judges the last statement's
        row count."""
        return [stmt]

    def session_statements(self, limits: SessionLimits) -> list[str]:
        """Statements run once on every new session to apply :class:`SessionLimits` where
        :meth:`session_connect_args` cannot. Values are integers computed from settings, never
        user text. Default: none."""
        return []

    def configure_session(self, dbapi_connection: Any, limits: SessionLimits) -> None:
        """Apply :class:`SessionLimits` to a new driver connection: runs
        :meth:`session_statements`; a provider whose driver has a client-side bound (e.g. a call
        timeout) sets it here instead."""
        statements = self.session_statements(limits)
        if not statements:
            return
        cursor = dbapi_connection.cursor()
        try:
            for statement in statements:
                cursor.execute(statement)
        finally:
            cursor.close()

    def needs_session_hook(self, limits: SessionLimits) -> bool:
        """Whether :meth:`configure_session` has anything to do (no connect hook where not)."""
        return bool(self.session_statements(limits)) or (
            type(self).configure_session is not QueryProvider.configure_session
        )

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        """Per-engine set-up (connection pragmas, transaction begin statements). ``autocommit``:
        the engine was made with :meth:`autocommit_engine_options` and must not begin
        transactions of its own."""

    # --- transient errors -----------------------------------------------------------------------

    def is_transient(self, error: BaseException) -> bool:
        """Whether repeating the statement may succeed: deadlock, serialization failure, lock
        timeout, lost connection."""
        if isinstance(error, DBAPIError) and error.connection_invalidated:
            return True
        if isinstance(error, DBAPIError):
            return self._is_transient_driver_error(error.orig)
        return False

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        return False

    def is_read_only(self, error: BaseException) -> bool:
        """Whether the database refused a write because it takes none for now (a read-only
        server, as a primary demoted by a switchover is): no fault of the statement, and gone
        once clients reach the new primary. A worker does not withdraw over it."""
        if isinstance(error, DBAPIError):
            return self._is_read_only_driver_error(error.orig)
        return False

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        return False

    def connect_error_hint(self, error: BaseException) -> str | None:
        """One line naming the fix for a connect failure the user must mend outside dbcluster
        (a missing system driver or package, an untrusted certificate); None for the rest."""
        return None

    # --- DDL ------------------------------------------------------------------------------------

    def ddl_statements(self) -> list[str]:
        """Every CREATE statement for the dbcluster tables, parents first, then the row that
        records the schema's version (without it a node refuses the tables)."""
        out: list[str] = []
        for table in schema.ALL_TABLES:
            out.append(str(CreateTable(table).compile(dialect=self.dialect)).strip())
            for index in sorted(table.indexes, key=lambda i: i.name or ""):
                out.append(str(CreateIndex(index).compile(dialect=self.dialect)).strip())
        out.append(self.literal_sql(self.record_schema_version(schema.SCHEMA_VERSION)))
        return out

    def record_schema_version(self, version: str) -> Insert:
        """The schema version row, stamped by the database clock."""
        return insert(schema.schema_version).values(version_num=version, applied_time=self.now())

    def literal_sql(self, statement: Any) -> str:
        """A statement as SQL text with its values inline, for a script a DBA runs."""
        compiled = statement.compile(dialect=self.dialect, compile_kwargs={"literal_binds": True})
        return str(compiled).strip()

    # --- migrations (``dbcluster migrate``) ------------------------------------------------------

    #: DDL runs inside a transaction and rolls back with it (PostgreSQL, SQLite, SQL Server,
    #: Db2). Where it does not (MySQL, MariaDB and Oracle commit each DDL statement on its own),
    #: a revision cut short stays half done; each migration step checks whether it is already
    #: done, so running ``dbcluster migrate`` again completes it.
    transactional_ddl: ClassVar[bool] = True
    #: Changing a column's type keeps the indexes and keys over it (SQL Server refuses to alter
    #: a column an index or key covers: they are dropped and created again around it).
    alter_type_keeps_indexes: ClassVar[bool] = True

    def quote(self, name: str) -> str:
        return str(self.dialect.identifier_preparer.quote(name))

    def add_column_sql(self, table: str, column_spec: str) -> list[str]:
        """Add a column, given its rendered specification (name, type, default, nullability)."""
        return [f"ALTER TABLE {self.quote(table)} ADD COLUMN {column_spec}"]

    def alter_column_type_sql(
        self, table: str, column: str, old_type: str, new_type: str, nullable: bool
    ) -> list[str]:
        """Change a column's type from ``old_type`` to ``new_type`` (both rendered by this
        dialect), keeping its nullability and its data. SQL's own spelling by default."""
        return [
            f"ALTER TABLE {self.quote(table)} ALTER COLUMN {self.quote(column)} "
            f"SET DATA TYPE {new_type}"
        ]

    def count_live_nodes(self, within_ms: int) -> Select[Any]:
        """ACTIVE nodes that heartbeated in the last ``within_ms`` (by the database clock):
        ``migrate`` refuses to run under a live cluster. Reads only 0.1.0's columns."""
        return (
            select(func.count())
            .select_from(nodes)
            .where(
                nodes.c.status == NODE_ACTIVE,
                ~self.older_than(nodes.c.last_heartbeat, within_ms),
            )
        )

    def rename_column_sql(self, table: str, old: str, new: str) -> list[str]:
        """Rename a column (``old`` and ``new`` as this dialect spells them, quoted where it
        quotes them). SQL's own spelling by default."""
        return [f"ALTER TABLE {self.quote(table)} RENAME COLUMN {old} TO {new}"]

    def unless_present(
        self, kind: str, table: str, name: str | None, statements: list[str]
    ) -> list[str]:
        """``statements``, which create the ``kind`` ("table", "index" or "column") ``name`` of
        ``table`` (a table: ``name`` None), as a migration runs them. ``dbcluster migrate``
        looks first and runs them only where the object is missing; where DDL commits on its
        own and a statement can consult the data dictionary (Oracle), each is wrapped so that it
        checks for itself, and a DBA's script cut short runs again cleanly. Default: as
        given."""
        return statements

    def after_alter_sql(self, table: str) -> list[str]:
        """Statements to run once a revision that retyped columns of ``table`` has committed,
        each in a transaction of its own (Db2: reorganize the table). Default: none."""
        return []

    def drop_primary_key_sql(self, table: str, name: str | None) -> list[str]:
        """Drop a table's primary key (``name``: None when the database named it); needed only
        where :attr:`alter_type_keeps_indexes` is false."""
        raise NotImplementedError(f"{self.name} does not drop primary keys for migrations")

    #: A script for a DBA commits its own writes: the database's tools do not commit when they
    #: exit (Oracle's SQLcl and SQL Developer), so the version row would be lost.
    scripts_commit: ClassVar[bool] = False

    def script_line(self, sql: str) -> str:
        """One statement as a script for this database's own tools ends it."""
        return f"{sql};"

    def ddl_script(self) -> str:
        version = ".".join(str(p) for p in getattr(self.dialect, "server_version_info", ()) or ())
        target = f"{self.name} {version} and later" if version else self.name
        header = f"-- dbcluster schema for {target} (generated by `dbcluster ddl`)\n"
        statements = [*self.ddl_statements(), *(["COMMIT"] if self.scripts_commit else [])]
        return header + "".join(f"\n{self.script_line(stmt)}\n" for stmt in statements)

    def create_tables(self, engine: Engine) -> list[str]:
        """Create the tables and indexes that are missing (see :meth:`create_schema`) and,
        where this call created the version table, record the schema's version in it, in a
        transaction of its own once the DDL has committed (as ``metadata.create_all`` does, in
        one). Returns the names of the tables this call created."""
        created = self.create_schema(engine)[0]
        if schema.schema_version.name in created:
            # Only the process whose CREATE made the table gets here: one row.
            with engine.begin() as conn:
                conn.execute(self.record_schema_version(schema.SCHEMA_VERSION))
        return created

    def create_schema(self, engine: Engine) -> tuple[list[str], list[str]]:
        """Create the missing tables, then any index missing from a table that exists: DDL is
        not transactional on Oracle and MySQL, so a crash between a CREATE TABLE and its CREATE
        INDEX leaves the table without the index. Safe when several processes run it at once.

        DDL only, each statement in a transaction of its own: no row is written here. A
        database may refuse DML on a table created in the still-open transaction (Firebird:
        "Table unknown"), so the version row is recorded afterwards, in a transaction of its
        own (``migrations.record_if_unrecorded``). The CREATE statements run as DDL constructs,
        not ``Table.create``, whose ``after_create`` event (``schema.py`` records the version
        there for ``metadata.create_all``) would insert it inside the DDL's transaction.

        Returns the names of the tables and of the indexes this call created.
        """
        tables = [
            table.name
            for table in schema.ALL_TABLES
            if self._create_once(
                engine,
                lambda conn, table=table: conn.execute(CreateTable(table)),
                lambda table=table: self._table_exists(engine, table.name),
            )
        ]
        indexes = [
            index.name
            for table in schema.ALL_TABLES
            for index in sorted(table.indexes, key=lambda i: i.name or "")
            if index.name
            and self._create_once(
                engine,
                lambda conn, index=index: conn.execute(CreateIndex(index)),
                lambda table=table, index=index: self._index_exists(engine, table.name, index.name),
            )
        ]
        return tables, indexes

    def _create_once(
        self, engine: Engine, create: Callable[[Connection], None], exists: Callable[[], bool]
    ) -> bool:
        """Run ``create`` unless ``exists``; True when this call created the object."""
        if exists():
            return False
        for retry in range(10):
            try:
                with engine.begin() as conn:
                    create(conn)
                return True
            except DBAPIError as exc:
                # Another process created it between our check and our CREATE.
                if exists():
                    return False
                # Or holds the lock while it does (SQLite: "database is locked").
                if retry < 9 and self.is_transient(exc):
                    time.sleep(0.05 * (retry + 1))
                    continue
                raise
        return False

    @staticmethod
    def _table_exists(engine: Engine, name: str) -> bool:
        from sqlalchemy import inspect

        return inspect(engine).has_table(name)

    @staticmethod
    def _index_exists(engine: Engine, table: str, name: str | None) -> bool:
        from sqlalchemy import inspect

        found = {str(i["name"]).lower() for i in inspect(engine).get_indexes(table) if i["name"]}
        return str(name).lower() in found

    def create_database_sql(self, name: str) -> str:
        """DDL for a scratch database; ``name`` is generated, never user input."""
        return f"CREATE DATABASE {name}"

    def drop_database_sql(self, name: str) -> str:
        return f"DROP DATABASE {name}"

    def create_scratch_database(self, admin: Engine, name: str) -> URL:
        """Create an empty database called ``name`` where ``admin`` (an AUTOCOMMIT engine on the
        URL the user gave) points, and return its URL; the test backends and the conformance
        suite work in it and drop it at the end (only when :attr:`can_create_database`).

        The default runs :meth:`create_database_sql` on the server. A database that is a file
        made by a driver call, not by ``CREATE DATABASE``, overrides this pair of hooks."""
        from sqlalchemy import text

        with admin.connect() as conn:
            conn.execute(text(self.create_database_sql(name)))
        return admin.url.set(database=name)

    def drop_scratch_database(self, admin: Engine, url: URL) -> None:
        """Drop a database :meth:`create_scratch_database` made (its URL)."""
        from sqlalchemy import text

        with admin.connect() as conn:
            conn.execute(text(self.drop_database_sql(str(url.database))))

    # --- node registry --------------------------------------------------------------------------

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        """Insert the node ACTIVE, or refresh it if the id is already there."""
        values = self._node_values(host, capacity)
        refreshed = conn.execute(
            update(nodes).where(nodes.c.node_id == node_id).values(**values)
        ).rowcount
        if refreshed:
            return
        try:
            with conn.begin_nested():
                conn.execute(
                    insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
                )
        except IntegrityError:
            conn.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))

    def _node_values(self, host: str, capacity: int) -> dict[str, Any]:
        return {
            "host": host,
            "capacity": capacity,
            "status": NODE_ACTIVE,
            "last_heartbeat": self.now(),
            "current_load": 0,
        }

    def heartbeat(self, node_id: str, load: int) -> Update:
        """Refresh the heartbeat; changes no row when the node was removed (then it must fence)."""
        return (
            update(nodes)
            .where(nodes.c.node_id == node_id)
            .values(last_heartbeat=self.now(), current_load=load, status=NODE_ACTIVE)
        )

    def set_node_capacity(self, node_id: str, capacity: int) -> Update:
        return update(nodes).where(nodes.c.node_id == node_id).values(capacity=capacity)

    def touch_node(self, node_id: str, load: int) -> Update:
        """The first statement of a claim: the claiming node is still registered (exactly one
        row changes) and stays so until the claim commits, because the row is now locked and a
        sweeper's removal of it waits (or was seen)."""
        return update(nodes).where(nodes.c.node_id == node_id).values(current_load=load)

    def mark_unreachable(self, threshold_ms: int) -> Update:
        return (
            update(nodes)
            .where(
                nodes.c.status == NODE_ACTIVE,
                self.older_than(nodes.c.last_heartbeat, threshold_ms),
            )
            .values(status=NODE_UNREACHABLE)
        )

    def mark_removing(self, threshold_ms: int) -> Update:
        """Removal, first statement: lock the UNREACHABLE nodes silent past ``threshold_ms`` by
        marking them REMOVING (a state no other transaction ever sees committed)."""
        return (
            update(nodes)
            .where(
                nodes.c.status == NODE_UNREACHABLE,
                self.older_than(nodes.c.last_heartbeat, threshold_ms),
            )
            .values(status=NODE_REMOVING)
        )

    def lock_removing(self) -> Select[Any]:
        """Removal, between :meth:`mark_removing` and :meth:`fence_partitions_of_removing`: the
        REMOVING rows locked ``FOR UPDATE``. Marking them took a lock that a partition's final
        write claiming the next one (``FOR KEY SHARE``: see :meth:`_claim_after`) does not wait
        for, nor it for that; this one waits for such a write to commit, so the fencing UPDATE
        after it (a statement of its own, which sees that commit) moves what it claimed too, and
        a final write that comes later finds the row locked and claims nothing."""
        return self.locked(select(nodes.c.node_id).where(nodes.c.status == NODE_REMOVING))

    def lock_node(self, node_id: Any) -> Select[Any]:
        """A node leaving, before :meth:`fence_claims_of`: its row locked ``FOR UPDATE``, for
        the reason :meth:`lock_removing` gives."""
        return self.locked(select(nodes.c.node_id).where(nodes.c.node_id == node_id))

    def locked(self, stmt: Select[Any], *, skip_locked: bool = False) -> Select[Any]:
        """``stmt``, a read of one table, locking the rows it reads for update until its
        transaction ends; with ``skip_locked`` (only where :meth:`skip_locked`), passing over
        rows another transaction holds instead of waiting for them. SQL's ``FOR UPDATE [SKIP
        LOCKED]`` by default; a database whose dialect says it otherwise overrides this (SQL
        Server: table hints, which SQLAlchemy's ``with_for_update()`` does not render)."""
        return stmt.with_for_update(skip_locked=skip_locked)

    def fence_partitions_of_removing(self) -> Update:
        """Removal, second statement: every partition the removed nodes had CLAIMED moves to its
        next attempt, in the removal's transaction. Its row lock makes the removal wait for a
        chunk transaction of the removed node that holds it, or that transaction sees the new
        attempt and rolls back: a removed node commits nothing more. Unclaimed partitions keep
        their attempt (no claim commits once the node row is gone)."""
        removing = select(nodes.c.node_id).where(nodes.c.status == NODE_REMOVING)
        return (
            update(partitions)
            .where(
                partitions.c.status == PARTITION_CLAIMED,
                partitions.c.assigned_node.in_(removing.scalar_subquery()),
            )
            .values(attempt=partitions.c.attempt + 1, last_updated=self.now())
        )

    def fence_claims_of(self, node_id: str) -> Update:
        """A node leaving the registry of its own accord (a graceful stop): what it still has
        CLAIMED moves to its next attempt, in the transaction that deletes its row (its master
        then moves it under a token this node never held)."""
        return (
            update(partitions)
            .where(partitions.c.status == PARTITION_CLAIMED, partitions.c.assigned_node == node_id)
            .values(attempt=partitions.c.attempt + 1, last_updated=self.now())
        )

    def delete_removing(self) -> Delete:
        """Removal, last statement."""
        return delete(nodes).where(nodes.c.status == NODE_REMOVING)

    def deregister_node(self, node_id: str) -> Delete:
        return delete(nodes).where(nodes.c.node_id == node_id)

    def select_nodes(self, status: str | None = NODE_ACTIVE) -> Select[Any]:
        stmt = select(
            nodes.c.node_id,
            nodes.c.host,
            nodes.c.status,
            nodes.c.current_load,
            nodes.c.capacity,
            nodes.c.created_time,
            nodes.c.last_heartbeat,
        ).order_by(nodes.c.node_id)
        if status is not None:
            stmt = stmt.where(nodes.c.status == status)
        return stmt

    def select_nodes_with_age(self) -> Select[Any]:
        """Every node with the database clock beside it (heartbeat age is computed by the caller
        from two values read from the same clock)."""
        return self.select_nodes(None).add_columns(self.now().label("db_now"))

    # --- partitions -----------------------------------------------------------------------------

    def _placed_values(self) -> dict[str, Any]:
        return {
            "status": PARTITION_PENDING,
            "attempt": 1,
            "created_time": self.now(),
            "last_updated": self.now(),
        }

    def insert_partitions(self) -> Insert:
        """An executemany-able INSERT of PENDING partition rows; ``created_time`` and
        ``last_updated`` come from the database clock."""
        return insert(partitions).values(**self._placed_values())

    def insert_partition_from(self, source: Any, step_execution_id: Any) -> Insert:
        """One PENDING partition row as :meth:`insert_partitions` writes it, in the statement
        that creates its step execution: ``step_execution_id`` an expression of ``source`` (that
        statement's new row; see :func:`insert_from`), the other :data:`PLACED_COLUMNS` bound as
        ``b_<column>``."""
        values: dict[str, Any] = {
            name: bindparam(f"b_{name}") for name in PLACED_COLUMNS if name != "step_execution_id"
        }
        values.update(step_execution_id=step_execution_id, **self._placed_values())
        return insert_from(partitions, values, source)

    def insert_partitions_from_arrays(self) -> Insert | None:
        """:meth:`insert_partitions` as one statement for many rows, their
        :data:`PLACED_COLUMNS` passed as arrays (:meth:`insert_from_arrays`), or None."""
        values = {
            name: value if isinstance(value, ColumnElement) else literal(value)
            for name, value in self._placed_values().items()
        }
        return self.insert_from_arrays(partitions, PLACED_COLUMNS, values)

    def _guarded(
        self, step_execution_id: int, node_id: str, attempt: int, statuses: Iterable[str]
    ) -> ColumnElement[bool]:
        wanted = list(statuses)
        # One status is an equality: an IN list is an "expanding" parameter, which SQLAlchemy
        # renders anew on every execution (the fence runs in every partition transaction).
        status = (
            partitions.c.status == wanted[0]
            if len(wanted) == 1
            else partitions.c.status.in_(wanted)
        )
        return and_(
            partitions.c.step_execution_id == step_execution_id,
            partitions.c.assigned_node == node_id,
            partitions.c.attempt == attempt,
            status,
        )

    def claim_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Update:
        """PENDING -> CLAIMED for this node and attempt. The worker runs the partition only when
        this changed exactly one row."""
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, [PARTITION_PENDING]))
            .values(status=PARTITION_CLAIMED, last_updated=self.now())
        )

    def hold_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Update:
        """The fence of a partition's transaction: changes its row (its progress time) only while
        this node holds this attempt CLAIMED. The worker requires exactly one row; the row lock
        then lasts until its ``COMMIT``, so every transition that takes the partition away (which
        all update this row) is serialized with it."""
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, [PARTITION_CLAIMED]))
            .values(last_updated=self.now())
        )

    def finish_partition(
        self, step_execution_id: int, node_id: str, attempt: int, status: str
    ) -> Update:
        """CLAIMED -> COMPLETED or FAILED, only while this node still holds this attempt."""
        if status not in (PARTITION_COMPLETED, PARTITION_FAILED):
            raise ValueError(f"a partition finishes COMPLETED or FAILED, not {status}")
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, [PARTITION_CLAIMED]))
            .values(status=status, last_updated=self.now())
        )

    def finish_partitions(
        self, node_id: Any, members: Sequence[tuple[Any, Any]], status: str
    ) -> Update:
        """:meth:`finish_partition` of several partitions in one statement (a grouped commit):
        each ``(step_execution_id, attempt)`` of ``members`` CLAIMED by this node. The caller
        requires it to change one row per member."""
        if status not in (PARTITION_COMPLETED, PARTITION_FAILED):
            raise ValueError(f"a partition finishes COMPLETED or FAILED, not {status}")
        pt = partitions
        each = or_(*(and_(pt.c.step_execution_id == i, pt.c.attempt == a) for i, a in members))
        return (
            update(pt)
            .where(pt.c.assigned_node == node_id, pt.c.status == PARTITION_CLAIMED, each)
            .values(status=status, last_updated=self.now())
        )

    def release_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Update:
        """Hand back a claimed partition this node has not started (or stopped while leaving):
        unassigned, next attempt, PENDING. The master places it anywhere (one that never ran,
        transferable or not)."""
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, [PARTITION_CLAIMED]))
            .values(
                status=PARTITION_PENDING,
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                last_updated=self.now(),
            )
        )

    def release_pending_for_node(self, node_id: str) -> Update:
        """Hand back every partition assigned to a leaving node that it has not claimed."""
        return (
            update(partitions)
            .where(
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .values(
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                last_updated=self.now(),
            )
        )

    def reassign_partition(
        self, step_execution_id: int, from_node: str | None, attempt: int, to_node: str
    ) -> Update:
        """Move an orphaned partition (its node removed, or handed back) to a live node, PENDING.

        The attempt is not changed here: whatever took the partition from its last owner moved
        it already (node removal fences a CLAIMED partition; a hand-back does), and an unclaimed
        partition of a removed node can never be claimed by that node again. The row's
        (node, attempt) pair, which every worker write is guarded by, changes all the same."""
        owner = (
            partitions.c.assigned_node.is_(None)
            if from_node is None
            else partitions.c.assigned_node == from_node
        )
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id == step_execution_id,
                owner,
                partitions.c.attempt == attempt,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .values(status=PARTITION_PENDING, assigned_node=to_node, last_updated=self.now())
        )

    def fail_orphaned_partition(
        self, step_execution_id: int, from_node: str | None, attempt: int
    ) -> Update:
        """A non-transferable partition whose node was lost after claiming it: FAILED."""
        owner = (
            partitions.c.assigned_node.is_(None)
            if from_node is None
            else partitions.c.assigned_node == from_node
        )
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id == step_execution_id,
                owner,
                partitions.c.attempt == attempt,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )

    def select_claimable(
        self, node_id: Any, limit: int, steal_after_ms: int | None, unreachable_ms: int
    ) -> Select[Any]:
        """The poll: ids of PENDING partitions ``node_id`` may claim (and, second, each one's
        job execution id), oldest first: its own, and
        (unless ``steal_after_ms`` is None) any other node's that it has not claimed, at once
        when that node has not heartbeaten for ``unreachable_ms`` (or is gone), else once placed
        ``steal_after_ms`` ago. A PENDING partition never ran under its attempt, so whoever
        claims it first runs it, transferable or not; handed-back ones (no node) are left to
        their master."""
        mine = partitions.c.assigned_node == node_id
        claimable: ColumnElement[bool] = mine
        if steal_after_ms is not None:
            owner_alive = exists().where(
                nodes.c.node_id == partitions.c.assigned_node,
                nodes.c.status == NODE_ACTIVE,
                ~self.older_than(nodes.c.last_heartbeat, unreachable_ms),
            )
            claimable = or_(
                mine,
                and_(
                    partitions.c.assigned_node.is_not(None),
                    or_(~owner_alive, self.older_than(partitions.c.last_updated, steal_after_ms)),
                ),
            )
        return (
            select(partitions.c.step_execution_id, partitions.c.job_execution_id)
            .where(partitions.c.status == PARTITION_PENDING, claimable)
            .order_by(partitions.c.step_execution_id)
            .limit(limit)
        )

    def skip_locked(self) -> bool:
        """Whether this server has ``SELECT ... FOR UPDATE SKIP LOCKED`` (see
        :attr:`supports_skip_locked`; a subclass may judge by server version)."""
        return self.supports_skip_locked

    def lock_claimable(self, step_execution_ids: Any, table: Any = partitions) -> Select[Any]:
        """In a claim's transaction: those of the polled partitions still PENDING, locked where
        the database can skip rows another claimer holds (SKIP LOCKED); elsewhere a plain read,
        and the guarded claim that follows decides. ``table``: the partitions or an alias."""
        p = table.c
        stmt = select(p.step_execution_id).where(
            p.step_execution_id.in_(step_execution_ids),
            p.status == PARTITION_PENDING,
            p.assigned_node.is_not(None),
        )
        if self.skip_locked():
            return self.locked(stmt, skip_locked=True)
        return stmt

    def claim_partitions(self, node_id: Any, step_execution_ids: Any) -> Update:
        """PENDING -> CLAIMED by ``node_id``, for many partitions at once (a stolen one changes
        node and keeps its attempt: it never ran). Which ones it won is read back with
        :meth:`select_claimed` in the same transaction."""
        return self._claim(
            node_id,
            partitions.c.step_execution_id.in_(step_execution_ids),
            partitions.c.status == PARTITION_PENDING,
            # Handed back or put back for a retry: its master places it (after the backoff).
            partitions.c.assigned_node.is_not(None),
        )

    def _claim(self, node_id: Any, *where: ColumnElement[bool], table: Any = partitions) -> Update:
        return (
            update(table)
            .where(*where)
            .values(status=PARTITION_CLAIMED, assigned_node=node_id, last_updated=self.now())
        )

    def start_claimed(self, node_id: Any, step_execution_ids: Any, started_at: Any) -> Update:
        """In a claim's transaction, after :meth:`claim_partitions`: the step executions of the
        partitions it won become STARTED (a retried or resumed one keeps its first start time),
        so the worker writes no start of its own."""
        se = schema.step_execution
        won = exists().where(
            partitions.c.step_execution_id == se.c.step_execution_id,
            partitions.c.assigned_node == node_id,
            partitions.c.status == PARTITION_CLAIMED,
        )
        return self._start(
            se.c.step_execution_id.in_(step_execution_ids), won, started_at=started_at
        )

    @staticmethod
    def _start(*where: ColumnElement[bool], started_at: Any, table: Any = None) -> Update:
        se = schema.step_execution if table is None else table
        return (
            update(se)
            .where(*where)
            .values(
                status=STEP_STARTED,
                exit_code=STEP_EXECUTING,
                exit_message="",
                start_time=func.coalesce(se.c.start_time, started_at),
                last_updated=started_at,
                version=se.c.version + 1,
            )
        )

    def claim_and_start(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any
    ) -> Select[Any] | None:
        """Where the database has writable CTEs and ``SKIP LOCKED``: a whole claim in one
        statement, which commits on its own (one round trip, no ``BEGIN``): :meth:`touch_node`,
        :meth:`lock_claimable`, :meth:`claim_partitions`, :meth:`start_claimed` and
        :meth:`select_claimed`. The locks are taken in the order of the transaction it
        replaces: the node's own row first (the partitions are only looked at once it is
        updated), then the partition rows, then their step executions (the start reads what
        the claim returned); a step execution starts exactly when its partition was claimed
        here. It gives one row per partition won, with the columns of :meth:`select_claimed`
        and ``dbc_node``; one row whose ``p_id`` is NULL when nothing was won; no row when the
        node is no longer registered (nothing was claimed). Lock waits are bounded by the
        session (:meth:`session_engine_options`). None: a transaction of five statements."""
        return self._claim_and_start(node_id, step_execution_ids, started_at, load, False)

    def claim_and_start_reading_jobs(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any
    ) -> Select[Any] | None:
        """:meth:`claim_and_start` whose rows also hold each partition's job execution and its
        parameters (see :meth:`_claimed_job`), where the database can aggregate them into one
        row; None where it cannot, or where a provider has a claim of its own (then the claim
        is that one and the worker reads the job)."""
        if type(self).claim_and_start is not QueryProvider.claim_and_start:
            return None
        return self._claim_and_start(node_id, step_execution_ids, started_at, load, True)

    def _claim_and_start(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any, with_jobs: bool
    ) -> Select[Any] | None:
        if not (self.supports_writable_cte and self.skip_locked()):
            return None
        touched = self.touch_node(node_id, load).returning(nodes.c.node_id).cte("dbc_touched")
        locked = (
            self.lock_claimable(step_execution_ids)
            .where(exists(select(touched.c.node_id)))
            .cte("dbc_locked")
        )
        # By key alone: the rows ``locked`` returned are PENDING and assigned, and locked by
        # this statement until it commits. Repeating the status test here would let a planner
        # that believes few rows PENDING (statistics from before a placement) scan every
        # PENDING partition for each claim instead of looking up the ones it locked.
        claimed = self._claimed_cte(node_id, locked, "dbc_claimed")
        started = self._started_cte(claimed, started_at, "dbc_started")
        # A join tree, not a subquery: the columns are named once, which keeps the statement
        # short enough for the driver to cache its parsing (psycopg: 4,096 characters).
        won = self._won(claimed, started)
        job_columns: list[Any] = []
        if with_jobs:
            job_columns, won = self._claimed_job(claimed, won)
            if not job_columns:
                return None
        return (
            select(
                touched.c.node_id.label("dbc_node"),
                *self._claimed_columns(claimed, started),
                *job_columns,
            )
            .select_from(touched.outerjoin(won, true()))
            .order_by(claimed.c.step_execution_id)
        )

    def _claimed_job(self, claimed: Any, won: Any) -> tuple[list[Any], Any]:
        """The columns of the job execution each claimed partition belongs to, each named
        ``CLAIMED_JOB_PREFIX`` + the name a job execution's read gives it, with its parameters
        as one array per parameter column in name order; and ``won`` joined to what they come
        from (outer joins only: a partition won is read back whatever its job's rows say). None
        of them where the database cannot aggregate the parameters into one row: the worker
        then reads the job."""
        je, ji = schema.job_execution.alias("je"), schema.job_instance.alias("ji")
        jc, jp = schema.job_execution_context.alias("jc"), schema.job_execution_params.alias("jp")
        arrays = self.aggregate_parameters(jp, jp.c.parameter_name)
        if arrays is None:
            return [], won
        prefix = CLAIMED_JOB_PREFIX
        # Short aliases keep the statement short for the driver to parse.
        params = (
            select(
                *(
                    array.label(prefix + name)
                    for name, array in zip(schema.PARAMETER_COLUMNS, arrays, strict=True)
                )
            )
            .where(jp.c.job_execution_id == claimed.c.job_execution_id)
            .lateral("jq")
        )
        columns = [
            *(column.label(prefix + column.name) for column in je.c),
            ji.c.job_name.label(prefix + "job_name"),
            ji.c.job_key.label(prefix + "job_key"),
            ji.c.version.label(prefix + "instance_version"),
            jc.c.short_context.label(prefix + "short_context"),
            jc.c.serialized_context.label(prefix + "serialized_context"),
            *params.c,
        ]
        joined = (
            won.outerjoin(je, je.c.job_execution_id == claimed.c.job_execution_id)
            .outerjoin(ji, ji.c.job_instance_id == je.c.job_instance_id)
            .outerjoin(jc, jc.c.job_execution_id == je.c.job_execution_id)
            .outerjoin(params, true())
        )
        return columns, joined

    def aggregate_parameters(self, params: Any, order_by: Any) -> list[Any] | None:
        """Aggregates of the ``params`` alias (of the job parameters table) over the rows of one
        job execution: one per parameter column (``schema.PARAMETER_COLUMNS``), each an array
        of that column's values in ``order_by``'s order, which the driver returns as a list of
        Python values (no result processor); None where the database has none (PostgreSQL:
        ``array_agg``)."""
        return None

    def _claimed_cte(self, node_id: Any, locked: Any, name: str, table: Any = partitions) -> Any:
        """A claim's update of the partitions ``locked`` (a CTE of their ids) locked, by key
        alone, returning what the executor needs of each."""
        p = table.c
        return (
            self._claim(
                node_id, p.step_execution_id.in_(select(locked.c.step_execution_id)), table=table
            )
            .returning(
                p.step_execution_id,
                p.master_step_execution_id,
                p.job_execution_id,
                p.partition_name,
                p.attempt,
                p.max_attempts,
                p.transferable,
            )
            .cte(name)
        )

    def _started_cte(self, claimed: Any, started_at: Any, name: str, table: Any = None) -> Any:
        """The start of the step executions of what ``claimed`` won, returning their rows."""
        se = schema.step_execution if table is None else table
        return (
            self._start(
                se.c.step_execution_id.in_(select(claimed.c.step_execution_id)),
                started_at=started_at,
                table=table,
            )
            .returning(*se.c)
            .cte(name)
        )

    @staticmethod
    def _won(claimed: Any, started: Any, coordination: Any = None, context: Any = None) -> Any:
        """What a claim reads back, joined: the partitions won, their steps, their worker
        step's name and their contexts."""
        jc = job_coordination if coordination is None else coordination
        sc = schema.step_execution_context if context is None else context
        return (
            claimed.join(started, started.c.step_execution_id == claimed.c.step_execution_id)
            .join(jc, jc.c.job_execution_id == claimed.c.job_execution_id)
            .outerjoin(sc, sc.c.step_execution_id == claimed.c.step_execution_id)
        )

    @staticmethod
    def _claimed_columns(
        claimed: Any, started: Any, coordination: Any = None, context: Any = None
    ) -> list[Any]:
        """What a claim reads back: of the partition (``claimed``: the table, or the rows a
        claim returned), its worker step's name (from ``coordination``), its step execution
        (``started``) and that execution's context (``context``: the table by default)."""
        jc = job_coordination if coordination is None else coordination
        sc = schema.step_execution_context if context is None else context
        return [
            claimed.c.step_execution_id.label("p_id"),
            claimed.c.master_step_execution_id.label("p_master_id"),
            claimed.c.partition_name.label("p_name"),
            claimed.c.attempt.label("p_attempt"),
            claimed.c.max_attempts.label("p_max_attempts"),
            claimed.c.transferable.label("p_transferable"),
            jc.c.worker_step_name.label("p_worker_step_name"),
            *started.c,
            sc.c.short_context,
            sc.c.serialized_context,
        ]

    def select_claimed(self, node_id: Any, step_execution_ids: Any) -> Select[Any]:
        """What the executor needs of the partitions a claim won, in one read: the partition,
        its worker step's name, its step execution and that execution's context."""
        se, sc = schema.step_execution, schema.step_execution_context
        return (
            select(*self._claimed_columns(partitions, se))
            .join(
                job_coordination,
                job_coordination.c.job_execution_id == partitions.c.job_execution_id,
            )
            .join(se, se.c.step_execution_id == partitions.c.step_execution_id)
            .outerjoin(sc, sc.c.step_execution_id == partitions.c.step_execution_id)
            .where(
                partitions.c.step_execution_id.in_(step_execution_ids),
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_CLAIMED,
            )
            .order_by(partitions.c.step_execution_id)
        )

    def select_stale_node(self, unreachable_ms: int, cleanup_ms: int) -> Select[Any]:
        """Whether a sweep has anything to do (an ACTIVE node to mark, an UNREACHABLE one to
        remove): one cheap read, so an idle cluster's sweeps cost one statement."""
        return (
            select(nodes.c.node_id)
            .where(
                or_(
                    and_(
                        nodes.c.status == NODE_ACTIVE,
                        self.older_than(nodes.c.last_heartbeat, unreachable_ms),
                    ),
                    and_(
                        nodes.c.status == NODE_UNREACHABLE,
                        self.older_than(nodes.c.last_heartbeat, cleanup_ms),
                    ),
                )
            )
            .limit(1)
        )

    # --- wake-ups -------------------------------------------------------------------------------

    def wake_channel(self, node_id: str) -> str:
        """The notification channel a node listens on: an identifier derived from its id."""
        import hashlib

        return "dbcluster_" + hashlib.sha1(node_id.encode()).hexdigest()[:24]

    def notify(self, channels: Any, payloads: Any = None) -> Any:
        """One statement that wakes the listeners of every channel in ``channels`` (a parameter
        made by :meth:`notify_parameter`) once its transaction commits (only where
        :attr:`supports_listen_notify`); with ``payloads`` (a parameter of the same kind, one
        text per channel, at most :attr:`notify_payload_max` bytes) each carries its own."""
        raise NotImplementedError(f"{self.name} has no LISTEN/NOTIFY")

    def notify_parameter(self, name: str) -> Any:
        """The bound parameter :meth:`notify` takes its list of channels (or payloads) in."""
        raise NotImplementedError(f"{self.name} has no LISTEN/NOTIFY")

    def notify_from(self, source: Any, channel: Any, payload: Any) -> Select[Any] | None:
        """A read that wakes ``channel`` with ``payload`` (expressions of ``source``, a
        statement's new row) once per row of ``source``, for a statement that places one
        partition as it creates its step execution; None where the database cannot."""
        return None

    def together(self, write: Insert, then: Any) -> Any | None:
        """One statement that runs the INSERT ``write`` and the statement ``then`` (another
        INSERT, or a :meth:`notify`), taking the parameters of both, or None where the database
        cannot (then they are two). Neither may need to see the other's rows: a launch's
        coordination row and its master history row, a placement's partitions and its wake-ups
        (sent at COMMIT) go in one round trip."""
        return None

    def open_listener(self, engine: Engine, channel: str) -> Listener:
        """A connection of its own listening on ``channel`` (only where
        :attr:`supports_listen_notify`)."""
        raise NotImplementedError(f"{self.name} has no LISTEN/NOTIFY")

    def select_pending_for_node(self, node_id: str, limit: int) -> Select[Any]:
        """The poll: this node's PENDING rows with what a claim needs, oldest first."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.job_execution_id,
                partitions.c.master_step_execution_id,
                partitions.c.partition_name,
                partitions.c.attempt,
                partitions.c.max_attempts,
                partitions.c.transferable,
                job_coordination.c.worker_step_name,
            )
            .join(
                job_coordination,
                job_coordination.c.job_execution_id == partitions.c.job_execution_id,
            )
            .where(
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .order_by(partitions.c.step_execution_id)
            .limit(limit)
        )

    def _node_gone(self, node_column: ColumnElement[Any]) -> ColumnElement[bool]:
        """The node is absent from the registry. Orphan detection never depends on the dead
        node's own row still being there."""
        return ~exists().where(nodes.c.node_id == node_column)

    def select_orphaned_partitions(self, master_step_execution_id: int) -> Select[Any]:
        """In-flight partitions of one master step whose node is gone (or that were handed
        back and so have no node)."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.partition_name,
                partitions.c.assigned_node,
                partitions.c.attempt,
                partitions.c.status,
                partitions.c.transferable,
                partitions.c.retried_at,
                self.now().label("db_now"),
            )
            .where(
                partitions.c.master_step_execution_id == master_step_execution_id,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
                or_(
                    partitions.c.assigned_node.is_(None),
                    self._node_gone(partitions.c.assigned_node),
                ),
            )
            .order_by(partitions.c.step_execution_id)
        )

    def retry_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Update:
        """A failed try of a transferable partition, in its final transaction: back to PENDING,
        unassigned, next attempt, stamped with the time (its master places it again after its
        backoff). Guarded like :meth:`finish_partition`."""
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, [PARTITION_CLAIMED]))
            .values(
                status=PARTITION_PENDING,
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                retried_at=self.now(),
                last_updated=self.now(),
            )
        )

    def select_stalled(self, master_step_execution_id: int, timeout_ms: int) -> Select[Any]:
        """CLAIMED partitions of one master step whose progress (claim, or last committed chunk)
        is older than ``timeout_ms``."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.partition_name,
                partitions.c.assigned_node,
                partitions.c.attempt,
                partitions.c.max_attempts,
                partitions.c.transferable,
            )
            .where(
                partitions.c.master_step_execution_id == master_step_execution_id,
                partitions.c.status == PARTITION_CLAIMED,
                self.older_than(partitions.c.last_updated, timeout_ms),
            )
            .order_by(partitions.c.step_execution_id)
        )

    def time_out_partition(
        self,
        step_execution_id: int,
        node_id: str,
        attempt: int,
        timeout_ms: int,
        *,
        retry: bool,
    ) -> Update:
        """Fence a stalled partition: its attempt moves (its node commits nothing more for it);
        then PENDING and unassigned to be tried again, or FAILED. Guarded on its holder and on
        its progress still being older than the timeout (a chunk that just committed wins)."""
        values: dict[str, Any] = {"attempt": partitions.c.attempt + 1, "last_updated": self.now()}
        if retry:
            values.update(status=PARTITION_PENDING, assigned_node=None, retried_at=self.now())
        else:
            values.update(status=PARTITION_FAILED)
        return (
            update(partitions)
            .where(
                self._guarded(step_execution_id, node_id, attempt, [PARTITION_CLAIMED]),
                self.older_than(partitions.c.last_updated, timeout_ms),
            )
            .values(**values)
        )

    def insert_master(
        self,
        job_execution_id: Any,
        epoch: int,
        master_node: Any,
        reason: str,
        *,
        source: Any | None = None,
    ) -> Insert:
        """One row of a job execution's master history (``source``: see
        :func:`insert_from`)."""
        return insert_from(
            job_masters,
            {
                "job_execution_id": job_execution_id,
                "master_epoch": epoch,
                "master_node": master_node,
                "reason": reason,
                "since": self.now(),
            },
            source,
        )

    def select_partition_counts(self, master_step_execution_id: int) -> Select[Any]:
        from sqlalchemy import func

        return (
            select(partitions.c.status, func.count().label("n"))
            .where(partitions.c.master_step_execution_id == master_step_execution_id)
            .group_by(partitions.c.status)
        )

    def select_in_flight_count(self, job_execution_id: int) -> Select[Any]:
        """How many partitions of a job execution are PENDING or CLAIMED."""
        from sqlalchemy import func

        return select(func.count()).where(
            partitions.c.job_execution_id == job_execution_id,
            partitions.c.status.in_(PARTITION_IN_FLIGHT),
        )

    def select_partitions(self, master_step_execution_id: int) -> Select[Any]:
        return (
            select(partitions)
            .where(partitions.c.master_step_execution_id == master_step_execution_id)
            .order_by(partitions.c.step_execution_id)
        )

    # --- job coordination -----------------------------------------------------------------------

    def insert_coordination(
        self,
        job_execution_id: Any,
        master_node: Any,
        status: str = COORD_CREATED,
        master_step_execution_id: Any = 0,
        worker_step_name: Any = "-",
        *,
        source: Any | None = None,
    ) -> Insert:
        """The row that makes a node the master of an execution, epoch 1. Written in the
        transaction that creates the execution, so no execution exists without an owner.
        ``source``: see :func:`insert_from`."""
        return insert_from(
            job_coordination,
            {
                "job_execution_id": job_execution_id,
                "master_node": master_node,
                "master_epoch": 1,
                "master_step_execution_id": master_step_execution_id,
                "worker_step_name": worker_step_name,
                "status": status,
                "created_time": self.now(),
                "updated_time": self.now(),
            },
            source,
        )

    def _mastership(
        self, job_execution_id: int, master_node: str, epoch: int, statuses: Iterable[str]
    ) -> ColumnElement[bool]:
        return and_(
            job_coordination.c.job_execution_id == job_execution_id,
            job_coordination.c.master_node == master_node,
            job_coordination.c.master_epoch == epoch,
            job_coordination.c.status.in_(list(statuses)),
        )

    def hold_mastership(
        self,
        job_execution_id: int,
        master_node: str,
        epoch: int,
        statuses: Sequence[str] = COORD_MASTERED,
    ) -> Update:
        """The fence of a master's transaction (a job write, a step it runs itself, a placement,
        a reassignment): changes the coordination row only while this node is still the master
        of this epoch and the job is in flight. The master requires exactly one row; the lock
        then lasts until its ``COMMIT``, so a takeover or an abandonment (which update this row)
        is serialized with it."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, statuses))
            .values(updated_time=self.now())
        )

    def place_coordination(
        self,
        job_execution_id: int,
        master_node: str,
        epoch: int,
        master_step_execution_id: int,
        worker_step_name: str,
    ) -> Update:
        """Point the master's coordination row at the partitioned step it is placing (STARTED),
        under the same guard as :meth:`hold_mastership`."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, COORD_MASTERED))
            .values(
                master_step_execution_id=master_step_execution_id,
                worker_step_name=worker_step_name,
                status=COORD_STARTED,
                updated_time=self.now(),
            )
        )

    def finish_mastership(
        self, job_execution_id: int, master_node: str, epoch: int, status: str
    ) -> Update:
        """Close the coordination row (COMPLETED or FAILED) in the job's final transaction, under
        the mastership guard."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, COORD_MASTERED))
            .values(status=status, updated_time=self.now())
        )

    def set_coordination_status(
        self,
        job_execution_id: int,
        master_node: str,
        epoch: int,
        from_statuses: Sequence[str],
        to_status: str,
    ) -> Update:
        """Guarded on the master (and epoch) that owns the row, so one that lost it changes
        nothing."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, from_statuses))
            .values(status=to_status, updated_time=self.now())
        )

    def fail_job_partitions(
        self, job_execution_id: int, step_execution_ids: Sequence[int] | None = None
    ) -> Update:
        """Every in-flight partition of a job execution (or those of ``step_execution_ids``):
        FAILED (its master was lost). A worker still running one then finds its fence broken
        and commits nothing more."""
        where = [
            partitions.c.job_execution_id == job_execution_id,
            partitions.c.status.in_(PARTITION_IN_FLIGHT),
        ]
        if step_execution_ids is not None:
            where.append(partitions.c.step_execution_id.in_(list(step_execution_ids)))
        return (
            update(partitions)
            .where(*where)
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )

    def select_in_flight_partition_ids(self, job_execution_id: int) -> Select[Any]:
        """The ids of a job execution's PENDING and CLAIMED partitions."""
        return (
            select(partitions.c.step_execution_id)
            .where(
                partitions.c.job_execution_id == job_execution_id,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .order_by(partitions.c.step_execution_id)
        )

    def select_stranded_masters(self) -> Select[Any]:
        """Coordination rows in flight whose master node is gone from the registry."""
        return self._select_coordination(
            job_coordination.c.status.in_(COORD_IN_FLIGHT),
            self._node_gone(job_coordination.c.master_node),
        )

    def select_recovering_owned_by(self, node_id: str) -> Select[Any]:
        """Recoveries this node claimed but did not finish (it is alive, so no one else will)."""
        return self._select_coordination(
            job_coordination.c.status == COORD_RECOVERING,
            job_coordination.c.master_node == node_id,
        )

    @staticmethod
    def _select_coordination(*where: ColumnElement[bool]) -> Select[Any]:
        return (
            select(
                job_coordination.c.job_execution_id,
                job_coordination.c.master_node,
                job_coordination.c.master_epoch,
                job_coordination.c.master_step_execution_id,
                job_coordination.c.status,
            )
            .where(*where)
            .order_by(job_coordination.c.job_execution_id)
        )

    def claim_stranded_master(
        self, job_execution_id: int, lost_master: str, epoch: int, status: str, new_owner: str
    ) -> Update:
        """Exactly one survivor wins: the row still names the lost master, epoch and status
        read. The winner owns it RECOVERING under the next epoch, so anything the lost master
        still tries under its own epoch changes nothing."""
        return (
            update(job_coordination)
            .where(
                job_coordination.c.job_execution_id == job_execution_id,
                job_coordination.c.master_node == lost_master,
                job_coordination.c.master_epoch == epoch,
                job_coordination.c.status == status,
            )
            .values(
                status=COORD_RECOVERING,
                master_node=new_owner,
                master_epoch=job_coordination.c.master_epoch + 1,
                updated_time=self.now(),
            )
        )

    # --- stopping a job (dbcluster.cluster.stopping) -------------------------------------------

    def request_stop(self, job_execution_id: int, now: datetime) -> Update:
        """The durable stop request: a running job execution becomes STOPPING (from STARTING or
        STARTED only; the caller judges a row count of 0). Its version is left alone: the
        request is a flag every owner of the row honours, not a write that fences them (the
        master's own writes keep STOPPING, see the job repository)."""
        je = schema.job_execution
        return (
            update(je)
            .where(
                je.c.job_execution_id == job_execution_id,
                je.c.status.in_((JOB_STARTING, JOB_STARTED)),
            )
            .values(status=JOB_STOPPING, last_updated=now)
        )

    def select_stopping(self) -> Select[Any]:
        """Which of the job executions in the expanding parameter ``ids`` are STOPPING (a
        node's periodic check for the jobs it runs partitions of or masters)."""
        je = schema.job_execution
        return select(je.c.job_execution_id).where(
            je.c.job_execution_id.in_(bindparam("ids", expanding=True)),
            je.c.status == JOB_STOPPING,
        )

    def select_pending_partition_ids(self, master_step_execution_id: int) -> Select[Any]:
        """The ids of a partitioned step's partitions no node has claimed."""
        return (
            select(partitions.c.step_execution_id)
            .where(
                partitions.c.master_step_execution_id == master_step_execution_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .order_by(partitions.c.step_execution_id)
        )

    def select_partition_ids_in(
        self, step_execution_ids: Sequence[int], status: str
    ) -> Select[Any]:
        """Which of these partitions have ``status``."""
        return select(partitions.c.step_execution_id).where(
            partitions.c.step_execution_id.in_(list(step_execution_ids)),
            partitions.c.status == status,
        )

    def stop_pending_partitions(self, step_execution_ids: Sequence[int]) -> Update:
        """Partitions of a stopping job that were never claimed end (FAILED, their step
        executions STOPPED in the same transaction): a claim racing this finds them gone."""
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id.in_(list(step_execution_ids)),
                partitions.c.status == PARTITION_PENDING,
            )
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )

    # --- launch requests and schedules -----------------------------------------------------------

    def insert_launch_request(self) -> Insert:
        """A PENDING launch request (bound ``job_name``, ``parameters``, ``next_run``)."""
        return insert(launch_requests).values(
            job_name=bindparam("b_job"),
            parameters=bindparam("b_params"),
            next_run=bindparam("b_next"),
            status=LAUNCH_PENDING,
            created_time=self.now(),
        )

    def select_pending_launches(self, job_names: Any, limit: int) -> Select[Any]:
        """The accepting node's poll: ids of PENDING requests for jobs it knows, oldest first."""
        return (
            select(launch_requests.c.request_id)
            .where(
                launch_requests.c.status == LAUNCH_PENDING,
                launch_requests.c.job_name.in_(job_names),
            )
            .order_by(launch_requests.c.request_id)
            .limit(limit)
        )

    def lock_pending_launches(self, request_ids: Any) -> Select[Any]:
        """In a claim's transaction: the polled requests still PENDING, locked where the database
        can skip rows another claimer holds (else a plain read; the guarded claim decides)."""
        stmt = select(launch_requests.c.request_id).where(
            launch_requests.c.request_id.in_(request_ids),
            launch_requests.c.status == LAUNCH_PENDING,
        )
        if self.skip_locked():
            return self.locked(stmt, skip_locked=True)
        return stmt

    def claim_launches(self, node_id: Any, request_ids: Any) -> Update:
        """PENDING -> CLAIMED by ``node_id``: a request changes state once, so one node wins it."""
        return (
            update(launch_requests)
            .where(
                launch_requests.c.request_id.in_(request_ids),
                launch_requests.c.status == LAUNCH_PENDING,
            )
            .values(status=LAUNCH_CLAIMED, claimed_by=node_id, claimed_time=self.now())
        )

    def select_claimed_launches(self, node_id: Any, request_ids: Any) -> Select[Any]:
        """What a claim won (read back in its transaction)."""
        return (
            select(
                launch_requests.c.request_id,
                launch_requests.c.job_name,
                launch_requests.c.parameters,
                launch_requests.c.next_run,
            )
            .where(
                launch_requests.c.request_id.in_(request_ids),
                launch_requests.c.claimed_by == node_id,
                launch_requests.c.status == LAUNCH_CLAIMED,
            )
            .order_by(launch_requests.c.request_id)
        )

    def end_launch(self, request_id: Any, node_id: Any, status: str) -> Update:
        """CLAIMED by ``node_id`` -> LAUNCHED (bound ``b_execution``, in the execution's creating
        transaction) or FAILED (bound ``b_error``); no row changes when the claim was lost."""
        values: dict[str, Any] = {"status": status}
        if status == LAUNCH_LAUNCHED:
            values["job_execution_id"] = bindparam("b_execution")
        else:
            values["error_message"] = bindparam("b_error")
        return (
            update(launch_requests)
            .where(
                launch_requests.c.request_id == request_id,
                launch_requests.c.claimed_by == node_id,
                launch_requests.c.status == LAUNCH_CLAIMED,
            )
            .values(**values)
        )

    def release_lost_launches(self) -> Update:
        """CLAIMED requests whose node is gone from the registry go back to PENDING: their claimer
        died before creating the execution (creating it marks the request LAUNCHED)."""
        return (
            update(launch_requests)
            .where(
                launch_requests.c.status == LAUNCH_CLAIMED,
                self._node_gone(launch_requests.c.claimed_by),
            )
            .values(status=LAUNCH_PENDING, claimed_by=None, claimed_time=None)
        )

    def select_lost_launch(self) -> Select[Any]:
        """Whether any request is CLAIMED by a node gone from the registry (one cheap read)."""
        return (
            select(launch_requests.c.request_id)
            .where(
                launch_requests.c.status == LAUNCH_CLAIMED,
                self._node_gone(launch_requests.c.claimed_by),
            )
            .limit(1)
        )

    def select_launch_request(self, request_id: Any) -> Select[Any]:
        return select(launch_requests).where(launch_requests.c.request_id == request_id)

    def insert_schedule_fire(self) -> Insert:
        """A tick's fire (bound ``b_name``, ``b_time``, ``b_request``, ``b_node``): its primary
        key (schedule, tick) lets one insert in the whole cluster succeed."""
        return insert(schedule_fires).values(
            schedule_name=bindparam("b_name"),
            fire_time=bindparam("b_time"),
            request_id=bindparam("b_request"),
            fired_by=bindparam("b_node"),
            fired_at=self.now(),
        )

    def select_last_fire(self, schedule_name: Any) -> Select[Any]:
        """A schedule's latest tick fired: one descent of the primary key (schedule, tick),
        however long its history."""
        return select(func.max(schedule_fires.c.fire_time).label("last")).where(
            schedule_fires.c.schedule_name == schedule_name
        )

    # --- pruning ------------------------------------------------------------------------------
    # Which executions may go is the pruner's rule (:mod:`dbcluster.cluster.maintenance.pruner`);
    # these say how to ask for them and delete them. Every IN list is an expanding parameter
    # (``ids``) the caller fills with at most ``partition_write_batch`` values.

    def prunable_where(
        self, statuses: Sequence[str], age_ms: int, completed: str
    ) -> list[ColumnElement[bool]]:
        """Conditions on ``batch_job_execution`` for an execution that may be deleted: its
        status is one of ``statuses``, it ended more than ``age_ms`` before the database
        clock, no coordination row of it is in flight, and the newest execution of its
        instance is ``completed`` (an instance whose newest execution is anything else may be
        restarted, and a restart reads every earlier execution of the instance)."""
        je = schema.job_execution
        newest = schema.job_execution.alias("prune_newest")
        top = schema.job_execution.alias("prune_top")
        newest_id = (
            select(func.max(top.c.job_execution_id))
            .where(top.c.job_instance_id == newest.c.job_instance_id)
            .correlate(newest)
            .scalar_subquery()
        )
        return [
            je.c.status.in_(list(statuses)),
            self.older_than(je.c.end_time, age_ms),
            ~exists().where(
                job_coordination.c.job_execution_id == je.c.job_execution_id,
                job_coordination.c.status.in_(COORD_IN_FLIGHT),
            ),
            ~exists().where(
                newest.c.job_instance_id == je.c.job_instance_id,
                newest.c.job_execution_id == newest_id,
                newest.c.status != completed,
            ),
        ]

    def select_prunable(
        self, statuses: Sequence[str], age_ms: int, completed: str, keep_last: int
    ) -> Select[Any]:
        """The ids of the executions that may be deleted (:meth:`prunable_where`) that are not
        among the ``keep_last`` newest executions of their job name, oldest first."""
        je = schema.job_execution
        ji = schema.job_instance
        where = self.prunable_where(statuses, age_ms, completed)
        if keep_last <= 0:
            return select(je.c.job_execution_id).where(*where).order_by(je.c.job_execution_id)
        rank = (
            func.row_number()
            .over(partition_by=ji.c.job_name, order_by=je.c.job_execution_id.desc())
            .label("newer")
        )
        ranked = (
            select(je.c.job_execution_id, rank)
            .join(ji, ji.c.job_instance_id == je.c.job_instance_id)
            .subquery("prune_ranked")
        )
        return (
            select(je.c.job_execution_id)
            .join(ranked, ranked.c.job_execution_id == je.c.job_execution_id)
            .where(ranked.c.newer > keep_last, *where)
            .order_by(je.c.job_execution_id)
        )

    def select_prunable_recheck(
        self, statuses: Sequence[str], age_ms: int, completed: str
    ) -> Select[Any]:
        """Of the executions ``ids``, those that may still be deleted (checked again in the
        transaction that deletes them: a launch or a restart may have come since)."""
        je = schema.job_execution
        return select(je.c.job_execution_id).where(
            je.c.job_execution_id.in_(bindparam("ids", expanding=True)),
            *self.prunable_where(statuses, age_ms, completed),
        )

    def select_steps_of(self) -> Select[Any]:
        """The step execution ids of the job executions ``ids``, with their job execution's,
        in key order (read once; then deleted by key, a slice at a time)."""
        se = schema.step_execution
        return (
            select(se.c.step_execution_id, se.c.job_execution_id)
            .where(se.c.job_execution_id.in_(bindparam("ids", expanding=True)))
            .order_by(se.c.step_execution_id)
        )

    def delete_step_rows(self) -> list[Delete]:
        """Deletes of the step executions ``ids`` in foreign-key order: their partition rows,
        their contexts, themselves."""
        ids = bindparam("ids", expanding=True)
        return [
            delete(partitions).where(partitions.c.step_execution_id.in_(ids)),
            delete(schema.step_execution_context).where(
                schema.step_execution_context.c.step_execution_id.in_(ids)
            ),
            delete(schema.step_execution).where(schema.step_execution.c.step_execution_id.in_(ids)),
        ]

    def delete_job_rows(self) -> list[Delete]:
        """Deletes of the job executions ``ids`` (their step executions already gone) in
        foreign-key order: coordination, master history, context, parameters, themselves."""
        ids = bindparam("ids", expanding=True)
        tables = (
            job_coordination,
            job_masters,
            schema.job_execution_context,
            schema.job_execution_params,
            schema.job_execution,
        )
        return [delete(t).where(t.c.job_execution_id.in_(ids)) for t in tables]

    def select_instances_of(self) -> Select[Any]:
        """The job instance ids of the job executions ``ids``."""
        je = schema.job_execution
        return (
            select(je.c.job_instance_id)
            .where(je.c.job_execution_id.in_(bindparam("ids", expanding=True)))
            .distinct()
        )

    def delete_empty_instances(self) -> Delete:
        """Deletes of the job instances ``ids`` that have no execution left."""
        ji = schema.job_instance
        je = schema.job_execution
        return delete(ji).where(
            ji.c.job_instance_id.in_(bindparam("ids", expanding=True)),
            ~exists().where(je.c.job_instance_id == ji.c.job_instance_id),
        )

    def count_prunable(self, prunable: Select[Any]) -> dict[str, Select[Any]]:
        """Per table, a count of the rows deleting the executions ``prunable`` selects would
        delete (what ``--dry-run`` prints)."""
        se = schema.step_execution
        je = schema.job_execution
        ji = schema.job_instance
        # No ORDER BY in a derived table (SQL Server refuses one).
        chosen = prunable.order_by(None).subquery("prune_chosen")
        ids = select(chosen.c.job_execution_id)
        steps = select(se.c.step_execution_id).where(se.c.job_execution_id.in_(ids))

        def count(table: Any, *where: ColumnElement[bool]) -> Select[Any]:
            return select(func.count()).select_from(table).where(*where)

        counts = {
            partitions.name: count(partitions, partitions.c.step_execution_id.in_(steps)),
            schema.step_execution_context.name: count(
                schema.step_execution_context,
                schema.step_execution_context.c.step_execution_id.in_(steps),
            ),
            se.name: count(se, se.c.job_execution_id.in_(ids)),
        }
        for table in (
            job_coordination,
            job_masters,
            schema.job_execution_context,
            schema.job_execution_params,
            je,
        ):
            counts[table.name] = count(table, table.c.job_execution_id.in_(ids))
        other = je.alias("prune_other")
        counts[ji.name] = count(
            ji,
            exists().where(
                je.c.job_instance_id == ji.c.job_instance_id, je.c.job_execution_id.in_(ids)
            ),
            ~exists().where(
                other.c.job_instance_id == ji.c.job_instance_id,
                other.c.job_execution_id.not_in(ids),
            ),
        )
        return counts

    # --- leases (a maintenance task run by one node at a time) ------------------------------------

    def take_lease(self, name: str, holder: str, term_ms: int) -> Update:
        """Take or renew the lease ``name``: it changes the row when ``holder`` holds it, or its
        holder has not renewed it for ``term_ms`` (exactly one contender wins: the row is
        locked by the first UPDATE and the second sees it renewed)."""
        leases = schema.leases
        return (
            update(leases)
            .where(
                leases.c.lease_name == name,
                or_(leases.c.holder == holder, self.older_than(leases.c.renewed_at, term_ms)),
            )
            .values(holder=holder, renewed_at=self.now())
        )

    def select_lease(self, name: str) -> Select[Any]:
        leases = schema.leases
        return select(leases.c.holder, leases.c.renewed_at).where(leases.c.lease_name == name)

    def insert_lease(self, name: str, holder: str) -> Insert:
        """The lease's first row (a duplicate-key error when another node inserted it first)."""
        return insert(schema.leases).values(lease_name=name, holder=holder, renewed_at=self.now())

    def release_lease(self, name: str, holder: str) -> Delete:
        """Give the lease up (its row goes; the next taker inserts it again)."""
        leases = schema.leases
        return delete(leases).where(leases.c.lease_name == name, leases.c.holder == holder)

    # --- helpers for subclasses -----------------------------------------------------------------

    @staticmethod
    def _clock(sql: str) -> ColumnElement[datetime]:
        """A constant clock expression (no user data in it) typed as a timestamp."""
        return literal_column(sql, type_=DateTime())


#: Kinds :meth:`QueryProvider.column_type` is asked about.
COLUMN_KINDS = ("timestamp", "long_text", "id")
