"""The job repository: every job and step execution recorded in SQL, on SQLAlchemy Core.

Every write method takes an optional ``conn``: given, it runs inside that connection's transaction
and does not commit; omitted, it runs in its own transaction. Updates are guarded by ``version``
(optimistic locking). Steps and jobs write through :attr:`JobRepository.transactions`, which
repeats transient errors and holds each execution's fence (see :mod:`dbcluster.batch.fence`).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Select,
    bindparam,
    case,
    exists,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError

from dbcluster import schema
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import (
    COUNTER_NAMES,
    JobExecution,
    JobInstance,
    PartitionsEnded,
    StepExecution,
    utcnow,
)
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.fence import FoldedGuard
from dbcluster.batch.parameters import JobParameter, JobParameters, parse_value
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.transactions import RetryPolicy, Transactions
from dbcluster.dialects.base import array_parameters
from dbcluster.inlists import in_batches
from dbcluster.prebuilt import Prebuilt, PrebuiltStatements

log = logging.getLogger(__name__)

_JI = schema.job_instance
_JE = schema.job_execution
_JP = schema.job_execution_params
_SE = schema.step_execution
_JC = schema.job_execution_context
_SC = schema.step_execution_context

#: The sums of :meth:`JobRepository.partitions_ended` over some step executions (one IN list;
#: or a run of consecutive ids): how many, how many COMPLETED, each counter's sum; and those of
#: them that did not complete.
_SOME_STEPS = _SE.c.step_execution_id.in_(bindparam("b_ids", expanding=True))
_STEPS_BETWEEN = _SE.c.step_execution_id.between(bindparam("b_low"), bindparam("b_high"))
_TOTALS = select(
    func.count(),
    # No bound value as the CASE's result: Db2 refuses an untyped marker in a function's
    # arguments.
    func.count(case((_SE.c.status == BatchStatus.COMPLETED.value, _SE.c.step_execution_id))),
    *(func.sum(_SE.c[name]) for name in COUNTER_NAMES),
)
_UNFINISHED = select(_SE.c.step_execution_id, _SE.c.step_name, _SE.c.status, _SE.c.exit_code).where(
    _SE.c.status != BatchStatus.COMPLETED.value
)
_PARTITION_TOTALS = _TOTALS.where(_SOME_STEPS)
_PARTITIONS_UNFINISHED = _UNFINISHED.where(_SOME_STEPS)
_PARTITION_TOTALS_BETWEEN = _TOTALS.where(_STEPS_BETWEEN)
_PARTITIONS_UNFINISHED_BETWEEN = _UNFINISHED.where(_STEPS_BETWEEN)

_RUNNING = [s.value for s in BatchStatus if s.is_running]


def _bound(columns: Sequence[str]) -> dict[str, Any]:
    return {name: bindparam(f"b_{name}") for name in columns}


#: The repository's hot UPDATEs, built once with bind parameters: SQLAlchemy then neither builds
#: them nor computes their cache keys again on every chunk (a rebuilt statement costs several
#: times its round trip).
#: The state an execution's versioned UPDATE writes (with the counters, for a step).
_STATE_COLUMNS = ("start_time", "end_time", "status", "exit_code", "exit_message")


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


_UPDATE_STEP = _versioned_update(_SE, _SE.c.step_execution_id, (*_STATE_COLUMNS, *COUNTER_NAMES))
_UPDATE_JOB = _versioned_update(_JE, _JE.c.job_execution_id, _STATE_COLUMNS)
#: The write of a running status (STARTING, STARTED): a stop request (STOPPING, written by
#: anyone: see ``QueryProvider.request_stop``) survives it; an end (STOPPED, COMPLETED,
#: FAILED) is written with ``_UPDATE_JOB`` and replaces it.
_UPDATE_RUNNING_JOB = _UPDATE_JOB.values(
    status=case(
        (_JE.c.status == BatchStatus.STOPPING.value, _JE.c.status),
        else_=bindparam("b_status"),
    )
)
_KEEPS_STOPPING = (BatchStatus.STARTING, BatchStatus.STARTED)
#: Inserts built once (SQLAlchemy renders the columns of the parameters each is executed with, and
#: reuses that compiled form): plain, and returning the new row's key where the database can.
_INSERT = {t.name: insert(t) for t in (_JI, _JE, _JP, _JC, _SE, _SC)}
_INSERT_RETURNING = {
    t.name: insert(t).returning(pk)
    for t, pk in (
        (_JI, _JI.c.job_instance_id),
        (_JE, _JE.c.job_execution_id),
        (_SE, _SE.c.step_execution_id),
    )
}
_INSERT_STEPS_RETURNING_IN_ORDER = insert(_SE).returning(
    _SE.c.step_execution_id, sort_by_parameter_order=True
)
_SELECT_INSTANCE = select(_JI).where(
    _JI.c.job_name == bindparam("b_name"), _JI.c.job_key == bindparam("b_key")
)
_PARAMETER_COLUMNS = schema.PARAMETER_COLUMNS
#: What a job execution is read with: its instance's columns and its context.
_EXECUTION_COLUMNS = (
    _JE,
    _JI.c.job_name,
    _JI.c.job_key,
    _JI.c.version.label("instance_version"),
    _JC.c.short_context,
    _JC.c.serialized_context,
)
#: One job execution by id with its parameters, a row per parameter (one with NULLs for none):
#: a worker reads each new job's execution on the way to its first partition's body.
_SELECT_EXECUTION_WITH_PARAMS = (
    select(*_EXECUTION_COLUMNS, *(_JP.c[name] for name in _PARAMETER_COLUMNS))
    .join(_JI, _JI.c.job_instance_id == _JE.c.job_instance_id)
    .outerjoin(_JC, _JC.c.job_execution_id == _JE.c.job_execution_id)
    .outerjoin(_JP, _JP.c.job_execution_id == _JE.c.job_execution_id)
    .where(_JE.c.job_execution_id == bindparam("b_id"))
    .order_by(_JP.c.parameter_name)  # as the executions' read orders them (the collation's)
)
_STEP_CONTEXT_VALUES = {
    "short_context": bindparam("b_short_context"),
    "serialized_context": bindparam("b_serialized_context"),
}
_UPDATE_STEP_CONTEXT = (
    update(_SC).where(_SC.c.step_execution_id == bindparam("b_id")).values(**_STEP_CONTEXT_VALUES)
)
_UPDATE_JOB_CONTEXT = (
    update(_JC)
    .where(_JC.c.job_execution_id == bindparam("b_id"))
    .values(
        short_context=bindparam("b_short_context"),
        serialized_context=bindparam("b_serialized_context"),
    )
)


def _provider(engine: Engine) -> Any:
    from dbcluster.dialects import get_provider

    return get_provider(engine)


#: What a new job or step execution row sets beside its owner and name.
_NEW_EXECUTION_STATE = (
    "create_time",
    "start_time",
    "status",
    "exit_code",
    "exit_message",
    "last_updated",
)
#: The columns a bulk creation of step executions sets (see ``create_step_executions``).
_NEW_STEP_COLUMNS = (
    "version",
    "step_name",
    "job_execution_id",
    *_NEW_EXECUTION_STATE,
    *COUNTER_NAMES,
)
_NEW_CONTEXT_COLUMNS = ("step_execution_id", "short_context", "serialized_context")
_CONTEXT_VALUE_COLUMNS = _NEW_CONTEXT_COLUMNS[1:]
#: The columns ``create_job_execution`` sets.
_NEW_EXECUTION_COLUMNS = ("version", "job_instance_id", *_NEW_EXECUTION_STATE)


def _execution_with_children(
    provider: Any, new_instance: bool = False, if_absent: bool = False
) -> Any | None:
    """A new job execution, its context and its parameters (as arrays) in one statement that
    returns its id, where the database can (None: three). With ``new_instance``, the statement
    creates the execution's instance first (parameters ``i_name``, ``i_key``) and also returns
    the instance's id; with ``if_absent`` too, it writes nothing and returns no row where that
    instance exists (None where the database cannot say so in the statement)."""
    if not provider.supports_array_insert:
        return None
    instance = None
    new_instance_row = insert(_JI)
    if if_absent:
        new_instance_row = provider.insert_unless_present(_JI, ("job_name", "job_key"))
        if new_instance_row is None:
            return None
    if not new_instance:
        execution = insert(_JE).values(
            {name: bindparam(name, type_=_JE.c[name].type) for name in _NEW_EXECUTION_COLUMNS}
        )
    else:
        instance = (
            new_instance_row.values(
                version=0, job_name=bindparam("i_name"), job_key=bindparam("i_key")
            )
            .returning(_JI.c.job_instance_id)
            .cte("dbc_instance")
        )
        columns = [name for name in _NEW_EXECUTION_COLUMNS if name != "job_instance_id"]
        execution = (
            insert(_JE)
            .from_select(
                ["job_instance_id", *columns],
                select(
                    instance.c.job_instance_id,
                    *(bindparam(name, type_=_JE.c[name].type) for name in columns),
                ),
            )
            .returning(_JE.c.job_instance_id)
        )
    statement = provider.insert_with_children(
        execution,
        _JE.c.job_execution_id,
        [
            (_JC, ("job_execution_id", *_CONTEXT_VALUE_COLUMNS), ()),
            (_JP, ("job_execution_id",), _PARAMETER_COLUMNS),
        ],
    )
    if statement is None or instance is None:
        return statement
    made = statement.selected_columns[0].table  # the execution's row, as the statement made it
    return statement.add_columns(made.c.job_instance_id)


def _with_first_step(statement: Any | None) -> Any | None:
    """``statement`` (a new execution's, its id its first column) also creating the execution's
    first step execution and that step's context (each column bound as ``s_<column>``), the
    step's id its last column; None for None. Where the statement writes no execution (its
    instance exists) it writes no step either."""
    if statement is None:
        return None
    made = statement.selected_columns[0].table  # the execution's row, as the statement made it
    columns = [name for name in _NEW_STEP_COLUMNS if name != "job_execution_id"]
    step = (
        insert(_SE)
        .from_select(
            ["job_execution_id", *columns],
            select(
                made.c.job_execution_id,
                *(bindparam(f"s_{name}", type_=_SE.c[name].type) for name in columns),
            ),
        )
        .returning(_SE.c.step_execution_id)
        .cte("dbc_step")
    )
    context = insert(_SC).from_select(
        list(_NEW_CONTEXT_COLUMNS),
        select(
            step.c.step_execution_id,
            *(bindparam(f"s_{name}", type_=_SC.c[name].type) for name in _CONTEXT_VALUE_COLUMNS),
        ),
    )
    # One row or none, as the execution's: a scalar subquery, not a second FROM.
    made_step = select(step.c.step_execution_id).scalar_subquery().label("first_step_id")
    return statement.add_cte(context.cte("dbc_step_context")).add_columns(made_step)


@dataclass
class Riders:
    """What a statement that creates a row also writes and reads, where the database can put it
    in that statement (PostgreSQL's data-modifying CTEs): a cluster master's ownership rows and
    the read of the live nodes its placement starts with, in a first launch's creating
    statement; a lone partition's row and its wake-up, in the statement that creates its step
    execution. Each is a round trip fewer before a partition can start.

    ``build(new_id, first_step_id, source)`` makes the INSERTs and the read: the INSERTs take
    their values from ``source`` (the new row, none where the statement created nothing: they
    then write nothing) and may use the two column expressions (the new row's id;
    ``first_step_id``, a new execution's first step's, is None where there is none); the read
    (or None) is any SELECT whose rows come back with the creation. It is called once per
    ``key``; ``params`` bind the rest. Afterwards, ``rows`` holds the read's rows (an empty list
    without a read) where they went with the creating statement, or None where they did not
    (the caller writes and reads them itself)."""

    key: Hashable
    build: Callable[[Any, Any, Any], tuple[Sequence[Any], Any | None]]
    params: Mapping[str, Any]
    rows: list[tuple[Any, ...]] | None = None


def _with_riders(statement: Any, riders: Riders, first_step: bool) -> tuple[Any, int]:
    """``statement`` (a new row's: a job execution's or a step execution's, its id its first
    column; with ``first_step``, the execution's first step's id its last) also running
    ``riders``' writes, and returning their read's rows joined to its own one row (none where
    it creates nothing; one with NULLs where the read finds nothing). Returns it with the
    number of its own columns."""
    columns = list(statement.selected_columns)
    made = columns[0].table  # the new row, as the statement made it
    step_id = columns[-1].element if first_step else None
    writes, read = riders.build(columns[0], step_id, made)
    if writes:
        statement = statement.add_cte(*(w.cte(f"dbc_rider{i}") for i, w in enumerate(writes)))
    if read is None:
        return statement, len(columns)
    # The statement's own CTEs stay at the top of the statement that embeds it.
    created = statement.subquery("dbc_created")
    found = read.subquery("dbc_read")
    return select(created, found).select_from(created.outerjoin(found, true())), len(columns)


def _new_step_row(
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


def _new_step(
    step_id: int,
    name: str,
    job_execution: JobExecution,
    context: ExecutionContext,
    now: Any,
    started: bool,
) -> StepExecution:
    """A step execution just created with :func:`_new_step_row`'s columns."""
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


