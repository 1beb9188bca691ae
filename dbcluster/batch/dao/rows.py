"""Rows and records: a row read becomes a job instance, a job execution or a step execution, and a
record becomes the values its statements bind."""

from __future__ import annotations

from typing import Any

from dbcluster import schema
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import COUNTER_NAMES, JobExecution, JobInstance, StepExecution
from dbcluster.batch.parameters import JobParameter, JobParameters, parse_value
from dbcluster.batch.status import BatchStatus, ExitStatus

# --- records to values --------------------------------------------------------------------------


def new_step_row(
    name: str, job_execution_id: int | None, now: Any, started: bool
) -> dict[str, Any]:
    """The columns of a new step execution, STARTING (``started``: STARTED at ``now``)."""
    return {
        "version": 0,
        "step_name": name,
        "job_execution_id": job_execution_id,
        "create_time": now,
        "start_time": now if started else None,
        "status": (BatchStatus.STARTED if started else BatchStatus.STARTING).value,
        "exit_code": ExitStatus.EXECUTING.code,
        "exit_message": "",
        "last_updated": now,
        **{counter: 0 for counter in COUNTER_NAMES},
    }


def new_step(
    step_id: int,
    name: str,
    job_execution: JobExecution,
    context: ExecutionContext,
    now: Any,
    started: bool,
) -> StepExecution:
    """A step execution just created with :func:`new_step_row`'s columns."""
    return StepExecution(
        id=step_id,
        step_name=name,
        job_execution=job_execution,
        status=BatchStatus.STARTED if started else BatchStatus.STARTING,
        create_time=now,
        start_time=now if started else None,
        last_updated=now,
        execution_context=context,
        start_recorded=started,
        fresh=True,
    )


def parameter_rows(params: JobParameters) -> list[dict[str, Any]]:
    """The rows of a job execution's parameters (its id aside), in the parameters' order."""
    return [
        {
            "parameter_name": name,
            "parameter_type": p.type_name,
            "parameter_value": p.text,
            "identifying": p.identifying,
        }
        for name, p in params.parameters().items()
    ]


def first_step_values(name: str, now: Any, started: bool, context_text: str) -> dict[str, Any]:
    """The columns of a new execution's first step execution and of its context, each bound as
    ``s_<column>`` (see :func:`~dbcluster.batch.dao.combined.with_first_step`)."""
    return {
        f"s_{column}": value
        for column, value in {
            **new_step_row(name, None, now, started),
            **context_columns(context_text),
        }.items()
    }


def execution_values(execution: Any, now: Any) -> dict[str, Any]:
    """What an execution's versioned UPDATE binds (a step's counters aside)."""
    return {
        "b_id": execution.id,
        "b_version": execution.version,
        "b_last_updated": now,
        "b_start_time": execution.start_time,
        "b_end_time": execution.end_time,
        "b_status": execution.status.value,
        "b_exit_code": execution.exit_status.code,
        "b_exit_message": execution.exit_status.description,
    }


def context_values(execution_id: int, text: str) -> dict[str, Any]:
    """What a context's UPDATE binds."""
    columns = context_columns(text)
    return {
        "b_id": execution_id,
        "b_short_context": columns["short_context"],
        "b_serialized_context": columns["serialized_context"],
    }


def context_columns(context: ExecutionContext | str) -> dict[str, str | None]:
    """A context's two columns: all of it in the short one when it fits, else clipped there and
    whole in the long one."""
    text = context if isinstance(context, str) else context.to_json()
    if len(text) <= schema.SHORT_CONTEXT_LENGTH:
        return {"short_context": text, "serialized_context": None}
    return {
        "short_context": text[: schema.SHORT_CONTEXT_LENGTH - 3] + "...",
        "serialized_context": text,
    }


# --- rows to records ----------------------------------------------------------------------------


class Prefixed:
    """A row's columns whose names carry a prefix, read by their names without it."""

    __slots__ = ("_row", "_prefix")

    def __init__(self, row: Any, prefix: str) -> None:
        self._row, self._prefix = row, prefix

    def __getitem__(self, name: str) -> Any:
        return self._row[self._prefix + name]


def parameter_from(m: Any) -> JobParameter:
    """A job parameter from its row (type, value, identifying)."""
    return JobParameter(
        parse_value(m["parameter_type"], m["parameter_value"] or ""),
        identifying=bool(m["identifying"]),
    )


def instance_from(m: Any) -> JobInstance:
    """A job instance from its row."""
    return JobInstance(
        id=int(m["job_instance_id"]),
        job_name=m["job_name"],
        job_key=m["job_key"],
        version=int(m["version"]),
    )


def job_execution_from(m: Any, params: dict[str, JobParameter]) -> JobExecution:
    """A job execution from a row of :data:`~.statements.EXECUTION_COLUMNS` and its
    parameters."""
    return JobExecution(
        id=int(m["job_execution_id"]),
        job_instance=JobInstance(
            id=int(m["job_instance_id"]),
            job_name=m["job_name"],
            job_key=m["job_key"],
            version=int(m["instance_version"]),
        ),
        parameters=JobParameters(params),
        **execution_fields(m),
    )


def execution_fields(m: Any) -> dict[str, Any]:
    """What job and step execution rows share: status, exit status, times, version, context."""
    return {
        "status": BatchStatus(m["status"]),
        "exit_status": ExitStatus(m["exit_code"] or "UNKNOWN", m["exit_message"] or ""),
        "create_time": m["create_time"],
        "start_time": m["start_time"],
        "end_time": m["end_time"],
        "last_updated": m["last_updated"],
        "version": int(m["version"]),
        "execution_context": context_from(m["short_context"], m["serialized_context"]),
    }


def context_from(short: str | None, serialized: str | None) -> ExecutionContext:
    """A context from its two columns."""
    return ExecutionContext.from_json(serialized if serialized is not None else short)


def job_execution_from_row(row: Any, prefix: str) -> JobExecution | None:
    """A job execution from a row holding its columns, each under ``prefix`` + the name its read
    gives it, and its parameters as one array per parameter column in name order (a claim reads
    them with the partitions it won, where the database can); None where the row holds none."""
    if row.get(prefix + "job_execution_id") is None:
        return None
    params: dict[str, JobParameter] = {}
    if row[prefix + "parameter_name"] is not None:  # no parameters: NULL arrays
        arrays = [row[prefix + column] for column in schema.PARAMETER_COLUMNS]
        for name, kind, value, identifying in zip(*arrays, strict=True):
            params[name] = parameter_from(
                {"parameter_type": kind, "parameter_value": value, "identifying": identifying}
            )
    return job_execution_from(Prefixed(row, prefix), params)


def step_execution_from_row(row: Any, job_execution: JobExecution) -> StepExecution:
    """A step execution from a row holding its columns and its context's (a claim reads them
    with the partitions it won)."""
    return StepExecution(
        id=int(row["step_execution_id"]),
        step_name=row["step_name"],
        job_execution=job_execution,
        **execution_fields(row),
        **{counter: int(row[counter]) for counter in COUNTER_NAMES},
    )
