"""Every dbcluster table, once, as SQLAlchemy Core metadata.

The job repository keeps Spring Batch's shape (lower-case names); three coordination tables sit
beside it. Column types that the generic SQLAlchemy types express badly on some database (a
timestamp with sub-second precision, a large text, bounded text that must compare exactly and
fit by the database's own measure, a flag) are :class:`TypeDecorator`s that ask the dialect's query
provider for the concrete type, so this module never names a database. Nor does it import the
providers: the registry (:mod:`dbcluster.dialects.registry`) plugs in how a dialect's provider is
found (:func:`use_column_types`) when it is imported, which every engine, provider and command of
dbcluster does first.

All timestamps are naive UTC. Names stay under 30 characters so that every Oracle version accepts
them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    event,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.engine.default import DefaultDialect, StrCompileDialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from dbcluster.errors import UnsupportedBackendError

#: One width for every column that holds a node id (the reference's narrower assigned-node column
#: was a defect).
NODE_ID_LENGTH = 100
NAME_LENGTH = 100
STATUS_LENGTH = 20
EXIT_LENGTH = 2500
SHORT_CONTEXT_LENGTH = 2500
TRACE_CONTEXT_LENGTH = 100

metadata = MetaData()

#: Table options for MySQL and MariaDB (dialect keyword arguments other databases ignore): InnoDB
#: for row locks and transactions, utf8mb4 so any context text fits.
_TABLE_OPTIONS: dict[str, str] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
}


class ColumnTypes(Protocol):
    """What the column types below ask of a dialect's query provider (its class:
    :class:`~dbcluster.dialects.base.QueryProvider` answers each)."""

    def column_type(self, kind: str) -> TypeEngine[Any] | None:
        """The concrete type for ``kind`` ("timestamp", "long_text", "id", "flag"), or None
        for the generic one."""
        ...

    def text_type(self, length: int) -> TypeEngine[Any]:
        """The type of a bounded text column of ``length`` characters."""
        ...

    def clip_text(self, text: str, length: int) -> str:
        """``text`` cut to what a bounded text column of ``length`` holds."""
        ...


#: How a dialect's :class:`ColumnTypes` are found (see :func:`use_column_types`).
_lookup: Callable[[Dialect], ColumnTypes] | None = None


def use_column_types(lookup: Callable[[Dialect], ColumnTypes]) -> None:
    """Plug in how the column types find a dialect's provider: the registry does, when it is
    imported, with its one answer per dialect (a dialect no provider serves is an error
    there, never a silent fall back to the generic types)."""
    global _lookup
    _lookup = lookup


def _provider_class(dialect: Dialect) -> ColumnTypes | None:
    """The dialect's provider (the registry's one answer). SQLAlchemy's own dialect
    (``str(statement)``) is no database: None, and the generic types."""
    if type(dialect) in (DefaultDialect, StrCompileDialect):
        return None
    if _lookup is None:
        raise UnsupportedBackendError(
            f"the dbcluster tables' column types for {dialect.name!r} come from its query "
            "provider: import dbcluster.dialects (or make the engine with its make_engine) first"
        )
    return _lookup(dialect)


def _provider_type(dialect: Dialect, kind: str) -> TypeEngine[Any] | None:
    provider_class = _provider_class(dialect)
    return None if provider_class is None else provider_class.column_type(kind)


class Timestamp(TypeDecorator[Any]):
    """A naive-UTC timestamp with at least millisecond precision on every database."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        concrete = _provider_type(dialect, "timestamp")
        return dialect.type_descriptor(concrete if concrete is not None else DateTime())