def _also_writing_a_context(statement: Any | None) -> Any | None:
    """``statement`` (a SELECT, or an INSERT) also writing another step execution's context as
    :data:`_UPDATE_STEP_CONTEXT` does (its parameters), the number of contexts that wrote its
    last column (a partitioned step's own context, with its partitions' names, goes in the
    statement that creates them); None for None."""
    if statement is None:
        return None
    written = _UPDATE_STEP_CONTEXT.returning(_SC.c.step_execution_id).cte("dbc_other_context")
    count = select(func.count()).select_from(written).scalar_subquery().label("contexts_written")
    if isinstance(statement, Select):
        return statement.add_cte(written).add_columns(count)
    # An INSERT of many rows: as a CTE of a SELECT of the one count (not a count per row).
    return select(count).add_cte(statement.cte("dbc_rows"), written)


def _context_gone(execution: StepExecution) -> str:
    return (
        f"the context of step execution {execution.id} ({execution.step_name!r}) no longer exists"
    )


def _bulk_inserts(provider: Any) -> tuple[Any, Any] | None:
    """Step executions (returning their ids by name) and their contexts, each one statement
    of arrays for any number of rows, where the database can (None: executemany). Of the step
    executions only the names differ: every other column is one parameter for all the rows
    (a list of thousands of equal values costs the driver as much to send as the names)."""
    steps = provider.insert_from_arrays(
        _SE,
        ("step_name",),
        {
            name: bindparam(name, type_=_SE.c[name].type)
            for name in _NEW_STEP_COLUMNS
            if name != "step_name"
        },
    )
    contexts = provider.insert_from_arrays(_SC, _NEW_CONTEXT_COLUMNS)
    if steps is None or contexts is None:
        return None
    return steps.returning(_SE.c.step_execution_id, _SE.c.step_name), contexts


