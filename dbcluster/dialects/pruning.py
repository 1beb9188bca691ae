"""Pruning: deleting old job executions with everything that hangs off them.

Which executions may go is the pruner's rule (:mod:`dbcluster.cluster.maintenance.pruner`); these
say how to ask for them and delete them. Every IN list is an expanding parameter (``ids``) the
caller fills with at most ``partition_write_batch`` values. Portable Core throughout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Delete, Select, bindparam, delete, exists, func, select
from sqlalchemy.sql.elements import ColumnElement

from dbcluster import schema
from dbcluster.dialects.family import StatementFamily
from dbcluster.schema import job_coordination, job_masters, partitions
from dbcluster.states import COORD_IN_FLIGHT


class PruningStatements(StatementFamily):
    """The pruner's statements."""

    def prunable_where(
        self, statuses: Sequence[str], age_ms: int, completed: str
    ) -> list[ColumnElement[bool]]:
        """Conditions on ``batch_job_execution`` for an execution that may be deleted: its
        status is one of ``statuses``, it ended more than ``age_ms`` before the database
        clock, no coordination row of it is in flight, and the newest execution of its
        instance is ``completed`` (an instance whose newest execution is anything else may be
        restarted, and a restart reads every earlier execution of the instance); and, where
        the database hands a deleted newest row's id out again
        (:attr:`~dbcluster.dialects.base.QueryProvider.reuses_ids`), it is neither the newest
        execution of all nor the one that holds the newest step execution of all."""
        je = schema.job_execution
        newest = schema.job_execution.alias("prune_newest")
        top = schema.job_execution.alias("prune_top")
        newest_id = (
            select(func.max(top.c.job_execution_id))
            .where(top.c.job_instance_id == newest.c.job_instance_id)
            .correlate(newest)
            .scalar_subquery()
        )
        kept_newest = []
        if self.reuses_ids:
            last = schema.job_execution.alias("prune_last")
            newest_of_all = select(func.max(last.c.job_execution_id)).scalar_subquery()
            se, last_step = schema.step_execution, schema.step_execution.alias("prune_last_step")
            newest_step = select(func.max(last_step.c.step_execution_id)).scalar_subquery()
            owner_of_newest_step = (
                select(se.c.job_execution_id)
                .where(se.c.step_execution_id == newest_step)
                .scalar_subquery()
            )
            kept_newest += [
                je.c.job_execution_id < newest_of_all,
                # A step execution may be made after a later execution's (a long job's next
                # step): its execution keeps the newest step execution id from coming back.
                je.c.job_execution_id != func.coalesce(owner_of_newest_step, -1),
            ]
        return [
            *kept_newest,
            je.c.status.in_(list(statuses)),
            self.older_than(je.c.end_time, age_ms),
            ~exists().where(
                job_coordination.c.job_execution_id == je.c.job_execution_id,
                job_coordination.c.status.in_(COORD_IN_FLIGHT),
            ),
            ~exists().where(
                newest.c.job_instance_id == je.c.job_instance_id,
                newest.c.job_execution_id == newest_id,
                newest.c.status != completed,
            ),
        ]

    def select_prunable(
        self, statuses: Sequence[str], age_ms: int, completed: str, keep_last: int
    ) -> Select[Any]:
        """The ids of the executions that may be deleted (:meth:`prunable_where`) that are not
        among the ``keep_last`` newest executions of their job name, oldest first."""
        je = schema.job_execution
        ji = schema.job_instance
        where = self.prunable_where(statuses, age_ms, completed)
        if keep_last <= 0:
            return select(je.c.job_execution_id).where(*where).order_by(je.c.job_execution_id)
        rank = (
            func.row_number()
            .over(partition_by=ji.c.job_name, order_by=je.c.job_execution_id.desc())
            .label("newer")
        )
        ranked = (
            select(je.c.job_execution_id, rank)
            .join(ji, ji.c.job_instance_id == je.c.job_instance_id)
            .subquery("prune_ranked")
        )
        return (
            select(je.c.job_execution_id)
            .join(ranked, ranked.c.job_execution_id == je.c.job_execution_id)
            .where(ranked.c.newer > keep_last, *where)
            .order_by(je.c.job_execution_id)
        )

    def select_prunable_recheck(
        self, statuses: Sequence[str], age_ms: int, completed: str
    ) -> Select[Any]:
        """Of the executions ``ids``, those that may still be deleted (checked again in the
        transaction that deletes them: a launch or a restart may have come since)."""
        je = schema.job_execution
        return select(je.c.job_execution_id).where(
            je.c.job_execution_id.in_(bindparam("ids", expanding=True)),
            *self.prunable_where(statuses, age_ms, completed),
        )

    def select_steps_of(self) -> Select[Any]:
        """The step execution ids of the job executions ``ids``, with their job execution's,
        in key order (read once; then deleted by key, a slice at a time)."""
        se = schema.step_execution
        return (
            select(se.c.step_execution_id, se.c.job_execution_id)
            .where(se.c.job_execution_id.in_(bindparam("ids", expanding=True)))
            .order_by(se.c.step_execution_id)
        )

    def delete_step_rows(self) -> list[Delete]:
        """Deletes of the step executions ``ids`` in foreign-key order: their partition rows,
        their contexts, themselves."""
        ids = bindparam("ids", expanding=True)
        return [
            delete(partitions).where(partitions.c.step_execution_id.in_(ids)),
            delete(schema.step_execution_context).where(
                schema.step_execution_context.c.step_execution_id.in_(ids)
            ),
            delete(schema.step_execution).where(schema.step_execution.c.step_execution_id.in_(ids)),
        ]

    def delete_job_rows(self) -> list[Delete]:
        """Deletes of the job executions ``ids`` (their step executions already gone) in
        foreign-key order: coordination, master history, context, parameters, themselves."""
        ids = bindparam("ids", expanding=True)
        tables = (
            job_coordination,
            job_masters,
            schema.job_execution_context,
            schema.job_execution_params,
            schema.job_execution,
        )
        return [delete(t).where(t.c.job_execution_id.in_(ids)) for t in tables]

    def select_instances_of(self) -> Select[Any]:
        """The job instance ids of the job executions ``ids``."""
        je = schema.job_execution
        return (
            select(je.c.job_instance_id)
            .where(je.c.job_execution_id.in_(bindparam("ids", expanding=True)))
            .distinct()
        )

    def delete_empty_instances(self) -> Delete:
        """Deletes of the job instances ``ids`` that have no execution left."""
        ji = schema.job_instance
        je = schema.job_execution
        return delete(ji).where(
            ji.c.job_instance_id.in_(bindparam("ids", expanding=True)),
            ~exists().where(je.c.job_instance_id == ji.c.job_instance_id),
        )

    def count_prunable(self, prunable: Select[Any]) -> dict[str, Select[Any]]:
        """Per table, a count of the rows deleting the executions ``prunable`` selects would
        delete (what ``--dry-run`` prints)."""
        se = schema.step_execution
        je = schema.job_execution
        ji = schema.job_instance
        # No ORDER BY in a derived table (SQL Server refuses one).
        chosen = prunable.order_by(None).subquery("prune_chosen")
        ids = select(chosen.c.job_execution_id)
        steps = select(se.c.step_execution_id).where(se.c.job_execution_id.in_(ids))

        def count(table: Any, *where: ColumnElement[bool]) -> Select[Any]:
            return select(func.count()).select_from(table).where(*where)

        counts = {
            partitions.name: count(partitions, partitions.c.step_execution_id.in_(steps)),
            schema.step_execution_context.name: count(
                schema.step_execution_context,
                schema.step_execution_context.c.step_execution_id.in_(steps),
            ),
            se.name: count(se, se.c.job_execution_id.in_(ids)),
        }
        for table in (
            job_coordination,
            job_masters,
            schema.job_execution_context,
            schema.job_execution_params,
            je,
        ):
            counts[table.name] = count(table, table.c.job_execution_id.in_(ids))
        other = je.alias("prune_other")
        counts[ji.name] = count(
            ji,
            exists().where(
                je.c.job_instance_id == ji.c.job_instance_id, je.c.job_execution_id.in_(ids)
            ),
            ~exists().where(
                other.c.job_instance_id == ji.c.job_instance_id,
                other.c.job_execution_id.not_in(ids),
            ),
        )
        return counts
