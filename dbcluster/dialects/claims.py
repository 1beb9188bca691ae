"""The claim: a worker's poll of the partitions it may take, locking them (passing over rows
another claimer holds where the database can), PENDING -> CLAIMED, their step executions
started, and what the executor needs of each read back, in one transaction of five statements.

A database that claims in one statement overrides ``claim_and_start`` (and
``claim_and_start_reading_jobs``); PostgreSQL's is in :mod:`dbcluster.dialects.postgresql_ctes`.
A database with its own spelling of a locking read overrides ``locked``
(:mod:`dbcluster.dialects.family`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, Update, and_, exists, func, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from dbcluster import schema
from dbcluster.dialects.family import StatementFamily
from dbcluster.schema import job_coordination, nodes, partitions
from dbcluster.states import (
    NODE_ACTIVE,
    PARTITION_CLAIMED,
    PARTITION_PENDING,
    STEP_EXECUTING,
    STEP_STARTED,
)

#: The prefix of the job execution's columns a claim reads back where it can (see
#: :meth:`ClaimStatements.claim_and_start_reading_jobs`).
CLAIMED_JOB_PREFIX = "j_"


class ClaimStatements(StatementFamily):
    """The claim's statements."""

    # --- the poll and the claim's five statements -----------------------------------------------

    def select_claimable(
        self, node_id: Any, limit: int, steal_after_ms: int | None, unreachable_ms: int
    ) -> Select[Any]:
        """The poll: ids of PENDING partitions ``node_id`` may claim (and, second, each one's
        job execution id), oldest first: its own, and
        (unless ``steal_after_ms`` is None) any other node's that it has not claimed, at once
        when that node has not heartbeaten for ``unreachable_ms`` (or is gone), else once placed
        ``steal_after_ms`` ago. A PENDING partition never ran under its attempt, so whoever
        claims it first runs it, transferable or not; handed-back ones (no node) are left to
        their master."""
        mine = partitions.c.assigned_node == node_id
        claimable: ColumnElement[bool] = mine
        if steal_after_ms is not None:
            owner_alive = exists().where(
                nodes.c.node_id == partitions.c.assigned_node,
                nodes.c.status == NODE_ACTIVE,
                ~self.older_than(nodes.c.last_heartbeat, unreachable_ms),
            )
            claimable = or_(
                mine,
                and_(
                    partitions.c.assigned_node.is_not(None),
                    or_(~owner_alive, self.older_than(partitions.c.last_updated, steal_after_ms)),
                ),
            )
        return (
            select(partitions.c.step_execution_id, partitions.c.job_execution_id)
            .where(partitions.c.status == PARTITION_PENDING, claimable)
            .order_by(partitions.c.step_execution_id)
            .limit(limit)
        )

    def heartbeat_and_poll(
        self,
        node_id: Any,
        load: Any,
        limit: int,
        steal_after_ms: int | None,
        unreachable_ms: int,
    ) -> Select[Any] | None:
        """A node's heartbeat (:meth:`heartbeat`) and its poll (:meth:`select_claimable`) in one
        statement that commits on its own, where the database can write in a read (PostgreSQL:
        a data-modifying CTE): one row per partition found, or one whose two poll columns are
        NULL when none is; each row's first column ``alive`` counts the node rows the heartbeat
        changed (0: the node was removed and must fence). None: two statements."""
        return None

    def heartbeat_and_read(self, node_id: Any, load: Any, read: Any) -> Select[Any] | None:
        """A node's heartbeat (:meth:`heartbeat`) beside a read (``read``: a SELECT, or a UNION
        of SELECTs, such as ``poll_and_leases``) in one statement that commits on its own,
        where the database can write in a read (PostgreSQL: a data-modifying CTE): one row per
        row of ``read``, or one whose ``read`` columns are NULL when it has none; each row's
        first column ``alive`` counts the node rows the heartbeat changed (0: the node was
        removed and must fence). None: two statements."""
        return None

    def lock_claimable(self, step_execution_ids: Any, table: Any = partitions) -> Select[Any]:
        """In a claim's transaction: those of the polled partitions still PENDING, locked where
        the database can skip rows another claimer holds (SKIP LOCKED); elsewhere a plain read,
        and the guarded claim that follows decides. ``table``: the partitions or an alias."""
        p = table.c
        stmt = select(p.step_execution_id).where(
            p.step_execution_id.in_(step_execution_ids),
            p.status == PARTITION_PENDING,
            p.assigned_node.is_not(None),
        )
        if self.skip_locked():
            return self.locked(stmt, skip_locked=True)
        return stmt

    def claim_partitions(self, node_id: Any, step_execution_ids: Any) -> Update:
        """PENDING -> CLAIMED by ``node_id``, for many partitions at once (a stolen one changes
        node and keeps its attempt: it never ran). Which ones it won is read back with
        :meth:`select_claimed` in the same transaction."""
        return self._claim(
            node_id,
            partitions.c.step_execution_id.in_(step_execution_ids),
            partitions.c.status == PARTITION_PENDING,
            # Handed back or put back for a retry: its master places it (after the backoff).
            partitions.c.assigned_node.is_not(None),
        )

    def _claim(self, node_id: Any, *where: ColumnElement[bool], table: Any = partitions) -> Update:
        return (
            update(table)
            .where(*where)
            .values(status=PARTITION_CLAIMED, assigned_node=node_id, last_updated=self.now())
        )

    def start_claimed(self, node_id: Any, step_execution_ids: Any, started_at: Any) -> Update:
        """In a claim's transaction, after :meth:`claim_partitions`: the step executions of the
        partitions it won become STARTED (a retried or resumed one keeps its first start time),
        so the worker writes no start of its own."""
        se = schema.step_execution
        won = exists().where(
            partitions.c.step_execution_id == se.c.step_execution_id,
            partitions.c.assigned_node == node_id,
            partitions.c.status == PARTITION_CLAIMED,
        )
        return self._start(
            se.c.step_execution_id.in_(step_execution_ids), won, started_at=started_at
        )

    @staticmethod
    def _start(*where: ColumnElement[bool], started_at: Any, table: Any = None) -> Update:
        se = schema.step_execution if table is None else table
        return (
            update(se)
            .where(*where)
            .values(
                status=STEP_STARTED,
                exit_code=STEP_EXECUTING,
                exit_message="",
                start_time=func.coalesce(se.c.start_time, started_at),
                last_updated=started_at,
                version=se.c.version + 1,
            )
        )

    def select_claimed(self, node_id: Any, step_execution_ids: Any) -> Select[Any]:
        """What the executor needs of the partitions a claim won, in one read: the partition,
        its worker step's name, its step execution and that execution's context."""
        se, sc = schema.step_execution, schema.step_execution_context
        return (
            select(*self._claimed_columns(partitions, se))
            .join(
                job_coordination,
                job_coordination.c.job_execution_id == partitions.c.job_execution_id,
            )
            .join(se, se.c.step_execution_id == partitions.c.step_execution_id)
            .outerjoin(sc, sc.c.step_execution_id == partitions.c.step_execution_id)
            .where(
                partitions.c.step_execution_id.in_(step_execution_ids),
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_CLAIMED,
            )
            .order_by(partitions.c.step_execution_id)
        )

    @staticmethod
    def _claimed_columns(
        claimed: Any, started: Any, coordination: Any = None, context: Any = None
    ) -> list[Any]:
        """What a claim reads back: of the partition (``claimed``: the table, or the rows a
        claim returned), its worker step's name (from ``coordination``), its step execution
        (``started``) and that execution's context (``context``: the table by default)."""
        jc = job_coordination if coordination is None else coordination
        sc = schema.step_execution_context if context is None else context
        return [
            claimed.c.step_execution_id.label("p_id"),
            claimed.c.master_step_execution_id.label("p_master_id"),
            claimed.c.partition_name.label("p_name"),
            claimed.c.attempt.label("p_attempt"),
            claimed.c.max_attempts.label("p_max_attempts"),
            claimed.c.transferable.label("p_transferable"),
            jc.c.worker_step_name.label("p_worker_step_name"),
            *started.c,
            sc.c.short_context,
            sc.c.serialized_context,
        ]

    # --- a claim in one statement, where the database can ---------------------------------------

    def claim_and_start(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any
    ) -> Select[Any] | None:
        """Where the database has writable CTEs and ``SKIP LOCKED`` (PostgreSQL: see
        :mod:`dbcluster.dialects.postgresql_ctes`): a whole claim in one statement, which
        commits on its own (one round trip, no ``BEGIN``): :meth:`touch_node`,
        :meth:`lock_claimable`, :meth:`claim_partitions`, :meth:`start_claimed` and
        :meth:`select_claimed`, taking their locks in that order; a step execution starts
        exactly when its partition was claimed here. It gives one row per partition won, with
        the columns of :meth:`select_claimed` and ``dbc_node``; one row whose ``p_id`` is NULL
        when nothing was won; no row when the node is no longer registered (nothing was
        claimed). Lock waits are bounded by the session (:meth:`session_engine_options`).
        None: a transaction of five statements."""
        return None

    def claim_and_start_reading_jobs(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any
    ) -> Select[Any] | None:
        """:meth:`claim_and_start` whose rows also hold each partition's job execution and its
        parameters (each column named :data:`CLAIMED_JOB_PREFIX` + the name a job execution's
        read gives it, the parameters as one array per parameter column), where the database
        can aggregate them into one row (:meth:`aggregate_parameters`); None where it cannot,
        or where a provider has a claim of its own (then the claim is that one and the worker
        reads the job)."""
        return None

    def aggregate_parameters(self, params: Any, order_by: Any) -> list[Any] | None:
        """Aggregates of the ``params`` alias (of the job parameters table) over the rows of one
        job execution: one per parameter column (``schema.PARAMETER_COLUMNS``), each an array
        of that column's values in ``order_by``'s order, which the driver returns as a list of
        Python values (no result processor); None where the database has none (PostgreSQL:
        ``array_agg``)."""
        return None