def _execution_values(execution: Any, now: Any) -> dict[str, Any]:
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


def _context_values(execution_id: int, text: str) -> dict[str, Any]:
    columns = _context_columns(text)
    return {
        "b_id": execution_id,
        "b_short_context": columns["short_context"],
        "b_serialized_context": columns["serialized_context"],
    }


def _context_columns(context: ExecutionContext | str) -> dict[str, str | None]:
    text = context if isinstance(context, str) else context.to_json()
    if len(text) <= schema.SHORT_CONTEXT_LENGTH:
        return {"short_context": text, "serialized_context": None}
    return {
        "short_context": text[: schema.SHORT_CONTEXT_LENGTH - 3] + "...",
        "serialized_context": text,
    }


class _Prefixed:
    """A row's columns whose names carry a prefix, read by their names without it."""

    __slots__ = ("_row", "_prefix")

    def __init__(self, row: Any, prefix: str) -> None:
        self._row, self._prefix = row, prefix

    def __getitem__(self, name: str) -> Any:
        return self._row[self._prefix + name]


def _parameter(m: Any) -> JobParameter:
    return JobParameter(
        parse_value(m["parameter_type"], m["parameter_value"] or ""),
        identifying=bool(m["identifying"]),
    )


def _job_execution_from(m: Any, params: dict[str, JobParameter]) -> JobExecution:
    """A job execution from a row of :data:`_EXECUTION_COLUMNS` and its parameters."""
    return JobExecution(
        id=int(m["job_execution_id"]),
        job_instance=JobInstance(
            id=int(m["job_instance_id"]),
            job_name=m["job_name"],
            job_key=m["job_key"],
            version=int(m["instance_version"]),
        ),
        parameters=JobParameters(params),
        **_execution_fields(m),
    )


def _execution_fields(m: Any) -> dict[str, Any]:
    """What job and step execution rows share: status, exit status, times, version, context."""
    return {
        "status": BatchStatus(m["status"]),
        "exit_status": ExitStatus(m["exit_code"] or "UNKNOWN", m["exit_message"] or ""),
        "create_time": m["create_time"],
        "start_time": m["start_time"],
        "end_time": m["end_time"],
        "last_updated": m["last_updated"],
        "version": int(m["version"]),
        "execution_context": _context_from_row(m["short_context"], m["serialized_context"]),
    }


def _context_from_row(short: str | None, serialized: str | None) -> ExecutionContext:
    return ExecutionContext.from_json(serialized if serialized is not None else short)


