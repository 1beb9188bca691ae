"""The job repository's fixed statements, built once at import with bound parameters.

SQLAlchemy then neither builds them nor computes their cache keys again on every chunk (a rebuilt
statement costs several times its round trip). The statements a database can combine into one
round trip are built per repository from its provider: :mod:`dbcluster.batch.dao.combined`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, case, func, insert, select, update

from dbcluster import schema
from dbcluster.batch.domain import COUNTER_NAMES
from dbcluster.batch.status import BatchStatus

JOB_INSTANCE = schema.job_instance
JOB_EXECUTION = schema.job_execution
JOB_PARAMS = schema.job_execution_params
STEP_EXECUTION = schema.step_execution
JOB_CONTEXT = schema.job_execution_context
STEP_CONTEXT = schema.step_execution_context

#: The statuses of an execution that has not ended.
RUNNING = [s.value for s in BatchStatus if s.is_running]

# --- the sums a partitioned step aggregates -----------------------------------------------------

#: The sums of ``partitions_ended`` over some step executions (one IN list; or a run of
#: consecutive ids): how many, how many COMPLETED, each counter's sum; and those of them that did
#: not complete.
_SOME_STEPS = STEP_EXECUTION.c.step_execution_id.in_(bindparam("b_ids", expanding=True))
_STEPS_BETWEEN = STEP_EXECUTION.c.step_execution_id.between(bindparam("b_low"), bindparam("b_high"))
_TOTALS = select(
    func.count(),
    # No bound value as the CASE's result: Db2 refuses an untyped marker in a function's
    # arguments.
    func.count(
        case(
            (
                STEP_EXECUTION.c.status == BatchStatus.COMPLETED.value,
                STEP_EXECUTION.c.step_execution_id,
            )
        )
    ),
    *(func.sum(STEP_EXECUTION.c[name]) for name in COUNTER_NAMES),
)
_UNFINISHED = select(
    STEP_EXECUTION.c.step_execution_id,
    STEP_EXECUTION.c.step_name,
    STEP_EXECUTION.c.status,
    STEP_EXECUTION.c.exit_code,
).where(STEP_EXECUTION.c.status != BatchStatus.COMPLETED.value)
PARTITION_TOTALS = _TOTALS.where(_SOME_STEPS)
PARTITIONS_UNFINISHED = _UNFINISHED.where(_SOME_STEPS)
PARTITION_TOTALS_BETWEEN = _TOTALS.where(_STEPS_BETWEEN)
PARTITIONS_UNFINISHED_BETWEEN = _UNFINISHED.where(_STEPS_BETWEEN)

# --- versioned updates of an execution ----------------------------------------------------------


def _bound(columns: Sequence[str]) -> dict[str, Any]:
    return {name: bindparam(f"b_{name}") for name in columns}


#: The state an execution's versioned UPDATE writes (with the counters, for a step).
STATE_COLUMNS = ("start_time", "end_time", "status", "exit_code", "exit_message")


def _versioned_update(table: Any, key: Any, columns: Sequence[str]) -> Any:
    """UPDATE of one execution row at the version it was read with (optimistic locking)."""
    return (
        update(table)
        .where(key == bindparam("b_id"), table.c.version == bindparam("b_version"))
        .values(
            version=table.c.version + 1,
            last_updated=bindparam("b_last_updated"),
            **_bound(columns),
        )
    )


UPDATE_STEP = _versioned_update(
    STEP_EXECUTION, STEP_EXECUTION.c.step_execution_id, (*STATE_COLUMNS, *COUNTER_NAMES)
)
UPDATE_JOB = _versioned_update(JOB_EXECUTION, JOB_EXECUTION.c.job_execution_id, STATE_COLUMNS)
#: The write of a running status (STARTING, STARTED): a stop request (STOPPING, written by
#: anyone: see ``QueryProvider.request_stop``) survives it; an end (STOPPED, COMPLETED,
#: FAILED) is written with ``UPDATE_JOB`` and replaces it.
UPDATE_RUNNING_JOB = UPDATE_JOB.values(
    status=case(
        (JOB_EXECUTION.c.status == BatchStatus.STOPPING.value, JOB_EXECUTION.c.status),
        else_=bindparam("b_status"),
    )
)
#: The statuses ``UPDATE_RUNNING_JOB`` writes.
KEEPS_STOPPING = (BatchStatus.STARTING, BatchStatus.STARTED)

# --- inserts ------------------------------------------------------------------------------------

#: Inserts built once (SQLAlchemy renders the columns of the parameters each is executed with, and
#: reuses that compiled form): plain, and returning the new row's key where the database can.
INSERT = {
    t.name: insert(t)
    for t in (JOB_INSTANCE, JOB_EXECUTION, JOB_PARAMS, JOB_CONTEXT, STEP_EXECUTION, STEP_CONTEXT)
}
INSERT_RETURNING = {
    t.name: insert(t).returning(pk)
    for t, pk in (
        (JOB_INSTANCE, JOB_INSTANCE.c.job_instance_id),
        (JOB_EXECUTION, JOB_EXECUTION.c.job_execution_id),
        (STEP_EXECUTION, STEP_EXECUTION.c.step_execution_id),
    )
}
INSERT_STEPS_RETURNING_IN_ORDER = insert(STEP_EXECUTION).returning(
    STEP_EXECUTION.c.step_execution_id, sort_by_parameter_order=True
)
#: What a new job or step execution row sets beside its owner and name.
NEW_EXECUTION_STATE = (
    "create_time",
    "start_time",
    "status",
    "exit_code",
    "exit_message",
    "last_updated",
)
#: The columns a bulk creation of step executions sets (see ``create_step_executions``).
NEW_STEP_COLUMNS = (
    "version",
    "step_name",
    "job_execution_id",
    *NEW_EXECUTION_STATE,
    *COUNTER_NAMES,
)
NEW_CONTEXT_COLUMNS = ("step_execution_id", "short_context", "serialized_context")
CONTEXT_VALUE_COLUMNS = NEW_CONTEXT_COLUMNS[1:]
#: The columns ``create_job_execution`` sets.
NEW_EXECUTION_COLUMNS = ("version", "job_instance_id", *NEW_EXECUTION_STATE)

# --- reads --------------------------------------------------------------------------------------

SELECT_INSTANCE = select(JOB_INSTANCE).where(
    JOB_INSTANCE.c.job_name == bindparam("b_name"), JOB_INSTANCE.c.job_key == bindparam("b_key")
)
PARAMETER_COLUMNS = schema.PARAMETER_COLUMNS
#: What a job execution is read with: its instance's columns and its context.
EXECUTION_COLUMNS = (
    JOB_EXECUTION,
    JOB_INSTANCE.c.job_name,
    JOB_INSTANCE.c.job_key,
    JOB_INSTANCE.c.version.label("instance_version"),
    JOB_CONTEXT.c.short_context,
    JOB_CONTEXT.c.serialized_context,
)
#: One job execution by id with its parameters, a row per parameter (one with NULLs for none):
#: a worker reads each new job's execution on the way to its first partition's body.
SELECT_EXECUTION_WITH_PARAMS = (
    select(*EXECUTION_COLUMNS, *(JOB_PARAMS.c[name] for name in PARAMETER_COLUMNS))
    .join(JOB_INSTANCE, JOB_INSTANCE.c.job_instance_id == JOB_EXECUTION.c.job_instance_id)
    .outerjoin(JOB_CONTEXT, JOB_CONTEXT.c.job_execution_id == JOB_EXECUTION.c.job_execution_id)
    .outerjoin(JOB_PARAMS, JOB_PARAMS.c.job_execution_id == JOB_EXECUTION.c.job_execution_id)
    .where(JOB_EXECUTION.c.job_execution_id == bindparam("b_id"))
    .order_by(JOB_PARAMS.c.parameter_name)  # as the executions' read orders them (the collation's)
)

# --- contexts -----------------------------------------------------------------------------------

STEP_CONTEXT_VALUES = {
    "short_context": bindparam("b_short_context"),
    "serialized_context": bindparam("b_serialized_context"),
}
UPDATE_STEP_CONTEXT = (
    update(STEP_CONTEXT)
    .where(STEP_CONTEXT.c.step_execution_id == bindparam("b_id"))
    .values(**STEP_CONTEXT_VALUES)
)
UPDATE_JOB_CONTEXT = (
    update(JOB_CONTEXT)
    .where(JOB_CONTEXT.c.job_execution_id == bindparam("b_id"))
    .values(
        short_context=bindparam("b_short_context"),
        serialized_context=bindparam("b_serialized_context"),
    )
)
