"""The query provider contract: the core every provider has, composed with its statement families.

A provider says how one database expresses each coordination statement; it holds no coordination
logic. :class:`QueryProvider` is the portable provider. Its own body, here, is the core: the
capability flags, the database clock, column types, engine and session set-up, and which errors
are transient or read-only. Every statement it inherits from a statement family, written once in
portable SQLAlchemy Core, one module each:

- :mod:`~dbcluster.dialects.nodes`: the node registry (registration, heartbeats, sweeps);
- :mod:`~dbcluster.dialects.partitions`: placement, a worker's guarded transitions, the
  master's monitor;
- :mod:`~dbcluster.dialects.claims`: the poll and the claim;
- :mod:`~dbcluster.dialects.coordination`: mastership, stranded masters, the stop request;
- :mod:`~dbcluster.dialects.launches`: submitted launches and schedules;
- :mod:`~dbcluster.dialects.wakeups`: LISTEN/NOTIFY wake-ups;
- :mod:`~dbcluster.dialects.pruning`, :mod:`~dbcluster.dialects.leases`;
- :mod:`~dbcluster.dialects.fastpaths`: several writes in one statement, where a database can;
- :mod:`~dbcluster.dialects.ddl`: DDL and migrations;
- :mod:`~dbcluster.dialects.provisioning`: scratch databases;
- :mod:`~dbcluster.dialects.family`: what the families share (the locking read among it).

A subclass overrides only what its database does differently, one method at a time, wherever the
method is written (``docs/PROVIDERS.md`` lists the hooks per family). PostgreSQL's one-statement
claim and final writes are not portable: they are in :mod:`~dbcluster.dialects.postgresql_ctes`.

Statement builders return SQLAlchemy executables with bound parameters; the caller executes them
and judges the row count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import DateTime, Delete, Engine, Select, String, Update, literal_column, select
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

# The statement families QueryProvider is composed of. An ``X as X`` import: a name a family
# defines that callers import from this module.
from dbcluster.dialects.claims import CLAIMED_JOB_PREFIX as CLAIMED_JOB_PREFIX
from dbcluster.dialects.claims import ClaimStatements
from dbcluster.dialects.coordination import CoordinationStatements
from dbcluster.dialects.ddl import DDLStatements
from dbcluster.dialects.family import insert_from as insert_from
from dbcluster.dialects.fastpaths import FastPathStatements
from dbcluster.dialects.fastpaths import array_parameters as array_parameters
from dbcluster.dialects.launches import LaunchStatements
from dbcluster.dialects.leases import LeaseStatements
from dbcluster.dialects.nodes import NodeStatements
from dbcluster.dialects.pairs import StatementPair as StatementPair
from dbcluster.dialects.partitions import PLACED_COLUMNS as PLACED_COLUMNS
from dbcluster.dialects.partitions import PartitionStatements
from dbcluster.dialects.provisioning import ScratchDatabases
from dbcluster.dialects.pruning import PruningStatements
from dbcluster.dialects.wakeups import Listener as Listener
from dbcluster.dialects.wakeups import WakeUpStatements
from dbcluster.errors import ConfigurationError

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

#: The URL query option naming the connection pooler between dbcluster and the database
#: (``?dbcluster_pooler=transaction``: PgBouncer, or any pooler, in transaction pooling mode).
#: It is dbcluster's own: read by the provider (:meth:`QueryProvider.read_url_options`), never
#: passed to the driver.
POOLER_OPTION = "dbcluster_pooler"


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
    CoordinationStatements,
    LaunchStatements,
    WakeUpStatements,
    PruningStatements,
    LeaseStatements,
    FastPathStatements,
    DDLStatements,
    ScratchDatabases,
):
    """The portable provider: the core below, and every statement from its families (see the
    module's doc). Subclasses set the class attributes and override what differs."""

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
    #: On the autocommit engine, the driver sends two statements in one request and reads each
    #: one's result (:meth:`read_then_write`; MySQL and MariaDB through PyMySQL, with the
    #: protocol's multi-statement capability): a node's poll and its heartbeat then share a
    #: round trip where the database has no single statement for both.
    supports_statement_pairs: ClassVar[bool] = False
    #: The database hands a deleted newest row's id out again (SQLite's rowid tables without
    #: ``AUTOINCREMENT``: the next id is the largest left plus one). Nodes remember job
    #: and step executions by id (a worker's job cache and the partitions it holds, stop
    #: requests), so the pruner never deletes the newest job execution here, nor the one that
    #: holds the newest step execution: a committed execution's or step execution's id is never
    #: handed out again. Job instance ids still can be; nothing keeps those.
    reuses_ids: ClassVar[bool] = False
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

    #: Each connection is one server session for its whole life, so what a session keeps
    #: (settings, prepared statements, ``LISTEN``, advisory locks, the server process that
    #: serves it) lasts from one transaction to the next. False behind a pooler in transaction
    #: mode (``?dbcluster_pooler=transaction``: :meth:`read_url_options`), where each
    #: transaction may run on another server session: session limits then go with each
    #: transaction, a node listens for wake-ups over a direct connection of its own
    #: (``listen_url``) or polls, and nothing judges a session by its server process
    #: (no settling by pid, so no final write pipelined with its ``COMMIT``).
    keeps_session: bool = True

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    def read_url_options(self, url: URL) -> None:
        """Take dbcluster's own options from the URL's query (:data:`POOLER_OPTION`); the
        driver never sees them. The base runs behind no transaction pooler: it refuses the
        option (a provider that can, overrides this)."""
        value = url.query.get(POOLER_OPTION)
        if value is not None and value not in ("none", "session"):
            raise ConfigurationError(
                f"{POOLER_OPTION}={value} is not supported on {self.name}: connect to the "
                f"database directly (remove {POOLER_OPTION} from the URL)"
            )

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

    @staticmethod
    def _clock(sql: str) -> ColumnElement[datetime]:
        """A constant clock expression (no user data in it) typed as a timestamp: what a
        subclass's :meth:`now` returns."""
        return literal_column(sql, type_=DateTime())

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

    def in_transaction(self, dbapi_connection: Any) -> bool | None:
        """Whether the driver connection has a transaction open, where the driver knows it
        without a round trip (None: unknown). A pooled connection coming back with none open is
        not rolled back again (see ``make_engine``)."""
        return None

    def private_to_engine(self, engine: Engine) -> bool:
        """The engine's database lives only inside that engine (an in-memory database): a second
        engine would see another, empty database."""
        return False

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

    # --- sessions -------------------------------------------------------------------------------

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

    def read_then_write(self, read: Any, write: Any, dialect: Dialect) -> StatementPair | None:
        """``read`` and then ``write`` (Core statements sharing their bound parameters' names)
        as one request of an autocommit connection, built once for ``dialect`` (with
        :attr:`supports_statement_pairs`); None where the driver cannot send them so (the
        caller runs them one by one)."""
        return None

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        """Per-engine set-up (connection pragmas, transaction begin statements). ``autocommit``:
        the engine was made with :meth:`autocommit_engine_options` and must not begin
        transactions of its own."""

    def connect(self, dialect: Dialect, cargs: Any, cparams: dict[str, Any]) -> Any:
        """A new driver connection for an engine of this provider (``create_engine``'s
        arguments for the driver; :data:`POOLER_OPTION` already taken out). Default: the
        dialect's own connect."""
        return dialect.connect(*cargs, **cparams)

    # --- errors ---------------------------------------------------------------------------------

    def is_transient(self, error: BaseException) -> bool:
        """Whether repeating the statement may succeed: deadlock, serialization failure, lock
        timeout, lost connection."""
        if isinstance(error, DBAPIError) and error.connection_invalidated:
            return True
        if isinstance(error, DBAPIError):
            return self._is_transient_driver_error(error.orig)
        if _is_driver_error(error):  # raised where SQLAlchemy does not wrap (a listener's wait)
            return self._is_transient_driver_error(error)
        return False

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        return False

    def is_read_only(self, error: BaseException) -> bool:
        """Whether the database refused a write because it takes none for now (a read-only
        server, as a primary demoted by a switchover is): no fault of the statement, and gone
        once clients reach the new primary. A worker does not withdraw over it."""
        if isinstance(error, DBAPIError):
            return self._is_read_only_driver_error(error.orig)
        if _is_driver_error(error):
            return self._is_read_only_driver_error(error)
        return False

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        return False

    def connect_error_hint(self, error: BaseException) -> str | None:
        """One line naming the fix for a connect failure the user must mend outside dbcluster
        (a missing system driver or package, an untrusted certificate); None for the rest."""
        return None


def _is_driver_error(error: BaseException) -> bool:
    """Whether ``error`` is a driver's own exception (PEP 249: every driver's errors derive
    from a class named ``Error`` of its module), as SQLAlchemy's ``DBAPIError`` wraps them."""
    return not isinstance(error, DBAPIError) and any(
        c.__name__ == "Error" and c.__module__ != "builtins" for c in type(error).__mro__
    )


#: Kinds :meth:`QueryProvider.column_type` is asked about.
COLUMN_KINDS = ("timestamp", "long_text", "id")
