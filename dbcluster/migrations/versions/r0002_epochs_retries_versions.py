"""0.1.0 -> 0.2.0: epochs, retries, indexes, exact text, the version table.

Master epochs and the master history, partition retries and trace context, the poll and
per-execution indexes, text that compares exactly, and the schema version table.

Every difference between the 0.1.0 schema and 0.2.0's:

- ``batch_job_coordination.master_epoch`` INTEGER NOT NULL (1 for existing rows).
- ``batch_partitions``: ``max_attempts`` INTEGER NOT NULL (1 for existing rows), ``retried_at``
  timestamp NULL, ``trace_context`` text(100) NULL; indexes ``ix_part_status (status,
  step_execution_id)`` and ``ix_part_job_status (job_execution_id, status)``.
- table ``batch_job_masters`` (filled with epoch 1, "launched", for each existing coordination
  row, so old executions show their master).
- table ``batch_schema_version``.
- prune: index ``ix_job_exec_status_end (status, end_time)`` on ``batch_job_execution``; table
  ``batch_leases``. Submit and schedules: tables ``batch_launch_requests`` (index
  ``ix_launch_status``) and ``batch_schedule_fires``.
- text columns: MySQL and MariaDB ``COLLATE utf8mb4_bin``; SQL Server ``NVARCHAR ... COLLATE
  Latin1_General_100_BIN2``; flags on Oracle ``SMALLINT`` (0.1.0's ``BOOLEAN`` loaded on 23ai
  only); serialized contexts on Db2 ``CLOB(1G)`` (a bare ``CLOB`` holds 1 MB; the two tables
  are reorganized once the revision has committed). PostgreSQL and SQLite render these types as
  0.1.0 did: nothing changes there.
- Db2: the ``version`` columns, which 0.1.0 quoted in lower case (``"version"``, a column no
  unquoted ``VERSION`` finds), are renamed ``"VERSION"``.

The additions are frozen here (their own MetaData); the retyped columns take their types from
``schema.py``, which declares the types these columns have had since 0.2.0.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    exists,
    insert,
    literal,
    select,
    text,
)

from dbcluster import schema
from dbcluster.migrations.baseline import TABLES_0_1_0, baseline
from dbcluster.migrations.ops import Operations
from dbcluster.schema import (
    EXIT_LENGTH,
    NAME_LENGTH,
    NODE_ID_LENGTH,
    STATUS_LENGTH,
    Flag,
    Id,
    LongText,
    ShortText,
    Timestamp,
)

revision = "0002"
down_revision = "0001"
release = "0.2.0"

_meta = MetaData()
_options = schema._TABLE_OPTIONS

# Stand-ins for the parents the new tables refer to (only their keys).
_coordination = Table(
    "batch_job_coordination",
    _meta,
    Column("job_execution_id", Integer, primary_key=True),
    Column("master_node", ShortText(NODE_ID_LENGTH)),
    Column("created_time", Timestamp),
)
_executions = Table(
    "batch_job_execution",
    _meta,
    Column("job_execution_id", Integer, primary_key=True),
    Column("status", ShortText(STATUS_LENGTH)),
    Column("end_time", Timestamp),
)

job_masters = Table(
    "batch_job_masters",
    _meta,
    Column(
        "job_execution_id",
        BigInteger,
        ForeignKey("batch_job_execution.job_execution_id", name="fk_masters_job_exec"),
        nullable=False,
    ),
    Column("master_epoch", Integer, nullable=False),
    Column("master_node", ShortText(NODE_ID_LENGTH), nullable=False),
    Column("reason", ShortText(STATUS_LENGTH), nullable=False),
    Column("since", Timestamp, nullable=False),
    PrimaryKeyConstraint("job_execution_id", "master_epoch", name="pk_job_masters"),
    **_options,
)

schema_version = Table(
    "batch_schema_version",
    _meta,
    Column("version_num", ShortText(32), primary_key=True, nullable=False),
    Column("applied_time", Timestamp, nullable=False),
    **_options,
)

# Stop, submit, schedule and prune (issue 14).
leases = Table(
    "batch_leases",
    _meta,
    Column("lease_name", ShortText(NAME_LENGTH), primary_key=True, nullable=False),
    Column("holder", ShortText(NODE_ID_LENGTH), nullable=False),
    Column("renewed_at", Timestamp, nullable=False),
    **_options,
)

launch_requests = Table(
    "batch_launch_requests",
    _meta,
    Column("request_id", Id, Identity(start=1), primary_key=True, nullable=False),
    Column("job_name", ShortText(NAME_LENGTH), nullable=False),
    Column("parameters", LongText, nullable=False),
    Column("next_run", Flag(name="ck_launch_next_run"), nullable=False),
    Column("status", ShortText(STATUS_LENGTH), nullable=False),
    Column("claimed_by", ShortText(NODE_ID_LENGTH)),
    Column("created_time", Timestamp, nullable=False),
    Column("claimed_time", Timestamp),
    Column("job_execution_id", BigInteger),
    Column("error_message", ShortText(EXIT_LENGTH, clip=True)),
    Index("ix_launch_status", "status", "request_id"),
    **_options,
)

schedule_fires = Table(
    "batch_schedule_fires",
    _meta,
    Column("schedule_name", ShortText(NAME_LENGTH), nullable=False),
    Column("fire_time", Timestamp, nullable=False),
    Column("request_id", BigInteger, nullable=False),
    Column("fired_by", ShortText(NODE_ID_LENGTH), nullable=False),
    Column("fired_at", Timestamp, nullable=False),
    PrimaryKeyConstraint("schedule_name", "fire_time", name="pk_schedule_fires"),
    **_options,
)

ix_job_exec_status_end = Index(
    "ix_job_exec_status_end", _executions.c.status, _executions.c.end_time
)

_partitions = Table(
    "batch_partitions",
    _meta,
    Column("step_execution_id", Integer),
    Column("job_execution_id", Integer),
    Column("status", ShortText(STATUS_LENGTH)),
)
ix_part_status = Index("ix_part_status", _partitions.c.status, _partitions.c.step_execution_id)
ix_part_job_status = Index(
    "ix_part_job_status", _partitions.c.job_execution_id, _partitions.c.status
)

#: The 0.1.0 columns whose type 0.2.0 declares differently on some database.
_RETYPED: dict[str, list[str]] = {
    "batch_job_instance": ["job_name", "job_key"],
    "batch_job_execution": ["status", "exit_code", "exit_message"],
    "batch_job_execution_params": [
        "parameter_name",
        "parameter_type",
        "parameter_value",
        "identifying",
    ],
    "batch_step_execution": ["step_name", "status", "exit_code", "exit_message"],
    "batch_job_execution_context": ["short_context", "serialized_context"],
    "batch_step_execution_context": ["short_context", "serialized_context"],
    "batch_nodes": ["node_id", "host", "status"],
    "batch_partitions": ["partition_name", "assigned_node", "status", "transferable"],
    "batch_job_coordination": ["master_node", "worker_step_name", "status"],
}


def upgrade(op: Operations) -> None:
    old = baseline(op.provider.name)
    tables = {t.name: t for t in schema.ALL_TABLES}
    for name in TABLES_0_1_0:
        op.respell_columns(tables[name], old)
    for table, columns in _RETYPED.items():
        op.retype_columns(tables[table], columns, old)

    op.add_column(
        "batch_job_coordination",
        Column("master_epoch", Integer, nullable=False, server_default=text("1")),
    )
    op.add_column(
        "batch_partitions",
        Column("max_attempts", Integer, nullable=False, server_default=text("1")),
    )
    op.add_column("batch_partitions", Column("retried_at", Timestamp, nullable=True))
    op.add_column("batch_partitions", Column("trace_context", ShortText(100), nullable=True))
    op.create_index(ix_part_status)
    op.create_index(ix_part_job_status)

    op.create_table(job_masters)
    # Each existing job had one master, the one that launched it (guarded: a rerun adds none).
    op.execute(
        insert(job_masters).from_select(
            ["job_execution_id", "master_epoch", "master_node", "reason", "since"],
            select(
                _coordination.c.job_execution_id,
                literal(1),
                _coordination.c.master_node,
                literal("launched"),
                _coordination.c.created_time,
            ).where(
                ~exists().where(job_masters.c.job_execution_id == _coordination.c.job_execution_id)
            ),
        )
    )
    op.create_index(ix_job_exec_status_end)
    op.create_table(leases)
    op.create_table(launch_requests)
    op.create_table(schedule_fires)
    op.create_table(schema_version)
