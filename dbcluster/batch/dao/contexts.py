"""Execution contexts: a job execution's and a step execution's, each a row of its own table."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from dbcluster.batch.dao.connections import Dao
from dbcluster.batch.dao.rows import context_values
from dbcluster.batch.dao.statements import UPDATE_JOB_CONTEXT, UPDATE_STEP_CONTEXT
from dbcluster.batch.domain import JobExecution, StepExecution
from dbcluster.batch.exceptions import OptimisticLockingFailureError


class ExecutionContextDao(Dao):
    """Writes the contexts of job and step executions (they are read with their executions)."""

    def update_job_execution_context(
        self, execution: JobExecution, conn: Connection | None = None
    ) -> None:
        text = execution.execution_context.to_json()
        with self.db.transaction(conn) as c:
            if c.execute(UPDATE_JOB_CONTEXT, context_values(execution.id, text)).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"the context of job execution {execution.id} no longer exists"
                )
        execution.execution_context.mark_saved(text)

    def update_step_execution_context(
        self, execution: StepExecution, conn: Connection | None = None
    ) -> None:
        text = execution.execution_context.to_json()
        with self.db.transaction(conn) as c:
            self.write_step_context(c, execution, context_values(execution.id, text))
        execution.execution_context.mark_saved(text)

    @staticmethod
    def write_step_context(conn: Connection, execution: StepExecution, values: Any) -> None:
        """Run the step context's UPDATE with ``values`` (its bound values, and maybe more)."""
        if conn.execute(UPDATE_STEP_CONTEXT, values).rowcount != 1:
            raise OptimisticLockingFailureError(context_gone(execution))


def context_gone(execution: StepExecution) -> str:
    """The refusal of a write to a step execution's context that no longer exists."""
    return (
        f"the context of step execution {execution.id} ({execution.step_name!r}) no longer exists"
    )
