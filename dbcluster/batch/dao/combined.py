"""The statements a database can combine into one round trip, built once per repository.

Each is built from the repository's query provider, and is None where the database cannot say it
in one statement: the DAOs then send its parts one by one. A combined statement runs prebuilt
where it can (see :mod:`dbcluster.prebuilt`). Three kinds:

- a record and its children in one statement (a job execution, its context and parameters, even
  its instance and first step execution; a step execution and its context; a step's row and
  context);
- a step's final write with its fence's guard first (:meth:`CombinedStatements.run_guarded_write`,
  the provider's ``fold_guard``);
- a caller's own writes and read carried by a creating statement (:class:`InsertExtras`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, bindparam, func, insert, literal_column, select, true
from sqlalchemy.exc import DBAPIError

from dbcluster.batch.dao.statements import (
    CONTEXT_VALUE_COLUMNS,
    JOB_CONTEXT,
    JOB_EXECUTION,
    JOB_INSTANCE,
    JOB_PARAMS,
    NEW_CONTEXT_COLUMNS,
    NEW_EXECUTION_COLUMNS,
    NEW_STEP_COLUMNS,
    PARAMETER_COLUMNS,
    STATE_COLUMNS,
    STEP_CONTEXT,
    STEP_CONTEXT_VALUES,
    STEP_EXECUTION,
    UPDATE_STEP,
    UPDATE_STEP_CONTEXT,
)
from dbcluster.batch.domain import COUNTER_NAMES
from dbcluster.batch.fence import FoldedGuard
from dbcluster.prebuilt import Prebuilt, PrebuiltStatements, driver_pipelines


@dataclass
class InsertExtras:
    """What a statement that creates a row also writes and reads, in that statement where the
    database can (PostgreSQL's data-modifying CTEs): a cluster master's ownership rows and the
    read of the live nodes its placement starts with, in a first launch's creating statement; a
    lone partition's row and its wake-up, in the statement that creates its step execution.
    Each is a round trip fewer before a partition can start.

    ``build(new_id, first_step_id, source)`` makes the INSERTs and the read: the INSERTs take
    their values from ``source`` (the new row, none where the statement created nothing: they
    then write nothing) and may use the two column expressions (the new row's id;
    ``first_step_id``, a new execution's first step's, is None where there is none); the read
    (or None) is any SELECT whose rows come back with the creation. It is called once per
    ``key``; ``params`` bind the rest. Afterwards, ``rows`` holds the read's rows (an empty list
    without a read) where they went with the creating statement, or None where they did not
    (the caller writes and reads them itself).

    Formerly ``Riders`` (still importable under that name from
    :mod:`dbcluster.batch.repository`); the repository's and the launcher's ``riders=``
    arguments take one."""

    key: Hashable
    build: Callable[[Any, Any, Any], tuple[Sequence[Any], Any | None]]
    params: Mapping[str, Any]
    rows: list[tuple[Any, ...]] | None = None


class CombinedStatements:
    """One repository's combined statements (see the module docstring), and what runs them."""

    def __init__(self, provider: Any, dialect: Any) -> None:
        #: A step's row and context in one statement, where the database can (None: two).
        self.update_step_and_context = provider.update_step_and_context(
            UPDATE_STEP, UPDATE_STEP_CONTEXT, STEP_CONTEXT_VALUES
        )
        #: Many step executions and contexts in two statements of arrays (None: executemany).
        self.bulk_inserts = bulk_inserts(provider)
        #: A group's final writes of many step executions and of their contexts, each one
        #: statement of arrays (None: executemany).
        self.bulk_updates = bulk_updates(provider)
        #: One step execution and its context in one statement, returning its id (None: two).
        self.step_with_context = provider.insert_child_row(
            insert(STEP_EXECUTION).values(
                {
                    name: bindparam(name, type_=STEP_EXECUTION.c[name].type)
                    for name in NEW_STEP_COLUMNS
                }
            ),
            STEP_EXECUTION.c.step_execution_id,
            STEP_CONTEXT,
            NEW_CONTEXT_COLUMNS,
        )
        #: Those, writing another step's context too where the database can (None: apart).
        folds = provider.supports_writable_cte
        self.step_with_context_and_other = (
            also_writing_a_context(self.step_with_context) if folds else None
        )
        self.bulk_contexts_and_other = (
            also_writing_a_context(self.bulk_inserts[1])
            if folds and self.bulk_inserts is not None
            else None
        )
        #: A job execution with its context and parameters in one statement, returning its id
        #: (None: three).
        self.execution_with_children = execution_with_children(provider)
        #: The same with its new instance first (None: the instance's INSERT, then those).
        self.instance_with_execution = execution_with_children(provider, new_instance=True)
        #: The same, writing nothing where the instance exists (None: read first); and that
        #: with the execution's first step execution too.
        self.instance_if_absent = execution_with_children(
            provider, new_instance=True, if_absent=True
        )
        self.instance_if_absent_with_step = with_first_step(self.instance_if_absent)
        #: Builds a step's final write with its fence's guard first, in one statement (None:
        #: the guard and the write go apart).
        self._build_guarded_write = provider.fold_guard if provider.supports_writable_cte else None
        self._guarded_writes: dict[tuple[Any, bool, bool], Any] = {}
        self.provider = provider
        #: Whether that statement fails when its guard or its write is refused (the provider's
        #: ``refusal``): it may then be sent with the ``COMMIT``, where the driver pipelines.
        self.refuses = (
            folds and provider.refusal(literal_column("0"), literal_column("0")) is not None
        )
        #: Only where an unclear commit can be settled by ending the session that sent it:
        #: not behind a pooler in transaction mode (``keeps_session`` False), where the server
        #: session passes from client to client (``Transactions``' settling).
        self.commits_with_final_write = (
            self.refuses and driver_pipelines(dialect) and provider.keeps_session
        )
        #: The statements above, prebuilt (see :mod:`dbcluster.prebuilt`).
        self.prebuilt = PrebuiltStatements(dialect)
        #: Whether a creating statement can carry :class:`InsertExtras`; and each one that does,
        #: per extras' key and statement.
        self._takes_extras = provider.supports_writable_cte
        self._with_extras: dict[tuple[Any, Any], tuple[Any, int]] = {}

    def rows(self, conn: Connection, statement: Any, params: Mapping[str, Any]) -> list[Any]:
        """The rows of ``statement``, run prebuilt where it can be."""
        return self.prebuilt.rows(conn, statement, params)

    def rows_with_extras(
        self,
        conn: Connection,
        statement: Any,
        params: Mapping[str, Any],
        extras: InsertExtras | None,
        first_step: bool,
    ) -> list[Any]:
        """The rows of ``statement`` (a creating one, at most one row: see :func:`with_extras`)
        run prebuilt, with ``extras`` in it where the database can: then its own columns of its
        row, and ``extras.rows`` the read's rows."""
        if extras is None or not self._takes_extras:
            return self.prebuilt.rows(conn, statement, params)
        # Per statement too: a job with a first step and one without (a flow that starts with a
        # decision) have creating statements of different columns.
        shape = (extras.key, statement)
        built = self._with_extras.get(shape)
        if built is None:
            built = self._with_extras[shape] = with_extras(statement, extras, first_step)
        statement_with_extras, own = built
        rows = self.prebuilt.rows(conn, statement_with_extras, {**params, **extras.params})
        if not rows:
            return []  # it created nothing: nothing went with it
        # The read's rows, without the one of NULLs where it found nothing.
        extras.rows = [tuple(r)[own:] for r in rows if len(r) > own and r[own] is not None]
        return [tuple(rows[0])[:own]]

    @property
    def folds_guards(self) -> bool:
        """Whether a step's final write can run a fence's guard in its own statement."""
        return self._build_guarded_write is not None

    def guarded_write(self, guard: Any, context: bool, then: bool, dialect: Any) -> Any:
        """A step's final write with ``guard`` first, built once and, where it can be, prebuilt
        (see :mod:`dbcluster.prebuilt`: for the partition's final write with the claim of the
        next, SQLAlchemy's per-execution cache lookup cost more than the round trip)."""
        key = (guard, context, then)
        found = self._guarded_writes.get(key)
        if found is None:
            assert self._build_guarded_write is not None
            statement = self._build_guarded_write(
                guard, UPDATE_STEP, UPDATE_STEP_CONTEXT if context else None, claim_next=then
            )
            found = self._guarded_writes[key] = Prebuilt.build(statement, dialect) or statement
        return found

    def run_guarded_write(
        self,
        conn: Connection,
        guard: FoldedGuard,
        values: Mapping[str, Any],
        context: bool,
        *,
        stale: Callable[[], Exception],
        written: Callable[[], None],
        defer: Callable[[Callable[[], None]], bool] | None = None,
    ) -> bool | None:
        """Run a step's final write (``values``; with ``context``, its context's too) with its
        fence's ``guard`` first, in one statement; raise the guard's refusal where the guard
        changed no row. Returns whether the step's write was refused (its version moved, or its
        context is gone: ``stale()`` is the error), having called ``written()`` where it was
        not.

        Where the statement fails when refused (``refuses``), runs prebuilt and the driver
        pipelines, it is handed to the transaction's end (``defer``: see
        ``Transactions.close_with``) and sent with the ``COMMIT`` in one round trip: the
        partition row is then taken in the very flight that commits, and a refusal fails the
        statement, so the ``COMMIT`` behind it never runs. Then None is returned, and
        ``written()`` is called just before that flight (a commit whose acknowledgement is lost
        may be found to have landed, with no row to read; a failure restores the step)."""
        then = guard.then_params is not None
        params = {**values, **guard.params, **(guard.then_params or {})}
        write = self.guarded_write(guard.statement, context, then, conn.dialect)

        def run(commit: bool) -> Any:
            try:
                if not isinstance(write, Prebuilt):
                    return conn.execute(write, params).one()
                row = write.one_committing(conn, params) if commit else None
                return write.one(conn, params) if row is None else row
            except DBAPIError as error:
                counts = self.provider.refusal_of(error) if self.refuses else None
                if counts is None:
                    raise
                raise (guard.refused() if counts[0] != 1 else stale()) from None

        def took(row: Any) -> None:
            if then and guard.took is not None:
                guard.took(row._mapping)

        def closing() -> None:
            written()
            row = run(commit=True)
            if row.guarded != 1 or row.written != 1:
                raise guard.refused() if row.guarded != 1 else stale()
            took(row)

        if (
            self.commits_with_final_write
            and defer is not None
            and isinstance(write, Prebuilt)
            and defer(closing)
        ):
            return None
        row = run(commit=False)
        if row.guarded != 1:
            raise guard.refused()
        refused: bool = row.written != 1
        if not refused:
            took(row)
            written()
        return refused