def _retried_read(method: Callable[..., Any]) -> Callable[..., Any]:
    """A read method that, when it runs on its own connection (no ``conn`` given), is repeated on
    transient errors under the repository's retry policy. Inside a caller's transaction it runs
    once: the caller's transaction decides."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def read(self: JobRepository, *args: Any, **kwargs: Any) -> Any:
        if signature.bind(self, *args, **kwargs).arguments.get("conn") is not None:
            return method(self, *args, **kwargs)
        return self.transactions.read(lambda: method(self, *args, **kwargs), method.__name__)

    return read


class JobRepository:
    """Creates, updates and finds job instances, job executions and step executions."""

    def __init__(
        self, engine: Engine, retry: RetryPolicy | None = None, *, reader: Engine | None = None
    ) -> None:
        self.engine = engine
        #: Where reads outside a caller's transaction run: an autocommit engine of the same
        #: database makes each statement one round trip (no BEGIN, no ROLLBACK).
        self.reader = reader or engine
        #: Step and job transactions, repeated on transient errors under ``retry``.
        self.transactions = Transactions(engine, retry)
        provider = _provider(engine)
        #: A step's row and context in one statement, where the database can (None: two).
        self._update_step_and_context = provider.update_step_and_context(
            _UPDATE_STEP, _UPDATE_STEP_CONTEXT, _STEP_CONTEXT_VALUES
        )
        #: Many step executions and contexts in two statements of arrays (None: executemany).
        self._bulk_inserts = _bulk_inserts(provider)
        #: One step execution and its context in one statement, returning its id (None: two).
        self._step_with_context = provider.insert_child_row(
            insert(_SE).values(
                {name: bindparam(name, type_=_SE.c[name].type) for name in _NEW_STEP_COLUMNS}
            ),
            _SE.c.step_execution_id,
            _SC,
            _NEW_CONTEXT_COLUMNS,
        )
        #: Those, writing another step's context too where the database can (None: apart).
        folds = provider.supports_writable_cte
        self._step_with_context_and_other = (
            _also_writing_a_context(self._step_with_context) if folds else None
        )
        self._bulk_contexts_and_other = (
            _also_writing_a_context(self._bulk_inserts[1])
            if folds and self._bulk_inserts is not None
            else None
        )
        #: A job execution with its context and parameters in one statement, returning its id
        #: (None: three).
        self._execution_with_children = _execution_with_children(provider)
        #: The same with its new instance first (None: the instance's INSERT, then those).
        self._instance_with_execution = _execution_with_children(provider, new_instance=True)
        #: The same, writing nothing where the instance exists (None: read first); and that
        #: with the execution's first step execution too.
        self._instance_if_absent = _execution_with_children(
            provider, new_instance=True, if_absent=True
        )
        self._instance_if_absent_with_step = _with_first_step(self._instance_if_absent)
        #: Builds a step's final write with its fence's guard in one statement (None: apart).
        self._fold = provider.fold_guard if provider.supports_writable_cte else None
        self._folded: dict[tuple[Any, bool], Any] = {}
        #: The launch's statements above, prebuilt (see :mod:`dbcluster.prebuilt`).
        self._prebuilt = PrebuiltStatements(engine.dialect)
        #: A creating statement with riders, per riders' key and statement (see :class:`Riders`).
        self._rides = provider.supports_writable_cte
        self._ridden: dict[tuple[Any, Any], tuple[Any, int]] = {}

    def _rows_riding(
        self,
        conn: Connection,
        statement: Any,
        params: Mapping[str, Any],
        riders: Riders | None,
        first_step: bool,
    ) -> list[Any]:
        """The rows of ``statement`` (a creating one, at most one row: see
        :func:`_with_riders`) run prebuilt, with ``riders`` in it where the database can: then
        its own columns of its row, and ``riders.rows`` the read's rows."""
        if riders is None or not self._rides:
            return self._prebuilt.rows(conn, statement, params)
        # Per statement too: a job with a first step and one without (a flow that starts with a
        # decision) have creating statements of different columns.
        shape = (riders.key, statement)
        ridden = self._ridden.get(shape)
        if ridden is None:
            ridden = self._ridden[shape] = _with_riders(statement, riders, first_step)
        ridden_statement, own = ridden
        rows = self._prebuilt.rows(conn, ridden_statement, {**params, **riders.params})
        if not rows:
            return []  # it created nothing: nothing rode
        # The read's rows, without the one of NULLs where it found nothing.
        riders.rows = [tuple(r)[own:] for r in rows if len(r) > own and r[own] is not None]
        return [tuple(rows[0])[:own]]

    def step_version_is(
        self, execution: StepExecution, version: int
    ) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit: the step execution's row carries ``version``. A row
        at any other version than that or the one before was written by someone else."""

        def verify(conn: Connection) -> bool:
            found = conn.execute(
                select(_SE.c.version).where(_SE.c.step_execution_id == execution.id)
            ).scalar_one_or_none()
            return self._judge_version(found, version, f"step execution {execution.id}")

        return verify

    def job_version_is(self, execution: JobExecution, version: int) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit of a job-execution write (see :meth:`step_version_is`)."""

        def verify(conn: Connection) -> bool:
            found = conn.execute(
                select(_JE.c.version).where(_JE.c.job_execution_id == execution.id)
            ).scalar_one_or_none()
            return self._judge_version(found, version, f"job execution {execution.id}")

        return verify

    @staticmethod
    def _judge_version(found: Any, version: int, what: str) -> bool:
        if found is not None and int(found) == version:
            return True
        if found is not None and int(found) == version - 1:
            return False
        raise OptimisticLockingFailureError(
            f"{what} is at version {found}, neither {version - 1} nor {version}: someone else "
            f"wrote it"
        )

    # --- plumbing ----------------------------------------------------------------------------

    @contextmanager
    def transaction(self, conn: Connection | None = None) -> Iterator[Connection]:
        """``conn`` itself if given (its transaction, not committed here), else a new transaction
        committed on exit."""
        if conn is not None:
            yield conn
        else:
            with self.engine.begin() as own:
                yield own

    @contextmanager
    def _read(self, conn: Connection | None) -> Iterator[Connection]:
        if conn is not None:
            yield conn
        else:
            with self.reader.connect() as own:
                yield own

    def _insert_id(self, conn: Connection, table: Any, pk: Any, values: dict[str, Any]) -> int:
        if conn.dialect.insert_returning:
            return int(conn.execute(_INSERT_RETURNING[table.name], values).scalar_one())
        result = conn.execute(_INSERT[table.name], values)
        return int(result.inserted_primary_key[0])

    # --- job instances -----------------------------------------------------------------------

    def create_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance:
        key = params.job_key()
        with self.transaction(conn) as c:
            new_id = self._insert_id(
                c, _JI, _JI.c.job_instance_id, {"job_name": job_name, "job_key": key, "version": 0}
            )
        return JobInstance(id=new_id, job_name=job_name, job_key=key, version=0)

    def get_or_create_job_instance(self, job_name: str, params: JobParameters) -> JobInstance:
        """The instance for these parameters; tolerates a concurrent creator."""
        found = self.get_job_instance(job_name, params)
        if found is not None:
            return found
        try:
            return self.create_job_instance(job_name, params)
        except IntegrityError:
            found = self.get_job_instance(job_name, params)
            if found is None:
                raise
            return found

    @_retried_read
    def get_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance | None:
        with self._read(conn) as c:
            row = c.execute(
                _SELECT_INSTANCE, {"b_name": job_name, "b_key": params.job_key()}
            ).first()
        return None if row is None else self._instance(row)

    @_retried_read
    def get_job_instance_by_id(
        self, instance_id: int, conn: Connection | None = None
    ) -> JobInstance | None:
        with self._read(conn) as c:
            row = c.execute(select(_JI).where(_JI.c.job_instance_id == instance_id)).first()
        return None if row is None else self._instance(row)

    def lock_job_instance(self, instance: JobInstance, conn: Connection) -> None:
        """Take the instance's row lock for the rest of ``conn``'s transaction (serializes launches
        of the same instance across processes)."""
        conn.execute(
            update(_JI)
            .where(_JI.c.job_instance_id == instance.id)
            .values(version=_JI.c.version + 1)
        )
        instance.version += 1

    @staticmethod
    def _instance(row: Row[Any]) -> JobInstance:
        m = row._mapping
        return JobInstance(
            id=int(m["job_instance_id"]),
            job_name=m["job_name"],
            job_key=m["job_key"],
            version=int(m["version"]),
        )

    # --- job executions ----------------------------------------------------------------------

    def create_job_execution(
        self,
        job_instance: JobInstance,
        params: JobParameters,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
        *,
        started: bool = False,
    ) -> JobExecution:
        """A new execution of the instance, STARTING; with ``started``, already STARTED (its
        start recorded in the creating transaction: ``start_recorded``)."""
        made = self._create_execution(job_instance, params, context, conn, started=started)
        assert made is not None  # made without if_absent
        return made

    def create_instance_and_execution(
        self,
        job_name: str,
        params: JobParameters,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
        *,
        started: bool = False,
    ) -> JobExecution:
        """A new instance of ``job_name`` for ``params`` and its first execution, as
        :meth:`create_job_instance` then :meth:`create_job_execution` (one statement where the
        database can: a first launch makes one round trip fewer). An instance created
        meanwhile by another launcher is an ``IntegrityError``, as it is for the former."""
        if self._instance_with_execution is None:
            with self.transaction(conn) as c:
                instance = self.create_job_instance(job_name, params, c)
                return self.create_job_execution(instance, params, context, c, started=started)
        made = self._create_execution(job_name, params, context, conn, started=started)
        assert made is not None  # made without if_absent
        return made

    @property
    def creates_instance_if_absent(self) -> bool:
        """Whether :meth:`create_instance_if_absent` can be asked (one statement, no read first)."""
        return self._instance_if_absent is not None

    def create_instance_if_absent(
        self,
        job_name: str,
        params: JobParameters,
        context: ExecutionContext | None,
        conn: Connection,
        *,
        started: bool = False,
        first_step: str | None = None,
        riders: Riders | None = None,
    ) -> JobExecution | None:
        """As :meth:`create_instance_and_execution` in one statement, without reading first
        whether the instance exists: None, having written nothing, where it exists (one that
        another launcher is committing meanwhile is waited for, and counts once committed). Only
        where :attr:`creates_instance_if_absent`. ``first_step``: the statement creates that
        step's execution too (empty context; with ``started``, STARTED), as
        :meth:`create_step_execution` would, left in the execution's ``prepared_steps``.
        ``riders``: go in the same statement where the database can (see :class:`Riders`)."""
        return self._create_execution(
            job_name,
            params,
            context,
            conn,
            started=started,
            if_absent=True,
            first_step=first_step,
            riders=riders,
        )

    def _create_execution(
        self,
        job_instance: JobInstance | str,
        params: JobParameters,
        context: ExecutionContext | None,
        conn: Connection | None,
        *,
        started: bool,
        if_absent: bool = False,
        first_step: str | None = None,
        riders: Riders | None = None,
    ) -> JobExecution | None:
        """``job_instance``: the instance, or the job's name when the statement creates it
        (``if_absent``: None, nothing written, where that instance exists; ``first_step``: and
        that step's execution with it; ``riders``: see :class:`Riders`)."""
        now = utcnow()
        context = context if context is not None else ExecutionContext()
        status = BatchStatus.STARTED if started else BatchStatus.STARTING
        exit_status = ExitStatus.EXECUTING if started else ExitStatus.UNKNOWN
        values: dict[str, Any] = {
            "version": 0,
            "create_time": now,
            "start_time": now if started else None,
            "status": status.value,
            "exit_code": exit_status.code,
            "exit_message": "",
            "last_updated": now,
        }
        if isinstance(job_instance, str):
            values.update(i_name=job_instance, i_key=params.job_key())
            together = self._instance_if_absent if if_absent else self._instance_with_execution
        else:
            values["job_instance_id"] = job_instance.id
            together = self._execution_with_children
        parameters = [
            {
                "parameter_name": name,
                "parameter_type": p.type_name,
                "parameter_value": p.text,
                "identifying": p.identifying,
            }
            for name, p in params.parameters().items()
        ]
        text = context.to_json()
        step_values: dict[str, Any] = {}
        if first_step is not None:
            assert if_absent, "a first step is created with an instance that did not exist"
            together = self._instance_if_absent_with_step
            step_context = ExecutionContext()
            step_text = step_context.to_json()
            step_values = {
                f"s_{name}": value
                for name, value in {
                    **_new_step_row(first_step, None, now, started),
                    **_context_columns(step_text),
                }.items()
            }
        if riders is not None:
            riders.rows = None  # not from an earlier try of the same transaction
        with self.transaction(conn) as c:
            if together is not None:
                rows = self._rows_riding(
                    c,
                    together,
                    {
                        **values,
                        **_context_columns(text),
                        **array_parameters(parameters, _PARAMETER_COLUMNS),
                        **step_values,
                    },
                    riders if if_absent else None,
                    first_step is not None,
                )
                row = rows[0] if rows else None
                if row is None:
                    if if_absent:
                        return None
                    raise AssertionError("a new execution's statement returned no row")
                new_id = int(row[0])
                if isinstance(job_instance, str):
                    job_instance = JobInstance(
                        id=int(row[1]), job_name=job_instance, job_key=values["i_key"], version=0
                    )
            else:
                assert isinstance(job_instance, JobInstance)
                new_id = self._insert_id(c, _JE, _JE.c.job_execution_id, values)
                if parameters:
                    c.execute(
                        _INSERT[_JP.name],
                        [{"job_execution_id": new_id, **row} for row in parameters],
                    )
                c.execute(_INSERT[_JC.name], {"job_execution_id": new_id, **_context_columns(text)})
        context.mark_saved(text)
        execution = JobExecution(
            id=new_id,
            job_instance=job_instance,
            parameters=params,
            status=status,
            exit_status=exit_status,
            create_time=now,
            start_time=now if started else None,
            last_updated=now,
            execution_context=context,
            start_recorded=started,
        )
        if first_step is not None:
            step_context.mark_saved(step_text)
            execution.prepared_steps[first_step] = _new_step(
                int(row[-1]), first_step, execution, step_context, now, started
            )
        return execution

    def update_job_execution(self, execution: JobExecution, conn: Connection | None = None) -> None:
        now = utcnow()
        with self.transaction(conn) as c:
            stmt = _UPDATE_RUNNING_JOB if execution.status in _KEEPS_STOPPING else _UPDATE_JOB
            if c.execute(stmt, _execution_values(execution, now)).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"job execution {execution.id} (version {execution.version}) was updated by "
                    f"someone else or no longer exists; reload it before updating"
                )
        execution.version += 1
        execution.last_updated = now

    def update_job_execution_context(
        self, execution: JobExecution, conn: Connection | None = None
    ) -> None:
        text = execution.execution_context.to_json()
        with self.transaction(conn) as c:
            if c.execute(_UPDATE_JOB_CONTEXT, _context_values(execution.id, text)).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"the context of job execution {execution.id} no longer exists"
                )
        execution.execution_context.mark_saved(text)

    @_retried_read
    def get_job_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> JobExecution | None:
        with self._read(conn) as c:
            rows = c.execute(_SELECT_EXECUTION_WITH_PARAMS, {"b_id": execution_id}).all()
        if not rows:
            return None
        params = {
            m["parameter_name"]: _parameter(m)
            for m in (row._mapping for row in rows)
            if m["parameter_name"] is not None
        }
        return _job_execution_from(rows[0]._mapping, params)

    @_retried_read
    def get_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        """Every execution of the instance, newest first."""
        with self._read(conn) as c:
            return self._job_executions(c, _JE.c.job_instance_id == job_instance.id)

    @_retried_read
    def get_last_job_execution(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobExecution | None:
        with self._read(conn) as c:
            instance = self.get_job_instance(job_name, params, c)
            if instance is None:
                return None
            found = self._job_executions(c, _JE.c.job_instance_id == instance.id, limit=1)
        return found[0] if found else None

    @_retried_read
    def get_last_job_instance_execution(
        self, job_name: str, conn: Connection | None = None
    ) -> JobExecution | None:
        """The newest execution of the job's newest instance (what an incrementer reads)."""
        with self._read(conn) as c:
            newest = c.execute(
                select(func.max(_JI.c.job_instance_id)).where(_JI.c.job_name == job_name)
            ).scalar_one_or_none()
            if newest is None:
                return None
            found = self._job_executions(c, _JE.c.job_instance_id == newest, limit=1)
        return found[0] if found else None

    @_retried_read
    def find_running_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        with self._read(conn) as c:
            return self._job_executions(
                c,
                _JE.c.job_instance_id == job_instance.id,
                _JE.c.status.in_(_RUNNING),
            )

    @_retried_read
    def find_failed_for(
        self, job_name: str, exit_codes: Sequence[str], conn: Connection | None = None
    ) -> list[JobExecution]:
        """The newest execution of each instance of ``job_name`` when it ended FAILED with one
        of ``exit_codes`` (what an automatic restart looks for)."""
        newer = _JE.alias("newer")
        with self._read(conn) as c:
            return self._job_executions(
                c,
                _JI.c.job_name == job_name,
                _JE.c.status == BatchStatus.FAILED.value,
                _JE.c.exit_code.in_(list(exit_codes)),
                ~exists().where(
                    newer.c.job_instance_id == _JE.c.job_instance_id,
                    newer.c.job_execution_id > _JE.c.job_execution_id,
                ),
            )

    @_retried_read
    def count_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> int:
        stmt = select(func.count()).select_from(_JE).where(_JE.c.job_instance_id == job_instance.id)
        with self._read(conn) as c:
            return int(c.execute(stmt).scalar_one())

    def _job_executions(
        self, c: Connection, *where: Any, limit: int | None = None
    ) -> list[JobExecution]:
        stmt = (
            select(*_EXECUTION_COLUMNS)
            .join(_JI, _JI.c.job_instance_id == _JE.c.job_instance_id)
            .outerjoin(_JC, _JC.c.job_execution_id == _JE.c.job_execution_id)
            .where(*where)
            .order_by(_JE.c.create_time.desc(), _JE.c.job_execution_id.desc())
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        rows = c.execute(stmt).all()
        if not rows:
            return []
        ids = [int(r._mapping["job_execution_id"]) for r in rows]
        params: dict[int, dict[str, JobParameter]] = {i: {} for i in ids}
        for batch in in_batches(ids):
            for p in c.execute(
                select(_JP)
                .where(_JP.c.job_execution_id.in_(batch))
                .order_by(_JP.c.job_execution_id, _JP.c.parameter_name)
            ).all():
                pm = p._mapping
                params[int(pm["job_execution_id"])][pm["parameter_name"]] = _parameter(pm)
        return [
            _job_execution_from(m, params[int(m["job_execution_id"])])
            for m in (row._mapping for row in rows)
        ]

    # --- step executions ---------------------------------------------------------------------

    def create_step_execution(
        self,
        job_execution: JobExecution,
        step_name: str,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
        *,
        started: bool = False,
    ) -> StepExecution:
        return self.create_step_executions(
            job_execution, [(step_name, context)], conn, started=started
        )[0]

    def create_step_executions(
        self,
        job_execution: JobExecution,
        steps: Sequence[tuple[str, ExecutionContext | None]],
        conn: Connection | None = None,
        *,
        started: bool = False,
        context_of: StepExecution | None = None,
        riders: Riders | None = None,
    ) -> list[StepExecution]:
        """Insert many step executions (e.g. a step's partitions) and their contexts in bulk;
        with ``started``, already STARTED (``start_recorded``: the step writes no start).
        ``context_of``: also write that step execution's context, as
        :meth:`update_step_execution_context` does (in the same statement where the database
        can: a partitioned step's own context, naming its partitions). ``riders``: for one step
        execution, go in the statement that creates it where the database can (see
        :class:`Riders`)."""
        if riders is not None:
            riders.rows = None  # not from an earlier try of the same transaction
        if not steps:
            if context_of is not None:
                self.update_step_execution_context(context_of, conn)
            return []
        names = [name for name, _ in steps]
        if len(set(names)) != len(names):
            raise ValueError("step execution names created together must be unique")
        now = utcnow()
        rows = [_new_step_row(name, job_execution.id, now, started) for name in names]
        contexts = [ctx if ctx is not None else ExecutionContext() for _, ctx in steps]
        texts = [ctx.to_json() for ctx in contexts]
        context_rows = [_context_columns(text) for text in texts]
        bulk = self._bulk_inserts if len(rows) > 1 else None
        contexts_written = bulk is not None
        other: dict[str, Any] = {}
        other_text = None
        if context_of is not None:
            other_text = context_of.execution_context.to_json()
            other = _context_values(context_of.id, other_text)
        other_written: int | None = None  # None: not written yet
        with self.transaction(conn) as c:
            if bulk is not None:
                insert_steps, insert_contexts = bulk
                shared = {k: v for k, v in rows[0].items() if k != "step_name"}
                got = {
                    row[1]: int(row[0])
                    for row in self._prebuilt.rows(
                        c, insert_steps, {"a_step_name": names, **shared}
                    )
                }
                ids = [got[name] for name in names]
                folded = self._bulk_contexts_and_other if other else None
                written = self._prebuilt.rows(
                    c,
                    folded if folded is not None else insert_contexts,
                    {
                        "a_step_execution_id": ids,
                        **array_parameters(context_rows, _NEW_CONTEXT_COLUMNS[1:]),
                        **other,
                    },
                )
                if folded is not None:
                    other_written = int(written[0][-1])
            elif len(rows) == 1 and self._step_with_context is not None:
                one = {**rows[0], **context_rows[0], **other}
                folded = self._step_with_context_and_other if other else None
                statement = folded if folded is not None else self._step_with_context
                (row,) = self._rows_riding(c, statement, one, riders, False)
                ids = [int(row[0])]
                if folded is not None:
                    other_written = int(row[-1])
                contexts_written = True
            elif len(rows) == 1:
                ids = [self._insert_id(c, _SE, _SE.c.step_execution_id, rows[0])]
            elif c.dialect.insert_executemany_returning_sort_by_parameter_order:
                ids = [int(i) for i in c.execute(_INSERT_STEPS_RETURNING_IN_ORDER, rows).scalars()]
            else:
                c.execute(_INSERT[_SE.name], rows)
                by_name: dict[str, int] = {}
                for batch in in_batches(names):
                    for row in c.execute(
                        select(_SE.c.step_execution_id, _SE.c.step_name).where(
                            _SE.c.job_execution_id == job_execution.id,
                            _SE.c.step_name.in_(batch),
                        )
                    ).all():
                        by_name[row[1]] = max(by_name.get(row[1], 0), int(row[0]))
                ids = [by_name[name] for name in names]
            if not contexts_written:
                c.execute(
                    _INSERT[_SC.name],
                    [
                        {"step_execution_id": i, **columns}
                        for i, columns in zip(ids, context_rows, strict=True)
                    ],
                )
            if context_of is not None:
                if other_written is None:
                    self._write_step_context(c, context_of, other)
                elif other_written != 1:
                    raise OptimisticLockingFailureError(_context_gone(context_of))
        if context_of is not None:
            assert other_text is not None
            context_of.execution_context.mark_saved(other_text)
        result = []
        for step_id, name, ctx, text in zip(ids, names, contexts, texts, strict=True):
            ctx.mark_saved(text)
            result.append(_new_step(step_id, name, job_execution, ctx, now, started))
        return result

    @property
    def folds_guards(self) -> bool:
        """Whether :meth:`update_step_execution` runs a fence's guard in its own statement."""
        return self._fold is not None

    def _folded_write(self, guard: Any, context: bool, then: bool, dialect: Any) -> Any:
        """The final write folded with ``guard``, built once and, where it can be, prebuilt
        (see :mod:`dbcluster.prebuilt`: for the partition's final write with the claim of the
        next, SQLAlchemy's per-execution cache lookup cost more than the round trip)."""
        key = (guard, context, then)
        found = self._folded.get(key)
        if found is None:
            assert self._fold is not None
            statement = self._fold(
                guard, _UPDATE_STEP, _UPDATE_STEP_CONTEXT if context else None, claim_next=then
            )
            found = self._folded[key] = Prebuilt.build(statement, dialect) or statement
        return found

    def update_step_execution(
        self,
        execution: StepExecution,
        conn: Connection | None = None,
        *,
        context: bool = False,
        guard: FoldedGuard | None = None,
    ) -> None:
        """Persist status, exit status, times and counters; bumps ``version``. ``context``: its
        execution context too, in the same transaction (in the same statement where the
        database can: a chunk's bookkeeping is then one round trip). ``guard``: the fence's
        final guarded write, run first in the same statement (only where
        :attr:`folds_guards`); it raises the guard's refusal when the guard changed no row."""
        combined = self._update_step_and_context if context else None
        now = utcnow()
        values = _execution_values(execution, now)
        for name in COUNTER_NAMES:
            values[f"b_{name}"] = getattr(execution, name)
        text = None
        if context:
            text = execution.execution_context.to_json()
            values.update(_context_values(execution.id, text))
        with self.transaction(conn) as c:
            if guard is not None:
                then = guard.then_params is not None
                params = {**values, **guard.params, **(guard.then_params or {})}
                write = self._folded_write(guard.statement, context, then, c.dialect)
                if isinstance(write, Prebuilt):
                    row = write.one(c, params)
                else:
                    row = c.execute(write, params).one()
                if row.guarded != 1:
                    raise guard.refused()
                refused = row.written != 1
                if then and not refused and guard.took is not None:
                    guard.took(row._mapping)
            elif combined is not None:  # both rows or neither: 0 is a refusal
                refused = c.execute(combined, values).rowcount == 0
            else:
                if context:
                    self._write_step_context(c, execution, values)
                refused = c.execute(_UPDATE_STEP, values).rowcount != 1
            if refused:
                one_statement = combined is not None or (guard is not None and context)
                raise OptimisticLockingFailureError(
                    f"step execution {execution.id} ({execution.step_name!r}, version "
                    f"{execution.version}) was updated by someone else"
                    f"{' or its context no longer exists' if one_statement else ''}; "
                    f"this update was refused"
                )
        execution.version += 1
        execution.last_updated = now
        if text is not None:
            execution.execution_context.mark_saved(text)

    def update_step_execution_context(
        self, execution: StepExecution, conn: Connection | None = None
    ) -> None:
        text = execution.execution_context.to_json()
        with self.transaction(conn) as c:
            self._write_step_context(c, execution, _context_values(execution.id, text))
        execution.execution_context.mark_saved(text)

    @staticmethod
    def _write_step_context(conn: Connection, execution: StepExecution, values: Any) -> None:
        if conn.execute(_UPDATE_STEP_CONTEXT, values).rowcount != 1:
            raise OptimisticLockingFailureError(_context_gone(execution))

    def fail_running(
        self,
        message: str,
        conn: Connection,
        *,
        job_execution_id: int | None = None,
        step_execution_id: int | None = None,
        step_execution_ids: Sequence[int] | None = None,
        exit_code: str = "FAILED",
        status: BatchStatus = BatchStatus.FAILED,
    ) -> int:
        """Mark FAILED, from outside the process that ran it, what is still running: one step
        execution, every step execution of a job execution, or (with only
        ``job_execution_id`` and no steps wanted, see :meth:`fail_running_job`) nothing else.
        Returns the rows changed. ``status`` STOPPED (with exit code STOPPED): the end of
        partitions of a stopped job that no node runs. The caller holds the owner rows first
        (the partition's, the job's coordination row), so no writer of these rows can be
        mid-transaction."""
        where = [_SE.c.status.in_(_RUNNING)]
        if step_execution_id is not None:
            where.append(_SE.c.step_execution_id == step_execution_id)
        if step_execution_ids is not None:
            where.append(_SE.c.step_execution_id.in_(list(step_execution_ids)))
        if job_execution_id is not None:
            where.append(_SE.c.job_execution_id == job_execution_id)
        now = utcnow()
        return conn.execute(
            update(_SE)
            .where(*where)
            .values(
                status=status.value,
                exit_code=exit_code,
                exit_message=message,
                end_time=now,
                last_updated=now,
                version=_SE.c.version + 1,
            )
        ).rowcount

    def fail_running_job(
        self, job_execution_id: int, message: str, conn: Connection, exit_code: str = "FAILED"
    ) -> bool:
        """Mark a job execution FAILED if it is still running (see :meth:`fail_running`)."""
        now = utcnow()
        return (
            conn.execute(
                update(_JE)
                .where(_JE.c.job_execution_id == job_execution_id, _JE.c.status.in_(_RUNNING))
                .values(
                    status=BatchStatus.FAILED.value,
                    exit_code=exit_code,
                    exit_message=message,
                    end_time=now,
                    last_updated=now,
                    version=_JE.c.version + 1,
                )
            ).rowcount
            == 1
        )

    @_retried_read
    def get_step_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> StepExecution | None:
        """One step execution with its context, its job execution and that job's parameters."""
        with self._read(conn) as c:
            job_id = c.execute(
                select(_SE.c.job_execution_id).where(_SE.c.step_execution_id == execution_id)
            ).scalar_one_or_none()
            if job_id is None:
                return None
            job_execution = self._job_executions(c, _JE.c.job_execution_id == job_id)[0]
            found = self._step_executions(c, job_execution, _SE.c.step_execution_id == execution_id)
        return found[0] if found else None

    @_retried_read
    def step_execution_exists(self, execution_id: int, conn: Connection | None = None) -> bool:
        with self._read(conn) as c:
            return (
                c.execute(
                    select(_SE.c.step_execution_id).where(_SE.c.step_execution_id == execution_id)
                ).first()
                is not None
            )

    @_retried_read
    def get_step_executions_by_ids(
        self, job_execution: JobExecution, ids: Sequence[int], conn: Connection | None = None
    ) -> list[StepExecution]:
        """Step executions of one job execution, reloaded, in the order of ``ids``."""
        found: dict[int, StepExecution] = {}
        with self._read(conn) as c:
            for batch in in_batches(ids):
                for se in self._step_executions(
                    c, job_execution, _SE.c.step_execution_id.in_(batch)
                ):
                    found[se.id] = se
        return [found[i] for i in ids if i in found]

    @_retried_read
    def partitions_ended(
        self, ids: Sequence[int], conn: Connection | None = None
    ) -> PartitionsEnded:
        """What a partitioned step aggregates of the step executions ``ids`` (its partitions,
        all ended): one statement of sums (per IN list; one for all where the ids are one run of
        consecutive numbers, as the partitions a launch created together mostly are), and a read
        of the ones that did not complete only where there are some. Their contexts are not
        read."""
        count = 0
        counters = dict.fromkeys(COUNTER_NAMES, 0)
        unfinished: list[tuple[int, str, BatchStatus, str]] = []
        ordered = sorted(set(ids))
        if ordered and ordered[-1] - ordered[0] == len(ordered) - 1:
            where: list[tuple[Any, Any, dict[str, Any]]] = [
                (
                    _PARTITION_TOTALS_BETWEEN,
                    _PARTITIONS_UNFINISHED_BETWEEN,
                    {"b_low": ordered[0], "b_high": ordered[-1]},
                )
            ]
        else:
            where = [
                (_PARTITION_TOTALS, _PARTITIONS_UNFINISHED, {"b_ids": batch})
                for batch in in_batches(ordered)
            ]
        with self._read(conn) as c:
            for totals_of, unfinished_of, params in where:
                totals = c.execute(totals_of, params).one()
                count += int(totals[0])
                for name, value in zip(COUNTER_NAMES, totals[2:], strict=True):
                    counters[name] += int(value or 0)
                if int(totals[1] or 0) < int(totals[0]):
                    unfinished.extend(
                        (int(r[0]), r[1], BatchStatus(r[2]), r[3] or "UNKNOWN")
                        for r in c.execute(unfinished_of, params)
                    )
        unfinished.sort(key=lambda r: r[0])
        return PartitionsEnded(count, counters, tuple(r[1:] for r in unfinished))

    @_retried_read
    def get_step_executions(
        self, job_execution: JobExecution, conn: Connection | None = None
    ) -> list[StepExecution]:
        """Every step execution of a job execution, oldest first."""
        with self._read(conn) as c:
            return self._step_executions(
                c, job_execution, _SE.c.job_execution_id == job_execution.id
            )

    def get_last_step_execution(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> StepExecution | None:
        """The newest execution of ``step_name`` in any execution of the instance."""
        return self.get_last_step_executions(job_instance, [step_name], conn).get(step_name)

    @_retried_read
    def get_last_step_executions(
        self,
        job_instance: JobInstance,
        step_names: Sequence[str],
        conn: Connection | None = None,
        before_job_execution_id: int | None = None,
    ) -> dict[str, StepExecution]:
        """The newest execution of each named step in the instance (optionally only those of job
        executions older than ``before_job_execution_id``)."""
        result: dict[str, StepExecution] = {}
        with self._read(conn) as c:
            jobs: dict[int, JobExecution] = {}
            for batch in in_batches(step_names):
                where = [
                    _JE.c.job_instance_id == job_instance.id,
                    _SE.c.step_name.in_(batch),
                ]
                if before_job_execution_id is not None:
                    where.append(_SE.c.job_execution_id < before_job_execution_id)
                rows = c.execute(
                    select(_SE.c.step_execution_id, _SE.c.step_name, _SE.c.job_execution_id)
                    .join(_JE, _JE.c.job_execution_id == _SE.c.job_execution_id)
                    .where(*where)
                ).all()
                newest: dict[str, tuple[int, int]] = {}
                for step_id, name, job_id in rows:
                    if name not in newest or int(step_id) > newest[name][0]:
                        newest[name] = (int(step_id), int(job_id))
                by_job: dict[int, list[int]] = {}
                for step_id, job_id in newest.values():
                    by_job.setdefault(job_id, []).append(step_id)
                for job_id, step_ids in by_job.items():
                    if job_id not in jobs:
                        jobs[job_id] = self._job_executions(c, _JE.c.job_execution_id == job_id)[0]
                    for se in self._step_executions(
                        c, jobs[job_id], _SE.c.step_execution_id.in_(step_ids)
                    ):
                        result[se.step_name] = se
        return result

    @_retried_read
    def count_step_executions(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> int:
        stmt = (
            select(func.count())
            .select_from(_SE.join(_JE, _JE.c.job_execution_id == _SE.c.job_execution_id))
            .where(_JE.c.job_instance_id == job_instance.id, _SE.c.step_name == step_name)
        )
        with self._read(conn) as c:
            return int(c.execute(stmt).scalar_one())

    @staticmethod
    def job_execution_from_row(row: Any, prefix: str) -> JobExecution | None:
        """A job execution from a row holding its columns, each under ``prefix`` + the name its
        read gives it, and its parameters as one array per parameter column in name order (a
        claim reads them with the partitions it won, where the database can); None where the
        row holds none."""
        if row.get(prefix + "job_execution_id") is None:
            return None
        params: dict[str, JobParameter] = {}
        if row[prefix + "parameter_name"] is not None:  # no parameters: NULL arrays
            arrays = [row[prefix + column] for column in _PARAMETER_COLUMNS]
            for name, kind, value, identifying in zip(*arrays, strict=True):
                params[name] = _parameter(
                    {"parameter_type": kind, "parameter_value": value, "identifying": identifying}
                )
        return _job_execution_from(_Prefixed(row, prefix), params)

    @staticmethod
    def step_execution_from_row(row: Any, job_execution: JobExecution) -> StepExecution:
        """A step execution from a row holding its columns and its context's (a claim reads
        them with the partitions it won)."""
        return StepExecution(
            id=int(row["step_execution_id"]),
            step_name=row["step_name"],
            job_execution=job_execution,
            **_execution_fields(row),
            **{counter: int(row[counter]) for counter in COUNTER_NAMES},
        )

    def _step_executions(
        self, c: Connection, job_execution: JobExecution, *where: Any
    ) -> list[StepExecution]:
        stmt = (
            select(_SE, _SC.c.short_context, _SC.c.serialized_context)
            .outerjoin(_SC, _SC.c.step_execution_id == _SE.c.step_execution_id)
            .where(*where)
            .order_by(_SE.c.step_execution_id)
        )
        return [
            self.step_execution_from_row(row._mapping, job_execution)
            for row in c.execute(stmt).all()
        ]
