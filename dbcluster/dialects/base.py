"""The query provider contract and everything portable about it.

A provider says how one database expresses each coordination statement; it holds no coordination
logic. Everything expressible in portable SQLAlchemy Core lives here, once. A subclass overrides
only what its database does differently: the clock, "older than N ms", column types, an upsert,
which driver errors are transient, and capability flags.

Statement builders return SQLAlchemy executables with bound parameters; the caller executes them
and judges the row count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

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
    literal_column,
    select,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster import schema
from dbcluster.dialects.claims import CLAIMED_JOB_PREFIX, ClaimStatements  # noqa: F401 - re-exported
from dbcluster.dialects.ddl import DDLStatements
from dbcluster.dialects.family import insert_from
from dbcluster.dialects.leases import LeaseStatements
from dbcluster.dialects.nodes import NodeStatements
from dbcluster.dialects.partitions import PLACED_COLUMNS, PartitionStatements  # noqa: F401 - re-exported
from dbcluster.dialects.provisioning import ScratchDatabases
from dbcluster.dialects.wakeups import Listener, WakeUpStatements  # noqa: F401 - re-exported
from dbcluster.schema import (
    job_coordination,
    job_masters,
    launch_requests,
    partitions,
    schedule_fires,
)

# Statuses are plain strings in the database; these are the only spellings.
NODE_ACTIVE = "ACTIVE"
NODE_UNREACHABLE = "UNREACHABLE"
#: Only ever inside a sweeper's removal transaction (never committed): marks the rows it deletes.
NODE_REMOVING = "REMOVING"

PARTITION_PENDING = "PENDING"
PARTITION_CLAIMED = "CLAIMED"
PARTITION_COMPLETED = "COMPLETED"
PARTITION_FAILED = "FAILED"
PARTITION_IN_FLIGHT = (PARTITION_PENDING, PARTITION_CLAIMED)


def array_parameters(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> dict[str, list[Any]]:
    """Rows as the parameters of an :meth:`QueryProvider.insert_from_arrays` statement: one list
    per column, named ``a_<column>`` (a column a row leaves out is None there)."""
    return {f"a_{name}": [row.get(name) for row in rows] for name in columns}


# Job execution statuses the stop request reads and writes (BatchStatus values; the provider
# does not import the batch model).
JOB_STARTING = "STARTING"
JOB_STARTED = "STARTED"
JOB_STOPPING = "STOPPING"

#: A step execution's status and exit code once started (the job repository's spellings).
STEP_STARTED = "STARTED"
STEP_EXECUTING = "EXECUTING"

#: Launch request statuses (``batch_launch_requests``).
LAUNCH_PENDING = "PENDING"
LAUNCH_CLAIMED = "CLAIMED"
LAUNCH_LAUNCHED = "LAUNCHED"
LAUNCH_FAILED = "FAILED"

COORD_CREATED = "CREATED"
COORD_STARTED = "STARTED"
COORD_COMPLETED = "COMPLETED"
COORD_FAILED = "FAILED"
COORD_RECOVERING = "RECOVERING"
COORD_ABANDONED = "ABANDONED"
COORD_IN_FLIGHT = (COORD_CREATED, COORD_STARTED, COORD_RECOVERING)
#: In flight under a working master (RECOVERING rows belong to a survivor's recovery).
COORD_MASTERED = (COORD_CREATED, COORD_STARTED)


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


class QueryProvider(
    NodeStatements,
    PartitionStatements,
    ClaimStatements,
    WakeUpStatements,
    LeaseStatements,
    DDLStatements,
    ScratchDatabases,
):
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
    #: The statements are PostgreSQL's: :mod:`dbcluster.dialects.postgresql_ctes`, whose
    #: ``WritableCTEProvider`` declares the flag with them (the base builds none).
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

    # DDL (see :mod:`dbcluster.dialects.ddl`).
    #: DDL runs inside a transaction and rolls back with it (PostgreSQL, SQLite, SQL Server,
    #: Db2). Where it does not (MySQL, MariaDB and Oracle commit each DDL statement on its own),
    #: a revision cut short stays half done; each migration step checks whether it is already
    #: done, so running ``dbcluster migrate`` again completes it.
    transactional_ddl: ClassVar[bool] = True
    #: Changing a column's type keeps the indexes and keys over it (SQL Server refuses to alter
    #: a column an index or key covers: they are dropped and created again around it).
    alter_type_keeps_indexes: ClassVar[bool] = True
    #: A script for a DBA commits its own writes: the database's tools do not commit when they
    #: exit (Oracle's SQLcl and SQL Developer), so the version row would be lost.
    scripts_commit: ClassVar[bool] = False

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
        both) and ``context_values`` its SET clause. With :attr:`supports_multi_table_update`
        one UPDATE joins both rows (2 rows matched with ``CLIENT_FOUND_ROWS``, which
        SQLAlchemy's MySQL drivers set; 1 or 2 changed without it, as the context may be
        unchanged); with :attr:`supports_writable_cte` (PostgreSQL: see
        :mod:`dbcluster.dialects.postgresql_ctes`) the context update runs in a ``WITH`` and
        the step's row is updated only if it did (1 row). None: two statements."""
        if self.supports_multi_table_update:
            se, sc = schema.step_execution, schema.step_execution_context
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
        """Where :attr:`supports_writable_cte` (PostgreSQL: see
        :mod:`dbcluster.dialects.postgresql_ctes`): a step's final write and the guarded UPDATE
        of its owner row (``guard``, e.g. a partition's finish) as one statement, in the lock
        order of the transaction it replaces: the guard's row first; then the context row (when
        ``context_update`` is given) and the step execution row, each written only if the one
        before changed. It answers one row: ``guarded`` (rows the guard changed: 1 or 0) and
        ``written`` (step execution rows written: 1, or 0 when the guard refused or the version
        was stale). The three share their bind parameters (``b_id`` names the step execution).
        With ``claim_next``, the same statement then claims one more partition for the node
        (parameters ``n_id``, ``n_node``, ``n_started_at``), and the row carries what it won
        (``p_id`` NULL when nothing was won). None: the guard and the write are statements of
        their own."""
        return None

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

    def together(self, write: Insert, then: Any) -> Any | None:
        """One statement that runs the INSERT ``write`` and the statement ``then`` (another
        INSERT, or a :meth:`notify`), taking the parameters of both, or None where the database
        cannot (then they are two). Neither may need to see the other's rows: a launch's
        coordination row and its master history row, a placement's partitions and its wake-ups
        (sent at COMMIT) go in one round trip."""
        return None

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

    # --- helpers for subclasses -----------------------------------------------------------------

    @staticmethod
    def _clock(sql: str) -> ColumnElement[datetime]:
        """A constant clock expression (no user data in it) typed as a timestamp."""
        return literal_column(sql, type_=DateTime())


#: Kinds :meth:`QueryProvider.column_type` is asked about.
COLUMN_KINDS = ("timestamp", "long_text", "id")
