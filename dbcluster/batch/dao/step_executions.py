"""Step executions: written at their version (with their context, and a fence's guard, in one
statement where the database can), failed from outside the process that ran them, and read with
their context (new ones: :mod:`dbcluster.batch.dao.creation`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, func, select, update

from dbcluster.batch.dao.combined import CombinedStatements, array_rows
from dbcluster.batch.dao.connections import (
    Connections,
    Dao,
    judge_version,
    retried_read,
    version_is,
)
from dbcluster.batch.dao.contexts import ExecutionContextDao
from dbcluster.batch.dao.job_executions import JobExecutionDao
from dbcluster.batch.dao.rows import (
    context_values,
    execution_values,
    step_execution_from_row,
)
from dbcluster.batch.dao.statements import (
    JOB_EXECUTION,
    PARTITION_TOTALS,
    PARTITION_TOTALS_BETWEEN,
    PARTITIONS_UNFINISHED,
    PARTITIONS_UNFINISHED_BETWEEN,
    RUNNING,
    STATE_COLUMNS,
    STEP_CONTEXT,
    STEP_EXECUTION,
    UPDATE_STEP,
    UPDATE_STEP_CONTEXT,
)
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
from dbcluster.batch.status import BatchStatus
from dbcluster.inlists import in_batches

#: A group's step executions' final writes as arrays (see ``combined.bulk_updates``): each
#: column's parameter in ``UPDATE_STEP``'s rows.
_STEP_ARRAYS = {
    "step_execution_id": "b_id",
    "version": "b_version",
    **{name: f"b_{name}" for name in (*STATE_COLUMNS, *COUNTER_NAMES)},
}
#: Their contexts' (``UPDATE_STEP_CONTEXT``'s rows).
_CONTEXT_ARRAYS = {
    "step_execution_id": "b_id",
    "short_context": "b_short_context",
    "serialized_context": "b_serialized_context",
}


class StepExecutionDao(Dao):
    """Updates and finds step executions (a partitioned step's partitions among them)."""

    def __init__(
        self,
        db: Connections,
        combined: CombinedStatements,
        contexts: ExecutionContextDao,
        jobs: JobExecutionDao,
    ) -> None:
        super().__init__(db)
        self.combined = combined
        self.contexts = contexts
        self.jobs = jobs

    def step_version_is(
        self, execution: StepExecution, version: int
    ) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit: the step execution's row carries ``version``. A row
        at any other version than that or the one before was written by someone else."""
        return version_is(
            STEP_EXECUTION,
            STEP_EXECUTION.c.step_execution_id,
            execution.id,
            version,
            f"step execution {execution.id}",
            self.db.locked,
        )

    def step_versions_are(
        self, executions: Sequence[StepExecution], versions: Sequence[int]
    ) -> Callable[[Connection], bool]:
        """Verifier of an unclear commit of a group's transaction (see
        :mod:`dbcluster.batch.grouped`): every step execution's row carries its ``versions``
        entry with the status the group wrote (True), or none does (False: the rows not at the
        version before were ended by someone else, who moved their partitions first); raises
        when a row is at neither version."""
        expected = {se.id: (version, se) for se, version in zip(executions, versions, strict=True)}
        locked = self.db.locked

        def verify(conn: Connection) -> bool:
            # Built here, when an unclear commit is judged: not before every group.
            read = locked(
                select(
                    STEP_EXECUTION.c.step_execution_id,
                    STEP_EXECUTION.c.version,
                    STEP_EXECUTION.c.status,
                ).where(STEP_EXECUTION.c.step_execution_id.in_(list(expected)))
            )
            found = {int(r[0]): (r[1], r[2]) for r in conn.execute(read)}
            landed = []
            for step_id, (version, se) in expected.items():
                row_version, status = found.get(step_id, (None, None))
                written = judge_version(row_version, version, f"step execution {step_id}")
                landed.append(written and status == se.status.value)
            return all(landed)

        return verify

    # --- writing -----------------------------------------------------------------------------

    def update_step_executions(self, executions: Sequence[StepExecution], conn: Connection) -> None:
        """The final writes of a group's step executions (each at its version, with its
        context where that changed) in ``conn``'s transaction, as few statements as the driver
        allows (an executemany; psycopg pipelines it); each bumps its ``version``. Raises
        :class:`OptimisticLockingFailureError` unless every row was written."""
        now = utcnow()
        steps, contexts, texts = [], [], []
        for execution in executions:
            values = execution_values(execution, now)
            for name in COUNTER_NAMES:
                values[f"b_{name}"] = getattr(execution, name)
            steps.append(values)
            text = None
            if execution.execution_context.dirty:
                text = execution.execution_context.to_json()
                contexts.append(context_values(execution.id, text))
            texts.append(text)
        bulk = self.combined.bulk_updates if len(steps) > 1 else None
        if contexts:
            changed = (
                self._changed(conn, UPDATE_STEP_CONTEXT, contexts)
                if bulk is None or len(contexts) < 2
                else conn.execute(bulk[1], array_rows(contexts, _CONTEXT_ARRAYS)).rowcount
            )
            if changed != len(contexts):
                raise OptimisticLockingFailureError(
                    f"the context of a step execution among {[se.id for se in executions]} no "
                    f"longer exists; this group's update was refused"
                )
        if bulk is not None:
            arrays = array_rows(steps, _STEP_ARRAYS)
            changed = conn.execute(bulk[0], {**arrays, "b_last_updated": now}).rowcount
        else:
            changed = self._changed(conn, UPDATE_STEP, steps)
        if changed != len(steps):
            raise OptimisticLockingFailureError(
                f"a step execution among {[se.id for se in executions]} was updated by someone "
                f"else; this group's update was refused"
            )
        for execution, text in zip(executions, texts, strict=True):
            execution.version += 1
            execution.last_updated = now
            if text is not None:
                execution.execution_context.mark_saved(text)

    @staticmethod
    def _changed(conn: Connection, statement: Any, rows: list[dict[str, Any]]) -> int:
        """Rows ``statement`` changed for each of ``rows`` in all: one executemany where the
        driver counts its rows, else one statement each."""
        if len(rows) > 1 and conn.dialect.supports_sane_multi_rowcount:
            return int(conn.execute(statement, rows).rowcount)
        return sum(int(conn.execute(statement, row).rowcount) for row in rows)

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
        final guarded write, run first in the same statement (only where ``folds_guards``); it
        raises the guard's refusal when the guard changed no row."""
        combined = self.combined.update_step_and_context if context else None
        now = utcnow()
        values = execution_values(execution, now)
        for name in COUNTER_NAMES:
            values[f"b_{name}"] = getattr(execution, name)
        text = None
        if context:
            text = execution.execution_context.to_json()
            values.update(context_values(execution.id, text))
        one_statement = combined is not None or (guard is not None and context)

        def stale() -> OptimisticLockingFailureError:
            return OptimisticLockingFailureError(
                f"step execution {execution.id} ({execution.step_name!r}, version "
                f"{execution.version}) was updated by someone else"
                f"{' or its context no longer exists' if one_statement else ''}; "
                f"this update was refused"
            )

        def written() -> None:
            execution.version += 1
            execution.last_updated = now
            if text is not None:
                execution.execution_context.mark_saved(text)

        with self.db.transaction(conn) as c:
            if guard is not None:
                transactions = self.db.transactions
                refused = self.combined.run_guarded_write(
                    c,
                    guard,
                    values,
                    context,
                    stale=stale,
                    written=written,
                    defer=None if conn is None else lambda end: transactions.close_with(c, end),
                )
                if refused is None or not refused:
                    return  # written (or handed to the COMMIT, which writes it)
            elif combined is not None:  # both rows or neither: 0 is a refusal
                refused = c.execute(combined, values).rowcount == 0
            else:
                if context:
                    self.contexts.write_step_context(c, execution, values)
                refused = c.execute(UPDATE_STEP, values).rowcount != 1
            if refused:
                raise stale()
        written()

    @staticmethod
    def fail_running(
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
        ``job_execution_id`` and no steps wanted, see ``fail_running_job``) nothing else.
        Returns the rows changed. ``status`` STOPPED (with exit code STOPPED): the end of
        partitions of a stopped job that no node runs. The caller holds the owner rows first
        (the partition's, the job's coordination row), so no writer of these rows can be
        mid-transaction."""
        where = [STEP_EXECUTION.c.status.in_(RUNNING)]
        if step_execution_id is not None:
            where.append(STEP_EXECUTION.c.step_execution_id == step_execution_id)
        if step_execution_ids is not None:
            where.append(STEP_EXECUTION.c.step_execution_id.in_(list(step_execution_ids)))
        if job_execution_id is not None:
            where.append(STEP_EXECUTION.c.job_execution_id == job_execution_id)
        now = utcnow()
        return conn.execute(
            update(STEP_EXECUTION)
            .where(*where)
            .values(
                status=status.value,
                exit_code=exit_code,
                exit_message=message,
                end_time=now,
                last_updated=now,
                version=STEP_EXECUTION.c.version + 1,
            )
        ).rowcount

    # --- reading -----------------------------------------------------------------------------

    @retried_read
    def get_step_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> StepExecution | None:
        """One step execution with its context, its job execution and that job's parameters."""
        with self.db.read(conn) as c:
            job_id = c.execute(
                select(STEP_EXECUTION.c.job_execution_id).where(
                    STEP_EXECUTION.c.step_execution_id == execution_id
                )
            ).scalar_one_or_none()
            if job_id is None:
                return None
            job_execution = self.jobs.job_executions(c, JOB_EXECUTION.c.job_execution_id == job_id)[
                0
            ]
            found = self.step_executions(
                c, job_execution, STEP_EXECUTION.c.step_execution_id == execution_id
            )
        return found[0] if found else None

    @retried_read
    def step_execution_exists(self, execution_id: int, conn: Connection | None = None) -> bool:
        with self.db.read(conn) as c:
            return (
                c.execute(
                    select(STEP_EXECUTION.c.step_execution_id).where(
                        STEP_EXECUTION.c.step_execution_id == execution_id
                    )
                ).first()
                is not None
            )

    @retried_read
    def get_step_executions_by_ids(
        self, job_execution: JobExecution, ids: Sequence[int], conn: Connection | None = None
    ) -> list[StepExecution]:
        """Step executions of one job execution, reloaded, in the order of ``ids``."""
        found: dict[int, StepExecution] = {}
        with self.db.read(conn) as c:
            for batch in in_batches(ids):
                for se in self.step_executions(
                    c, job_execution, STEP_EXECUTION.c.step_execution_id.in_(batch)
                ):
                    found[se.id] = se
        return [found[i] for i in ids if i in found]

    @retried_read
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
                    PARTITION_TOTALS_BETWEEN,
                    PARTITIONS_UNFINISHED_BETWEEN,
                    {"b_low": ordered[0], "b_high": ordered[-1]},
                )
            ]
        else:
            where = [
                (PARTITION_TOTALS, PARTITIONS_UNFINISHED, {"b_ids": batch})
                for batch in in_batches(ordered)
            ]
        with self.db.read(conn) as c:
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

    @retried_read
    def get_step_executions(
        self, job_execution: JobExecution, conn: Connection | None = None
    ) -> list[StepExecution]:
        """Every step execution of a job execution, oldest first."""
        with self.db.read(conn) as c:
            return self.step_executions(
                c, job_execution, STEP_EXECUTION.c.job_execution_id == job_execution.id
            )

    def get_last_step_execution(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> StepExecution | None:
        """The newest execution of ``step_name`` in any execution of the instance."""
        return self.get_last_step_executions(job_instance, [step_name], conn).get(step_name)

    @retried_read
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
        with self.db.read(conn) as c:
            jobs: dict[int, JobExecution] = {}
            for batch in in_batches(step_names):
                where = [
                    JOB_EXECUTION.c.job_instance_id == job_instance.id,
                    STEP_EXECUTION.c.step_name.in_(batch),
                ]
                if before_job_execution_id is not None:
                    where.append(STEP_EXECUTION.c.job_execution_id < before_job_execution_id)
                rows = c.execute(
                    select(
                        STEP_EXECUTION.c.step_execution_id,
                        STEP_EXECUTION.c.step_name,
                        STEP_EXECUTION.c.job_execution_id,
                    )
                    .join(
                        JOB_EXECUTION,
                        JOB_EXECUTION.c.job_execution_id == STEP_EXECUTION.c.job_execution_id,
                    )
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
                        jobs[job_id] = self.jobs.job_executions(
                            c, JOB_EXECUTION.c.job_execution_id == job_id
                        )[0]
                    for se in self.step_executions(
                        c, jobs[job_id], STEP_EXECUTION.c.step_execution_id.in_(step_ids)
                    ):
                        result[se.step_name] = se
        return result

    @retried_read
    def count_step_executions(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> int:
        stmt = (
            select(func.count())
            .select_from(
                STEP_EXECUTION.join(
                    JOB_EXECUTION,
                    JOB_EXECUTION.c.job_execution_id == STEP_EXECUTION.c.job_execution_id,
                )
            )
            .where(
                JOB_EXECUTION.c.job_instance_id == job_instance.id,
                STEP_EXECUTION.c.step_name == step_name,
            )
        )
        with self.db.read(conn) as c:
            return int(c.execute(stmt).scalar_one())

    @staticmethod
    def step_executions(
        c: Connection, job_execution: JobExecution, *where: Any
    ) -> list[StepExecution]:
        """The step executions ``where`` says, of ``job_execution``, oldest first."""
        stmt = (
            select(STEP_EXECUTION, STEP_CONTEXT.c.short_context, STEP_CONTEXT.c.serialized_context)
            .outerjoin(
                STEP_CONTEXT,
                STEP_CONTEXT.c.step_execution_id == STEP_EXECUTION.c.step_execution_id,
            )
            .where(*where)
            .order_by(STEP_EXECUTION.c.step_execution_id)
        )
        return [
            step_execution_from_row(row._mapping, job_execution) for row in c.execute(stmt).all()
        ]