class LongText(TypeDecorator[Any]):
    """Unbounded text (a serialized execution context)."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        concrete = _provider_type(dialect, "long_text")
        return dialect.type_descriptor(concrete if concrete is not None else Text())


class Id(TypeDecorator[int]):
    """A 64-bit surrogate key filled by the database (identity / auto-increment / rowid)."""

    impl = BigInteger
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        concrete = _provider_type(dialect, "id")
        return dialect.type_descriptor(concrete if concrete is not None else BigInteger())


class ShortText(TypeDecorator[str]):
    """Bounded text (names, keys, statuses, messages), Unicode on every database (``NVARCHAR``
    where ``VARCHAR`` is not), compared exactly: case- and accent-sensitively, so 'Job' and
    'job' are two job names and two node ids everywhere.

    With ``clip=True`` a longer value is cut, ending in "...", to what the column holds on this
    database, measured as the database measures it (Oracle caps ``VARCHAR2(n CHAR)`` at 4,000
    bytes, Db2 counts bytes, SQL Server UTF-16 units), instead of failing the write.
    """

    impl = String
    cache_ok = True

    def __init__(self, length: int, *, clip: bool = False) -> None:
        super().__init__(length)
        self.clip = clip

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        provider_class = _provider_class(dialect)
        concrete = provider_class.text_type(self.length) if provider_class else None
        return dialect.type_descriptor(concrete if concrete is not None else self.impl)

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if not self.clip:
            # Nothing to cut: only the implementation's own processing (none on most drivers),
            # not a call of process_bind_param for every value bound.
            return self.impl_instance.bind_processor(dialect)
        return super().bind_processor(dialect)

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if not self.clip or value is None:
            return value
        provider_class = _provider_class(dialect)
        if provider_class is None:
            return value if len(value) <= self.length else value[: self.length - 3] + "..."
        return provider_class.clip_text(value, self.length)


class Flag(TypeDecorator[bool]):
    """A boolean. Stored as the provider's ``flag`` type where it names one (Oracle: SMALLINT
    on every version, so the schema is the same before and after 23ai's native BOOLEAN), as
    0 and 1. Compare it with ``== True``, which binds the value the column takes on every
    database; ``.is_(True)`` binds it too, and ``IS <parameter>`` is no SQL anywhere."""

    impl = Boolean
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        concrete = _provider_type(dialect, "flag")
        # Not adapted to the dialect's own integer type, which would render another name.
        return concrete if concrete is not None else dialect.type_descriptor(self.impl)

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if _provider_type(dialect, "flag") is None:
            return super().bind_processor(dialect)
        return lambda value: None if value is None else int(bool(value))

    def result_processor(self, dialect: Dialect, coltype: Any) -> Callable[[Any], Any] | None:
        if _provider_type(dialect, "flag") is None:
            return super().result_processor(dialect, coltype)
        return lambda value: None if value is None else bool(value)


def _id(name: str) -> Column[int]:
    return Column(name, Id, Identity(start=1), primary_key=True, nullable=False)


# --- the job repository -------------------------------------------------------------------------

job_instance = Table(
    "batch_job_instance",
    metadata,
    _id("job_instance_id"),
    Column("version", BigInteger, nullable=False, default=0),
    Column("job_name", ShortText(NAME_LENGTH), nullable=False),
    Column("job_key", ShortText(64), nullable=False),
    UniqueConstraint("job_name", "job_key", name="uq_job_inst_name_key"),
    **_TABLE_OPTIONS,
)

job_execution = Table(
    "batch_job_execution",
    metadata,
    _id("job_execution_id"),
    Column("version", BigInteger, nullable=False, default=0),
    Column(
        "job_instance_id",
        BigInteger,
        ForeignKey("batch_job_instance.job_instance_id", name="fk_job_exec_inst"),
        nullable=False,
    ),
    Column("create_time", Timestamp, nullable=False),
    Column("start_time", Timestamp),
    Column("end_time", Timestamp),
    Column("status", ShortText(STATUS_LENGTH), nullable=False),
    Column("exit_code", ShortText(EXIT_LENGTH, clip=True)),
    Column("exit_message", ShortText(EXIT_LENGTH, clip=True)),
    Column("last_updated", Timestamp),
    Index("ix_job_exec_inst", "job_instance_id"),
    Index("ix_job_exec_status", "status"),
    # Pruning: "status IN (...) AND end_time < now - age".
    Index("ix_job_exec_status_end", "status", "end_time"),
    **_TABLE_OPTIONS,
)

#: A job parameter's columns besides its execution's id, in the order they are written and read.
PARAMETER_COLUMNS = ("parameter_name", "parameter_type", "parameter_value", "identifying")

job_execution_params = Table(
    "batch_job_execution_params",
    metadata,
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_job_params_exec"),
        nullable=False,
    ),
    Column("parameter_name", ShortText(NAME_LENGTH), nullable=False),
    Column("parameter_type", ShortText(NAME_LENGTH), nullable=False),
    Column("parameter_value", ShortText(EXIT_LENGTH)),
    Column("identifying", Flag(name="ck_job_params_ident"), nullable=False),
    PrimaryKeyConstraint("job_execution_id", "parameter_name", name="pk_job_params"),
    **_TABLE_OPTIONS,
)

step_execution = Table(
    "batch_step_execution",
    metadata,
    _id("step_execution_id"),
    Column("version", BigInteger, nullable=False, default=0),
    Column("step_name", ShortText(NAME_LENGTH * 2 + 1), nullable=False),
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_step_exec_job"),
        nullable=False,
    ),
    Column("create_time", Timestamp, nullable=False),
    Column("start_time", Timestamp),
    Column("end_time", Timestamp),
    Column("status", ShortText(STATUS_LENGTH), nullable=False),
    Column("commit_count", BigInteger, nullable=False, default=0),
    Column("read_count", BigInteger, nullable=False, default=0),
    Column("filter_count", BigInteger, nullable=False, default=0),
    Column("write_count", BigInteger, nullable=False, default=0),
    Column("read_skip_count", BigInteger, nullable=False, default=0),
    Column("write_skip_count", BigInteger, nullable=False, default=0),
    Column("process_skip_count", BigInteger, nullable=False, default=0),
    Column("rollback_count", BigInteger, nullable=False, default=0),
    Column("exit_code", ShortText(EXIT_LENGTH, clip=True)),
    Column("exit_message", ShortText(EXIT_LENGTH, clip=True)),
    Column("last_updated", Timestamp),
    Index("ix_step_exec_job_name", "job_execution_id", "step_name"),
    **_TABLE_OPTIONS,
)

job_execution_context = Table(
    "batch_job_execution_context",
    metadata,
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_job_ctx_exec"),
        primary_key=True,
        nullable=False,
        autoincrement=False,
    ),
    Column("short_context", ShortText(SHORT_CONTEXT_LENGTH), nullable=False),
    Column("serialized_context", LongText),
    **_TABLE_OPTIONS,
)

step_execution_context = Table(
    "batch_step_execution_context",
    metadata,
    Column(
        "step_execution_id",
        BigInteger,
        ForeignKey("batch_step_execution.step_execution_id", name="fk_step_ctx_exec"),
        primary_key=True,
        nullable=False,
        autoincrement=False,
    ),
    Column("short_context", ShortText(SHORT_CONTEXT_LENGTH), nullable=False),
    Column("serialized_context", LongText),
    **_TABLE_OPTIONS,
)

# --- coordination -------------------------------------------------------------------------------

nodes = Table(
    "batch_nodes",
    metadata,
    Column("node_id", ShortText(NODE_ID_LENGTH), primary_key=True, nullable=False),
    Column("host", ShortText(255), nullable=False),
    Column("status", ShortText(STATUS_LENGTH), nullable=False),
    Column("created_time", Timestamp, nullable=False),
    Column("last_heartbeat", Timestamp, nullable=False),
    Column("current_load", Integer, nullable=False, default=0),
    # Partitions it runs at once; 0 for a master that takes no partitions (``launch --no-work``).
    Column("capacity", Integer, nullable=False, default=0),
    # Staleness sweeps: "status = ? AND last_heartbeat < now - N".
    Index("ix_nodes_status_hb", "status", "last_heartbeat"),
    **_TABLE_OPTIONS,
)

partitions = Table(
    "batch_partitions",
    metadata,
    Column(
        "step_execution_id",
        BigInteger,
        ForeignKey("batch_step_execution.step_execution_id", name="fk_part_step_exec"),
        primary_key=True,
        nullable=False,
        autoincrement=False,
    ),
    Column("job_execution_id", BigInteger, nullable=False),
    Column("master_step_execution_id", BigInteger, nullable=False),
    Column("partition_name", ShortText(NAME_LENGTH), nullable=False),
    Column("assigned_node", ShortText(NODE_ID_LENGTH)),
    # The fencing token and try number: whatever takes the partition from a node that claimed it
    # (its removal, a timeout, a retry, a hand-back) increments it, and every worker write is
    # guarded by (assigned_node, attempt).
    Column("attempt", Integer, nullable=False, default=1),
    # Tries a transferable partition gets before its failure fails the step.
    Column("max_attempts", Integer, nullable=False, default=1),
    Column("status", ShortText(STATUS_LENGTH), nullable=False),
    Column("transferable", Flag(name="ck_part_transferable"), nullable=False),
    Column("created_time", Timestamp, nullable=False),
    # The partition's progress: its claim, then each committed chunk (the fence sets it).
    Column("last_updated", Timestamp, nullable=False),
    # When it was put back for a retry; its master places it again after its backoff.
    Column("retried_at", Timestamp),
    # The W3C ``traceparent`` of the master's span that placed it (None when not traced), so the
    # span of the node that runs it joins the job's trace.
    Column("trace_context", ShortText(TRACE_CONTEXT_LENGTH)),
    # A node's partitions: "assigned_node = ? AND status = ..." (removal, hand-back).
    Index("ix_part_node_status", "assigned_node", "status"),
    # Worker poll: the PENDING rows, oldest first (its own and those it may steal).
    Index("ix_part_status", "status", "step_execution_id"),
    # Master monitor: "master_step_execution_id = ? AND status IN (...)".
    Index("ix_part_master_status", "master_step_execution_id", "status"),
    # Per execution: in-flight counts, abandoning a job ("job_execution_id = ? AND status IN").
    Index("ix_part_job_status", "job_execution_id", "status"),
    **_TABLE_OPTIONS,
)

job_coordination = Table(
    "batch_job_coordination",
    metadata,
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_coord_job_exec"),
        primary_key=True,
        nullable=False,
        autoincrement=False,
    ),
    Column("master_node", ShortText(NODE_ID_LENGTH), nullable=False),
    # The mastership's fencing token: every takeover increments it and every master write is
    # guarded by (master_node, master_epoch).
    Column("master_epoch", Integer, nullable=False, default=1),
    Column("master_step_execution_id", BigInteger, nullable=False),
    Column("worker_step_name", ShortText(NAME_LENGTH), nullable=False),
    Column("status", ShortText(STATUS_LENGTH), nullable=False),
    Column("created_time", Timestamp, nullable=False),
    Column("updated_time", Timestamp, nullable=False),
    # Stranded-master scan: "status IN (CREATED, STARTED, RECOVERING)".
    Index("ix_coord_status", "status", "master_node"),
    **_TABLE_OPTIONS,
)

job_masters = Table(
    "batch_job_masters",
    metadata,
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_masters_job_exec"),
        nullable=False,
    ),
    Column("master_epoch", Integer, nullable=False),
    Column("master_node", ShortText(NODE_ID_LENGTH), nullable=False),
    # "launched", "takeover" (it runs the job on) or "abandon" (it fails the job).
    Column("reason", ShortText(STATUS_LENGTH), nullable=False),
    Column("since", Timestamp, nullable=False),
    PrimaryKeyConstraint("job_execution_id", "master_epoch", name="pk_job_masters"),
    **_TABLE_OPTIONS,
)

# --- launches and schedules ---------------------------------------------------------------------

launch_requests = Table(
    "batch_launch_requests",
    metadata,
    _id("request_id"),
    Column("job_name", ShortText(NAME_LENGTH), nullable=False),
    # The parameters, a JSON list in the syntax ``JobParameters.parse`` reads.
    Column("parameters", LongText, nullable=False),
    # Apply the job's incrementer to its last run's parameters at launch (``--next``).
    Column("next_run", Flag(name="ck_launch_next_run"), nullable=False),
    # PENDING -> CLAIMED (by a node accepting launches) -> LAUNCHED (with its execution, in the
    # execution's creating transaction) or FAILED (with the error).
    Column("status", ShortText(STATUS_LENGTH), nullable=False),
    Column("claimed_by", ShortText(NODE_ID_LENGTH)),
    Column("created_time", Timestamp, nullable=False),
    Column("claimed_time", Timestamp),
    # No foreign key: pruning an execution leaves the request's history.
    Column("job_execution_id", BigInteger),
    Column("error_message", ShortText(EXIT_LENGTH, clip=True)),
    # Accepting nodes' poll: "status = PENDING ORDER BY request_id"; lost claims: "CLAIMED".
    Index("ix_launch_status", "status", "request_id"),
    **_TABLE_OPTIONS,
)

schedule_fires = Table(
    "batch_schedule_fires",
    metadata,
    Column("schedule_name", ShortText(NAME_LENGTH), nullable=False),
    # The tick (naive UTC): the primary key makes each tick fire once across the cluster.
    Column("fire_time", Timestamp, nullable=False),
    Column("request_id", BigInteger, nullable=False),
    Column("fired_by", ShortText(NODE_ID_LENGTH), nullable=False),
    Column("fired_at", Timestamp, nullable=False),
    PrimaryKeyConstraint("schedule_name", "fire_time", name="pk_schedule_fires"),
    **_TABLE_OPTIONS,
)

leases = Table(
    "batch_leases",
    metadata,
    # A maintenance task that one node at a time runs ("prune"): whoever holds the row's lease.
    Column("lease_name", ShortText(NAME_LENGTH), primary_key=True, nullable=False),
    Column("holder", ShortText(NODE_ID_LENGTH), nullable=False),
    # Renewed (database clock) while the holder works; silent past its term, any node takes it.
    Column("renewed_at", Timestamp, nullable=False),
    **_TABLE_OPTIONS,
)
# --- the schema's version -----------------------------------------------------------------------

#: The revision of ``dbcluster/migrations/versions/`` this code's tables are (``dbcluster migrate``
#: brings an older database to it; a node refuses to start on any other).
SCHEMA_VERSION = "0002"

schema_version = Table(
    "batch_schema_version",
    metadata,
    # One row: the last revision applied (Alembic's ``alembic_version``).
    Column("version_num", ShortText(32), primary_key=True, nullable=False),
    Column("applied_time", Timestamp, nullable=False),
    **_TABLE_OPTIONS,
)


@event.listens_for(schema_version, "after_create")
def _record_version(target: Table, connection: Connection, **_: Any) -> None:
    """Tables created from this module are the current schema: say so in the same breath
    (``metadata.create_all``, ``dbcluster init``), so a node accepts them."""
    connection.execute(target.insert().values(version_num=SCHEMA_VERSION, applied_time=_utc_now()))


def _utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


#: Tables in creation order (parents first).
ALL_TABLES: tuple[Table, ...] = tuple(metadata.sorted_tables)