def execution_with_children(
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
    new_instance_row = insert(JOB_INSTANCE)
    if if_absent:
        new_instance_row = provider.insert_unless_present(JOB_INSTANCE, ("job_name", "job_key"))
        if new_instance_row is None:
            return None
    if not new_instance:
        execution = insert(JOB_EXECUTION).values(
            {
                name: bindparam(name, type_=JOB_EXECUTION.c[name].type)
                for name in NEW_EXECUTION_COLUMNS
            }
        )
    else:
        instance = (
            new_instance_row.values(
                version=0, job_name=bindparam("i_name"), job_key=bindparam("i_key")
            )
            .returning(JOB_INSTANCE.c.job_instance_id)
            .cte("dbc_instance")
        )
        columns = [name for name in NEW_EXECUTION_COLUMNS if name != "job_instance_id"]
        execution = (
            insert(JOB_EXECUTION)
            .from_select(
                ["job_instance_id", *columns],
                select(
                    instance.c.job_instance_id,
                    *(bindparam(name, type_=JOB_EXECUTION.c[name].type) for name in columns),
                ),
            )
            .returning(JOB_EXECUTION.c.job_instance_id)
        )
    statement = provider.insert_with_children(
        execution,
        JOB_EXECUTION.c.job_execution_id,
        [
            (JOB_CONTEXT, ("job_execution_id", *CONTEXT_VALUE_COLUMNS), ()),
            (JOB_PARAMS, ("job_execution_id",), PARAMETER_COLUMNS),
        ],
    )
    if statement is None or instance is None:
        return statement
    made = statement.selected_columns[0].table  # the execution's row, as the statement made it
    return statement.add_columns(made.c.job_instance_id)


def with_first_step(statement: Any | None) -> Any | None:
    """``statement`` (a new execution's, its id its first column) also creating the execution's
    first step execution and that step's context (each column bound as ``s_<column>``), the
    step's id its last column; None for None. Where the statement writes no execution (its
    instance exists) it writes no step either."""
    if statement is None:
        return None
    made = statement.selected_columns[0].table  # the execution's row, as the statement made it
    columns = [name for name in NEW_STEP_COLUMNS if name != "job_execution_id"]
    step = (
        insert(STEP_EXECUTION)
        .from_select(
            ["job_execution_id", *columns],
            select(
                made.c.job_execution_id,
                *(bindparam(f"s_{name}", type_=STEP_EXECUTION.c[name].type) for name in columns),
            ),
        )
        .returning(STEP_EXECUTION.c.step_execution_id)
        .cte("dbc_step")
    )
    context = insert(STEP_CONTEXT).from_select(
        list(NEW_CONTEXT_COLUMNS),
        select(
            step.c.step_execution_id,
            *(
                bindparam(f"s_{name}", type_=STEP_CONTEXT.c[name].type)
                for name in CONTEXT_VALUE_COLUMNS
            ),
        ),
    )
    # One row or none, as the execution's: a scalar subquery, not a second FROM.
    made_step = select(step.c.step_execution_id).scalar_subquery().label("first_step_id")
    return statement.add_cte(context.cte("dbc_step_context")).add_columns(made_step)


def with_extras(statement: Any, extras: InsertExtras, first_step: bool) -> tuple[Any, int]:
    """``statement`` (a new row's: a job execution's or a step execution's, its id its first
    column; with ``first_step``, the execution's first step's id its last) also running
    ``extras``' writes, and returning their read's rows joined to its own one row (none where
    it creates nothing; one with NULLs where the read finds nothing). Returns it with the
    number of its own columns."""
    columns = list(statement.selected_columns)
    made = columns[0].table  # the new row, as the statement made it
    step_id = columns[-1].element if first_step else None
    writes, read = extras.build(columns[0], step_id, made)
    if writes:
        statement = statement.add_cte(*(w.cte(f"dbc_rider{i}") for i, w in enumerate(writes)))
    if read is None:
        return statement, len(columns)
    # The statement's own CTEs stay at the top of the statement that embeds it.
    created = statement.subquery("dbc_created")
    found = read.subquery("dbc_read")
    return select(created, found).select_from(created.outerjoin(found, true())), len(columns)


def also_writing_a_context(statement: Any | None) -> Any | None:
    """``statement`` (a SELECT, or an INSERT) also writing another step execution's context as
    :data:`~.statements.UPDATE_STEP_CONTEXT` does (its parameters), the number of contexts that
    wrote its last column (a partitioned step's own context, with its partitions' names, goes in
    the statement that creates them); None for None."""
    if statement is None:
        return None
    written = UPDATE_STEP_CONTEXT.returning(STEP_CONTEXT.c.step_execution_id).cte(
        "dbc_other_context"
    )
    count = select(func.count()).select_from(written).scalar_subquery().label("contexts_written")
    if isinstance(statement, Select):
        return statement.add_cte(written).add_columns(count)
    # An INSERT of many rows: as a CTE of a SELECT of the one count (not a count per row).
    return select(count).add_cte(statement.cte("dbc_rows"), written)


def bulk_updates(provider: Any) -> tuple[Any, Any] | None:
    """The versioned UPDATE of many step executions (``UPDATE_STEP`` for each: found by id and
    version, the version bumped, ``b_last_updated`` the same for all) and the UPDATE of many
    of their contexts (``UPDATE_STEP_CONTEXT`` for each), each one statement of arrays
    (:func:`array_rows`) where the database can (None: executemany). For a group's final
    writes: an executemany costs the client as much per row as a statement of its own."""
    steps = provider.update_from_arrays(
        STEP_EXECUTION,
        ("step_execution_id", "version"),
        (*STATE_COLUMNS, *COUNTER_NAMES),
        {
            "version": STEP_EXECUTION.c.version + 1,
            "last_updated": bindparam("b_last_updated", type_=STEP_EXECUTION.c.last_updated.type),
        },
    )
    contexts = provider.update_from_arrays(
        STEP_CONTEXT, ("step_execution_id",), ("short_context", "serialized_context")
    )
    if steps is None or contexts is None:
        return None
    return steps, contexts


def array_rows(rows: Sequence[Mapping[str, Any]], key_of: Mapping[str, str]) -> dict[str, Any]:
    """The ``b_``-named parameters of one row each of ``UPDATE_STEP`` or
    ``UPDATE_STEP_CONTEXT`` as the arrays of a :func:`bulk_updates` statement: ``a_<column>``,
    one list per column, the column's parameter named ``key_of[column]``."""
    return {f"a_{column}": [row[key] for row in rows] for column, key in key_of.items()}


def bulk_inserts(provider: Any) -> tuple[Any, Any] | None:
    """Step executions (returning their ids by name) and their contexts, each one statement
    of arrays for any number of rows, where the database can (None: executemany). Of the step
    executions only the names differ: every other column is one parameter for all the rows
    (a list of thousands of equal values costs the driver as much to send as the names)."""
    steps = provider.insert_from_arrays(
        STEP_EXECUTION,
        ("step_name",),
        {
            name: bindparam(name, type_=STEP_EXECUTION.c[name].type)
            for name in NEW_STEP_COLUMNS
            if name != "step_name"
        },
    )
    contexts = provider.insert_from_arrays(STEP_CONTEXT, NEW_CONTEXT_COLUMNS)
    if steps is None or contexts is None:
        return None
    return steps.returning(STEP_EXECUTION.c.step_execution_id, STEP_EXECUTION.c.step_name), contexts
