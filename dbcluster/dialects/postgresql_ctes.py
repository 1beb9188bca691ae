"""PostgreSQL's data-modifying CTEs: a claim, a chunk's two writes and a partition's final write
(with the claim of the node's next partition) each in one statement.

They use what PostgreSQL has and the portable base does not assume (``UPDATE ... RETURNING``
inside ``WITH``, ``FOR KEY SHARE SKIP LOCKED`` and, through :meth:`aggregate_parameters`,
``array_agg``), so the base answers None for each and its callers run the portable statements.
:class:`WritableCTEProvider` builds them; :class:`~dbcluster.dialects.postgresql.PostgreSQLProvider`
is built on it, as a provider of another database that speaks PostgreSQL's SQL may be. Callers
still decide by the flag (``supports_writable_cte``), never by the class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sqlalchemy import Select, Update, bindparam, exists, func, literal_column, select, true

from dbcluster import schema
from dbcluster.dialects.base import QueryProvider
from dbcluster.dialects.claims import CLAIMED_JOB_PREFIX
from dbcluster.schema import job_coordination, nodes, partitions


class WritableCTEProvider(QueryProvider):
    """The portable provider, with the one-statement claim and writes that data-modifying CTEs
    allow (see the module's doc). Each builder still answers None unless
    :attr:`supports_writable_cte` (and, for a claim, :meth:`skip_locked`)."""

    #: Data-modifying statements in ``WITH``: the builders below.
    supports_writable_cte: ClassVar[bool] = True

    def update_step_and_context(
        self, step_update: Update, context_update: Update, context_values: Mapping[str, Any]
    ) -> Update | None:
        """The context update runs in a ``WITH`` and the step's row is updated only if it did
        (1 row)."""
        if not self.supports_writable_cte:
            return super().update_step_and_context(step_update, context_update, context_values)
        se, sc = schema.step_execution, schema.step_execution_context
        written = context_update.returning(sc.c.step_execution_id).cte("dbc_context")
        return step_update.where(se.c.step_execution_id.in_(select(written.c.step_execution_id)))

    def fold_guard(
        self,
        guard: Update,
        step_update: Update,
        context_update: Update | None = None,
        *,
        claim_next: bool = False,
    ) -> Select[Any] | None:
        """Where :attr:`supports_writable_cte`: a step's final write and the guarded UPDATE of
        its owner row (``guard``, e.g. a partition's finish) as one statement, in the lock order
        of the transaction it replaces: the guard's row first; then the context row (when
        ``context_update`` is given) and the step execution row, each written only if the one
        before changed. It answers one row: ``guarded`` (rows the guard changed: 1 or 0) and
        ``written`` (step execution rows written: 1, or 0 when the guard refused or the version
        was stale). The three share their bind parameters (``b_id`` names the step execution).
        With ``claim_next``, the same statement then claims one more partition for the node
        (see :meth:`_claim_after`), and the row carries what it won. None: the guard and the
        write are statements of their own."""
        if not self.supports_writable_cte:
            return None
        se, sc = schema.step_execution, schema.step_execution_context
        held_rows = guard.returning(literal_column("1").label("dbc_held")).cte("dbc_guard")
        held = exists(select(held_rows.c.dbc_held))
        if context_update is None:
            last = step_update.where(held)
        else:
            context = context_update.where(held).returning(sc.c.step_execution_id)
            written_context = context.cte("dbc_context")
            last = step_update.where(
                se.c.step_execution_id.in_(select(written_context.c.step_execution_id))
            )
        written = last.returning(se.c.step_execution_id).cte("dbc_written")
        counts = select(
            select(func.count()).select_from(held_rows).scalar_subquery().label("guarded"),
            select(func.count()).select_from(written).scalar_subquery().label("written"),
        )
        if not claim_next or not self.skip_locked():
            one = counts.subquery("dbc_counts")
            refused = self._refused_column(one)
            if refused is None:
                return counts
            return select(one.c.guarded, one.c.written, refused)
        return self._claim_after(counts, written)

    def _claim_after(self, counts: Select[Any], written: Any) -> Select[Any]:
        """A partition's final write that also claims the node's next partition (parameters
        ``n_id``, ``n_node``, ``n_started_at``), only once that write changed its rows: the
        partition that ends hands its slot to the next without a claim of its own (one
        statement, one COMMIT). The claim is :meth:`claim_and_start`'s for one partition, except
        for how it makes sure the node is still registered: it takes the node's row ``FOR KEY
        SHARE SKIP LOCKED`` (after the ending partition's rows) instead of updating it. That
        lock waits for nothing and holds up nothing that only updates the row (the node's other
        slots, its heartbeat, a sweep marking it UNREACHABLE). A removal or a node leaving
        takes the row ``FOR UPDATE`` before it fences the node's claims (:meth:`lock_removing`,
        :meth:`lock_node`): it waits for this COMMIT and then fences what this claimed too, and
        once it holds the row this claims nothing. The row answers ``p_id`` NULL when nothing
        was won. The tables go by short aliases, which keeps the statement short enough for the
        driver to cache its parsing (psycopg: 4,096 characters)."""
        pt, se = partitions.alias("p"), schema.step_execution.alias("s")
        nd, sc = nodes.alias("n"), schema.step_execution_context.alias("c")
        jc = job_coordination.alias("j")
        node = bindparam("n_node")
        registered = (
            select(nd.c.node_id)
            .where(nd.c.node_id == node, exists(select(written.c.step_execution_id)))
            .with_for_update(read=True, key_share=True, skip_locked=True)
            .cte("dbc_nn")
        )
        locked = (
            self.lock_claimable([bindparam("n_id", type_=pt.c.step_execution_id.type)], pt)
            .where(exists(select(registered.c.node_id)))
            .cte("dbc_nl")
        )
        claimed = self._claimed_cte(node, locked, "dbc_nc", pt)
        started = self._started_cte(claimed, bindparam("n_started_at"), "dbc_ns", se)
        won = self._won(claimed, started, jc, sc)
        one = counts.subquery("dbc_counts")
        refused = self._refused_column(one)
        return select(
            one.c.guarded,
            one.c.written,
            *(() if refused is None else (refused,)),
            *self._claimed_columns(claimed, started, jc, sc),
        ).select_from(one.outerjoin(won, true()))

    def heartbeat_and_poll(
        self,
        node_id: Any,
        load: Any,
        limit: int,
        steal_after_ms: int | None,
        unreachable_ms: int,
    ) -> Select[Any] | None:
        """The heartbeat as a data-modifying CTE beside the poll: one statement, one round trip
        (the poll sees the rows as they were before the heartbeat, which changes none it
        reads but the node's own)."""
        if not self.supports_writable_cte:
            return None
        beat = self.heartbeat(node_id, load).returning(nodes.c.node_id).cte("dbc_beat")
        found = self.select_claimable(node_id, limit, steal_after_ms, unreachable_ms).subquery(
            "dbc_poll"
        )
        alive = select(func.count()).select_from(beat).scalar_subquery().label("alive")
        one = select(literal_column("1").label("one")).subquery("dbc_one")
        return (
            select(alive, found.c.step_execution_id, found.c.job_execution_id)
            .select_from(one.outerjoin(found, true()))
            .order_by(found.c.step_execution_id)
        )

    def heartbeat_and_read(self, node_id: Any, load: Any, read: Any) -> Select[Any] | None:
        """The heartbeat as a data-modifying CTE beside ``read``: one statement, one round trip
        (``read`` sees the rows as they were before the heartbeat)."""
        if not self.supports_writable_cte:
            return None
        beat = self.heartbeat(node_id, load).returning(nodes.c.node_id).cte("dbc_beat")
        found = read.subquery("dbc_read")
        alive = select(func.count()).select_from(beat).scalar_subquery().label("alive")
        one = select(literal_column("1").label("one")).subquery("dbc_one")
        return select(alive, *found.c).select_from(one.outerjoin(found, true()))

    def heartbeat_renewing_and_read(
        self, node_id: Any, load: Any, names: Any, term_ms: int, read: Any = None
    ) -> Select[Any] | None:
        """The heartbeat and the holder's renewal (``renew_leases``, its fence unchanged, with
        ``RETURNING`` the names it renewed) as data-modifying CTEs beside ``read``: one
        statement, one round trip (the renewal's fence and ``read`` see the rows as they were
        before the heartbeat; the two CTEs write different tables)."""
        if not self.supports_writable_cte:
            return None
        leases = schema.leases
        beat = self.heartbeat(node_id, load).returning(nodes.c.node_id).cte("dbc_beat")
        renew = self.renew_leases(names, node_id, term_ms).returning(leases.c.lease_name)
        renewed = renew.cte("dbc_renew")
        columns = [
            select(func.count()).select_from(beat).scalar_subquery().label("alive"),
            select(func.array_agg(renewed.c.lease_name)).scalar_subquery().label("renewed"),
        ]
        one = select(literal_column("1").label("one")).subquery("dbc_one")
        if read is None:
            return select(*columns).select_from(one)
        found = read.subquery("dbc_read")
        return select(*columns, *found.c).select_from(one.outerjoin(found, true()))

    def claim_and_start(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any
    ) -> Select[Any] | None:
        """Where the database has writable CTEs and ``SKIP LOCKED``: a whole claim in one
        statement, which commits on its own (one round trip, no ``BEGIN``): :meth:`touch_node`,
        :meth:`lock_claimable`, :meth:`claim_partitions`, :meth:`start_claimed` and
        :meth:`select_claimed`. The locks are taken in the order of the transaction it
        replaces: the node's own row first (the partitions are only looked at once it is
        updated), then the partition rows, then their step executions (the start reads what
        the claim returned); a step execution starts exactly when its partition was claimed
        here. It gives one row per partition won, with the columns of :meth:`select_claimed`
        and ``dbc_node``; one row whose ``p_id`` is NULL when nothing was won; no row when the
        node is no longer registered (nothing was claimed). Lock waits are bounded by the
        session (:meth:`session_engine_options`). None: a transaction of five statements."""
        return self._claim_and_start(node_id, step_execution_ids, started_at, load, False)

    def claim_and_start_reading_jobs(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any
    ) -> Select[Any] | None:
        """:meth:`claim_and_start` whose rows also hold each partition's job execution and its
        parameters (see :meth:`_claimed_job`), where the database can aggregate them into one
        row; None where it cannot, or where a provider has a claim of its own (then the claim
        is that one and the worker reads the job)."""
        if type(self).claim_and_start is not WritableCTEProvider.claim_and_start:
            return None
        return self._claim_and_start(node_id, step_execution_ids, started_at, load, True)

    def _claim_and_start(
        self, node_id: Any, step_execution_ids: Any, started_at: Any, load: Any, with_jobs: bool
    ) -> Select[Any] | None:
        if not (self.supports_writable_cte and self.skip_locked()):
            return None
        touched = self.touch_node(node_id, load).returning(nodes.c.node_id).cte("dbc_touched")
        locked = (
            self.lock_claimable(step_execution_ids)
            .where(exists(select(touched.c.node_id)))
            .cte("dbc_locked")
        )
        # By key alone: the rows ``locked`` returned are PENDING and assigned, and locked by
        # this statement until it commits. Repeating the status test here would let a planner
        # that believes few rows PENDING (statistics from before a placement) scan every
        # PENDING partition for each claim instead of looking up the ones it locked.
        claimed = self._claimed_cte(node_id, locked, "dbc_claimed")
        started = self._started_cte(claimed, started_at, "dbc_started")
        # A join tree, not a subquery: the columns are named once, which keeps the statement
        # short enough for the driver to cache its parsing (psycopg: 4,096 characters).
        won = self._won(claimed, started)
        job_columns: list[Any] = []
        if with_jobs:
            job_columns, won = self._claimed_job(claimed, won)
            if not job_columns:
                return None
        return (
            select(
                touched.c.node_id.label("dbc_node"),
                *self._claimed_columns(claimed, started),
                *job_columns,
            )
            .select_from(touched.outerjoin(won, true()))
            .order_by(claimed.c.step_execution_id)
        )

    def _claimed_job(self, claimed: Any, won: Any) -> tuple[list[Any], Any]:
        """The columns of the job execution each claimed partition belongs to, each named
        ``CLAIMED_JOB_PREFIX`` + the name a job execution's read gives it, with its parameters
        as one array per parameter column in name order; and ``won`` joined to what they come
        from (outer joins only: a partition won is read back whatever its job's rows say). None
        of them where the database cannot aggregate the parameters into one row: the worker
        then reads the job."""
        je, ji = schema.job_execution.alias("je"), schema.job_instance.alias("ji")
        jc, jp = schema.job_execution_context.alias("jc"), schema.job_execution_params.alias("jp")
        arrays = self.aggregate_parameters(jp, jp.c.parameter_name)
        if arrays is None:
            return [], won
        prefix = CLAIMED_JOB_PREFIX
        # Short aliases keep the statement short for the driver to parse.
        params = (
            select(
                *(
                    array.label(prefix + name)
                    for name, array in zip(schema.PARAMETER_COLUMNS, arrays, strict=True)
                )
            )
            .where(jp.c.job_execution_id == claimed.c.job_execution_id)
            .lateral("jq")
        )
        columns = [
            *(column.label(prefix + column.name) for column in je.c),
            ji.c.job_name.label(prefix + "job_name"),
            ji.c.job_key.label(prefix + "job_key"),
            ji.c.version.label(prefix + "instance_version"),
            jc.c.short_context.label(prefix + "short_context"),
            jc.c.serialized_context.label(prefix + "serialized_context"),
            *params.c,
        ]
        joined = (
            won.outerjoin(je, je.c.job_execution_id == claimed.c.job_execution_id)
            .outerjoin(ji, ji.c.job_instance_id == je.c.job_instance_id)
            .outerjoin(jc, jc.c.job_execution_id == je.c.job_execution_id)
            .outerjoin(params, true())
        )
        return columns, joined

    def _claimed_cte(self, node_id: Any, locked: Any, name: str, table: Any = partitions) -> Any:
        """A claim's update of the partitions ``locked`` (a CTE of their ids) locked, by key
        alone, returning what the executor needs of each."""
        p = table.c
        return (
            self._claim(
                node_id, p.step_execution_id.in_(select(locked.c.step_execution_id)), table=table
            )
            .returning(
                p.step_execution_id,
                p.master_step_execution_id,
                p.job_execution_id,
                p.partition_name,
                p.attempt,
                p.max_attempts,
                p.transferable,
            )
            .cte(name)
        )

    def _started_cte(self, claimed: Any, started_at: Any, name: str, table: Any = None) -> Any:
        """The start of the step executions of what ``claimed`` won, returning their rows."""
        se = schema.step_execution if table is None else table
        return (
            self._start(
                se.c.step_execution_id.in_(select(claimed.c.step_execution_id)),
                started_at=started_at,
                table=table,
            )
            .returning(*se.c)
            .cte(name)
        )

    @staticmethod
    def _won(claimed: Any, started: Any, coordination: Any = None, context: Any = None) -> Any:
        """What a claim reads back, joined: the partitions won, their steps, their worker
        step's name and their contexts."""
        jc = job_coordination if coordination is None else coordination
        sc = schema.step_execution_context if context is None else context
        return (
            claimed.join(started, started.c.step_execution_id == claimed.c.step_execution_id)
            .join(jc, jc.c.job_execution_id == claimed.c.job_execution_id)
            .outerjoin(sc, sc.c.step_execution_id == claimed.c.step_execution_id)
        )
