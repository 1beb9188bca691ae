"""Every dbcluster table, once, as SQLAlchemy Core metadata.

The job repository keeps Spring Batch's shape (lower-case names); three coordination tables sit
beside it. Column types that the generic SQLAlchemy types express badly on some database (a
timestamp with sub-second precision, a large text) are :class:`TypeDecorator`s that ask the
dialect's query provider for the concrete type, so this module never names a database.

All timestamps are naive UTC. Names stay under 30 characters so that every Oracle version accepts
them.
"""

from __future__ import annotations

from typing import Any

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
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

#: One width for every column that holds a node id (the reference's narrower assigned-node column
#: was a defect).
NODE_ID_LENGTH = 100
NAME_LENGTH = 100
STATUS_LENGTH = 20
EXIT_LENGTH = 2500
SHORT_CONTEXT_LENGTH = 2500

metadata = MetaData()

#: Table options for MySQL and MariaDB (dialect keyword arguments other databases ignore): InnoDB
#: for row locks and transactions, utf8mb4 so any context text fits.
_TABLE_OPTIONS: dict[str, str] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
}


def _provider_type(dialect: Dialect, kind: str) -> TypeEngine[Any] | None:
    # Imported lazily: the registry imports this module for its metadata.
    from dbcluster.dialects.registry import provider_class_for_dialect_name

    provider_class = provider_class_for_dialect_name(dialect.name, missing_ok=True)
    if provider_class is None:
        return None
    return provider_class.column_type(kind)


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


def _id(name: str) -> Column[int]:
    return Column(name, Id, Identity(start=1), primary_key=True, nullable=False)


# --- the job repository -------------------------------------------------------------------------

job_instance = Table(
    "batch_job_instance",
    metadata,
    _id("job_instance_id"),
    Column("version", BigInteger, nullable=False, default=0),
    Column("job_name", String(NAME_LENGTH), nullable=False),
    Column("job_key", String(64), nullable=False),
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
    Column("status", String(STATUS_LENGTH), nullable=False),
    Column("exit_code", String(EXIT_LENGTH)),
    Column("exit_message", String(EXIT_LENGTH)),
    Column("last_updated", Timestamp),
    Index("ix_job_exec_inst", "job_instance_id"),
    Index("ix_job_exec_status", "status"),
    **_TABLE_OPTIONS,
)

job_execution_params = Table(
    "batch_job_execution_params",
    metadata,
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_job_params_exec"),
        nullable=False,
    ),
    Column("parameter_name", String(NAME_LENGTH), nullable=False),
    Column("parameter_type", String(NAME_LENGTH), nullable=False),
    Column("parameter_value", String(EXIT_LENGTH)),
    Column("identifying", Boolean(name="ck_job_params_ident"), nullable=False),
    PrimaryKeyConstraint("job_execution_id", "parameter_name", name="pk_job_params"),
    **_TABLE_OPTIONS,
)

step_execution = Table(
    "batch_step_execution",
    metadata,
    _id("step_execution_id"),
    Column("version", BigInteger, nullable=False, default=0),
    Column("step_name", String(NAME_LENGTH * 2 + 1), nullable=False),
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_step_exec_job"),
        nullable=False,
    ),
    Column("create_time", Timestamp, nullable=False),
    Column("start_time", Timestamp),
    Column("end_time", Timestamp),
    Column("status", String(STATUS_LENGTH), nullable=False),
    Column("commit_count", BigInteger, nullable=False, default=0),
    Column("read_count", BigInteger, nullable=False, default=0),
    Column("filter_count", BigInteger, nullable=False, default=0),
    Column("write_count", BigInteger, nullable=False, default=0),
    Column("read_skip_count", BigInteger, nullable=False, default=0),
    Column("write_skip_count", BigInteger, nullable=False, default=0),
    Column("process_skip_count", BigInteger, nullable=False, default=0),
    Column("rollback_count", BigInteger, nullable=False, default=0),
    Column("exit_code", String(EXIT_LENGTH)),
    Column("exit_message", String(EXIT_LENGTH)),
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
    Column("short_context", String(SHORT_CONTEXT_LENGTH), nullable=False),
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
    Column("short_context", String(SHORT_CONTEXT_LENGTH), nullable=False),
    Column("serialized_context", LongText),
    **_TABLE_OPTIONS,
)

# --- coordination -------------------------------------------------------------------------------

nodes = Table(
    "batch_nodes",
    metadata,
    Column("node_id", String(NODE_ID_LENGTH), primary_key=True, nullable=False),
    Column("host", String(255), nullable=False),
    Column("status", String(STATUS_LENGTH), nullable=False),
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
    Column("partition_name", String(NAME_LENGTH), nullable=False),
    Column("assigned_node", String(NODE_ID_LENGTH)),
    # The fencing token: reassignment increments it and every worker write is guarded by it.
    Column("attempt", Integer, nullable=False, default=1),
    Column("status", String(STATUS_LENGTH), nullable=False),
    Column("transferable", Boolean(name="ck_part_transferable"), nullable=False),
    Column("created_time", Timestamp, nullable=False),
    Column("last_updated", Timestamp, nullable=False),
    # Worker poll: "assigned_node = ? AND status = 'PENDING'".
    Index("ix_part_node_status", "assigned_node", "status"),
    # Master monitor: "master_step_execution_id = ? AND status IN (...)".
    Index("ix_part_master_status", "master_step_execution_id", "status"),
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
    Column("master_node", String(NODE_ID_LENGTH), nullable=False),
    Column("master_step_execution_id", BigInteger, nullable=False),
    Column("worker_step_name", String(NAME_LENGTH), nullable=False),
    Column("status", String(STATUS_LENGTH), nullable=False),
    Column("created_time", Timestamp, nullable=False),
    Column("updated_time", Timestamp, nullable=False),
    # Stranded-master scan: "status IN (CREATED, STARTED, RECOVERING)".
    Index("ix_coord_status", "status", "master_node"),
    **_TABLE_OPTIONS,
)

#: Tables in creation order (parents first).
ALL_TABLES: tuple[Table, ...] = tuple(metadata.sorted_tables)
