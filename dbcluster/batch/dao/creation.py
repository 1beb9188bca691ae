"""New job and step executions, each in as few statements as the database allows.

A first launch's instance, execution, context, parameters and first step execution go in one
statement where the database can (else an INSERT each); many step executions and their contexts
go as two statements of arrays (else an executemany); a lone step execution and its context in
one. What else a creating statement carries (a cluster's ownership rows, its wake-up) is
:class:`~dbcluster.batch.dao.combined.InsertExtras`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, select

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.dao.combined import CombinedStatements, InsertExtras
from dbcluster.batch.dao.connections import Connections, Dao
from dbcluster.batch.dao.contexts import ExecutionContextDao, context_gone
from dbcluster.batch.dao.job_instances import JobInstanceDao
from dbcluster.batch.dao.rows import (
    context_columns,
    context_values,
    first_step_values,
    new_step,
    new_step_row,
    parameter_rows,
)
from dbcluster.batch.dao.statements import (
    INSERT,
    INSERT_STEPS_RETURNING_IN_ORDER,
    JOB_CONTEXT,
    JOB_EXECUTION,
    JOB_PARAMS,
    NEW_CONTEXT_COLUMNS,
    PARAMETER_COLUMNS,
    STEP_CONTEXT,
    STEP_EXECUTION,
)
from dbcluster.batch.domain import JobExecution, JobInstance, StepExecution, utcnow
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.dialects.base import array_parameters
from dbcluster.inlists import in_batches


class ExecutionCreation(Dao):
    """Creates job executions (a first one with its instance, and its first step, where the
    database can) and step executions (many at once)."""

    def __init__(
        self,
        db: Connections,
        combined: CombinedStatements,
        instances: JobInstanceDao,
        contexts: ExecutionContextDao,
    ) -> None:
        super().__init__(db)
        self.combined = combined
        self.instances = instances
        self.contexts = contexts

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
        ``create_job_instance`` then :meth:`create_job_execution` (one statement where the
        database can: a first launch makes one round trip fewer). An instance created
        meanwhile by another launcher is an ``IntegrityError``, as it is for the former."""
        if self.combined.instance_with_execution is None:
            with self.db.transaction(conn) as c:
                instance = self.instances.create_job_instance(job_name, params, c)
                return self.create_job_execution(instance, params, context, c, started=started)
        made = self._create_execution(job_name, params, context, conn, started=started)
        assert made is not None  # made without if_absent
        return made

    @property
    def creates_instance_if_absent(self) -> bool:
        """Whether :meth:`create_instance_if_absent` can be asked (one statement, no read first)."""
        return self.combined.instance_if_absent is not None

    def create_instance_if_absent(
        self,
        job_name: str,
        params: JobParameters,
        context: ExecutionContext | None,
        conn: Connection,
        *,
        started: bool = False,
        first_step: str | None = None,
        extras: InsertExtras | None = None,
    ) -> JobExecution | None:
        """As :meth:`create_instance_and_execution` in one statement, without reading first
        whether the instance exists: None, having written nothing, where it exists (one that
        another launcher is committing meanwhile is waited for, and counts once committed). Only
        where :attr:`creates_instance_if_absent`. ``first_step``: the statement creates that
        step's execution too (empty context; with ``started``, STARTED), as
        ``create_step_execution`` would, left in the execution's ``prepared_steps``.
        ``extras``: go in the same statement where the database can (see
        :class:`InsertExtras`)."""
        return self._create_execution(
            job_name,
            params,
            context,
            conn,
            started=started,
            if_absent=True,
            first_step=first_step,
            extras=extras,
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
        extras: InsertExtras | None = None,
    ) -> JobExecution | None:
        """``job_instance``: the instance, or the job's name when the statement creates it
        (``if_absent``: None, nothing written, where that instance exists; ``first_step``: and
        that step's execution with it; ``extras``: see :class:`InsertExtras`)."""
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
        else:
            values["job_instance_id"] = job_instance.id
        one_statement = self._one_statement(job_instance, if_absent, first_step)
        parameters = parameter_rows(params)
        text = context.to_json()
        step_values: dict[str, Any] = {}
        if first_step is not None:
            step_context = ExecutionContext()
            step_text = step_context.to_json()
            step_values = first_step_values(first_step, now, started, step_text)
        if extras is not None:
            extras.rows = None  # not from an earlier try of the same transaction
        with self.db.transaction(conn) as c:
            if one_statement is None:
                assert isinstance(job_instance, JobInstance)
                new_id = self._insert_apart(c, values, parameters, text)
            else:
                found = self.combined.rows_with_extras(
                    c,
                    one_statement,
                    {
                        **values,
                        **context_columns(text),
                        **array_parameters(parameters, PARAMETER_COLUMNS),
                        **step_values,
                    },
                    extras if if_absent else None,
                    first_step is not None,
                )
                if not found:
                    if if_absent:
                        return None
                    raise AssertionError("a new execution's statement returned no row")
                row = found[0]
                new_id = int(row[0])
                if isinstance(job_instance, str):
                    job_instance = JobInstance(
                        id=int(row[1]), job_name=job_instance, job_key=values["i_key"], version=0
                    )
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
            execution.prepared_steps[first_step] = new_step(
                int(row[-1]), first_step, execution, step_context, now, started
            )
        return execution

    def _one_statement(
        self, job_instance: JobInstance | str, if_absent: bool, first_step: str | None
    ) -> Any | None:
        """The statement that creates a job execution with its context and parameters (given
        the job's name, its instance first; with ``first_step``, that step's execution too), or
        None where the database needs a statement for each."""
        if first_step is not None:
            assert if_absent, "a first step is created with an instance that did not exist"
            return self.combined.instance_if_absent_with_step
        if isinstance(job_instance, str):
            if if_absent:
                return self.combined.instance_if_absent
            return self.combined.instance_with_execution
        return self.combined.execution_with_children

    def _insert_apart(
        self, c: Connection, values: dict[str, Any], parameters: list[dict[str, Any]], text: str
    ) -> int:
        """A job execution's row, then its parameters' and its context's; returns its id."""
        new_id = self.db.insert_id(c, JOB_EXECUTION, values)
        if parameters:
            c.execute(
                INSERT[JOB_PARAMS.name],
                [{"job_execution_id": new_id, **row} for row in parameters],
            )
        c.execute(INSERT[JOB_CONTEXT.name], {"job_execution_id": new_id, **context_columns(text)})
        return new_id

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
        extras: InsertExtras | None = None,
    ) -> list[StepExecution]:
        """Insert many step executions (e.g. a step's partitions) and their contexts in bulk;
        with ``started``, already STARTED (``start_recorded``: the step writes no start).
        ``context_of``: also write that step execution's context, as
        ``update_step_execution_context`` does (in the same statement where the database can: a
        partitioned step's own context, naming its partitions). ``extras``: for one step
        execution, go in the statement that creates it where the database can (see
        :class:`InsertExtras`)."""
        if extras is not None:
            extras.rows = None  # not from an earlier try of the same transaction
        if not steps:
            if context_of is not None:
                self.contexts.update_step_execution_context(context_of, conn)
            return []
        names = [name for name, _ in steps]
        if len(set(names)) != len(names):
            raise ValueError("step execution names created together must be unique")
        now = utcnow()
        rows = [new_step_row(name, job_execution.id, now, started) for name in names]
        contexts = [ctx if ctx is not None else ExecutionContext() for _, ctx in steps]
        texts = [ctx.to_json() for ctx in contexts]
        context_rows = [context_columns(text) for text in texts]
        bulk = self.combined.bulk_inserts if len(rows) > 1 else None
        contexts_written = bulk is not None
        other: dict[str, Any] = {}
        other_text = None
        if context_of is not None:
            other_text = context_of.execution_context.to_json()
            other = context_values(context_of.id, other_text)
        other_written: int | None = None  # None: not written yet
        with self.db.transaction(conn) as c:
            if bulk is not None:
                insert_steps, insert_contexts = bulk
                shared = {k: v for k, v in rows[0].items() if k != "step_name"}
                got = {
                    row[1]: int(row[0])
                    for row in self.combined.rows(c, insert_steps, {"a_step_name": names, **shared})
                }
                ids = [got[name] for name in names]
                folded = self.combined.bulk_contexts_and_other if other else None
                written = self.combined.rows(
                    c,
                    folded if folded is not None else insert_contexts,
                    {
                        "a_step_execution_id": ids,
                        **array_parameters(context_rows, NEW_CONTEXT_COLUMNS[1:]),
                        **other,
                    },
                )
                if folded is not None:
                    other_written = int(written[0][-1])
            elif len(rows) == 1 and self.combined.step_with_context is not None:
                one = {**rows[0], **context_rows[0], **other}
                folded = self.combined.step_with_context_and_other if other else None
                statement = folded if folded is not None else self.combined.step_with_context
                (row,) = self.combined.rows_with_extras(c, statement, one, extras, False)
                ids = [int(row[0])]
                if folded is not None:
                    other_written = int(row[-1])
                contexts_written = True
            elif len(rows) == 1:
                ids = [self.db.insert_id(c, STEP_EXECUTION, rows[0])]
            elif c.dialect.insert_executemany_returning_sort_by_parameter_order:
                ids = [int(i) for i in c.execute(INSERT_STEPS_RETURNING_IN_ORDER, rows).scalars()]
            else:
                c.execute(INSERT[STEP_EXECUTION.name], rows)
                by_name: dict[str, int] = {}
                for batch in in_batches(names):
                    for row in c.execute(
                        select(
                            STEP_EXECUTION.c.step_execution_id, STEP_EXECUTION.c.step_name
                        ).where(
                            STEP_EXECUTION.c.job_execution_id == job_execution.id,
                            STEP_EXECUTION.c.step_name.in_(batch),
                        )
                    ).all():
                        by_name[row[1]] = max(by_name.get(row[1], 0), int(row[0]))
                ids = [by_name[name] for name in names]
            if not contexts_written:
                c.execute(
                    INSERT[STEP_CONTEXT.name],
                    [
                        {"step_execution_id": i, **columns}
                        for i, columns in zip(ids, context_rows, strict=True)
                    ],
                )
            if context_of is not None:
                if other_written is None:
                    self.contexts.write_step_context(c, context_of, other)
                elif other_written != 1:
                    raise OptimisticLockingFailureError(context_gone(context_of))
        if context_of is not None:
            assert other_text is not None
            context_of.execution_context.mark_saved(other_text)
        result = []
        for step_id, name, ctx, text in zip(ids, names, contexts, texts, strict=True):
            ctx.mark_saved(text)
            result.append(new_step(step_id, name, job_execution, ctx, now, started))
        return result
