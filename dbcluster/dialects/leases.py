"""Leases (``batch_leases``): a maintenance task that one node at a time runs (sweeps, the
stranded-master scan, pruning, schedule firing) is run by the holder of its lease, renewed by
the database clock; a holder silent past its term loses it to the next taker.

A lease's row names its holder (a node id) and when it last renewed it (the database clock).
It is *lapsed* when that is ``term_ms`` or more ago, or when its holder is no longer a
registered node (it left, or was removed). The holder renews it only while it is not lapsed
(:meth:`LeaseStatements.renew_leases`); any node takes it only once it is
(:meth:`LeaseStatements.take_lapsed_lease`): of several takers, the first UPDATE renews the row
and the others, judging the row again once its lock is free, find it held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Delete,
    Insert,
    Integer,
    Select,
    Update,
    and_,
    case,
    cast,
    delete,
    exists,
    insert,
    null,
    or_,
    select,
    union_all,
    update,
)

from dbcluster import schema
from dbcluster.dialects.family import StatementFamily


class LeaseStatements(StatementFamily):
    """The leases' statements. ``name`` and ``holder`` are text or bound parameters (a store
    builds the hot ones once)."""

    if TYPE_CHECKING:

        def select_claimable(
            self, node_id: Any, limit: int, steal_after_ms: int | None, unreachable_ms: int
        ) -> Select[Any]: ...

        def heartbeat_values(self, load: Any) -> dict[Any, Any]: ...

    def _lapsed(self, term_ms: int) -> ColumnElement[bool]:
        """The lease row is lapsed: not renewed for ``term_ms``, or its holder is not a
        registered node."""
        leases, nodes = schema.leases, schema.nodes
        registered = exists().where(nodes.c.node_id == leases.c.holder)
        return or_(self.older_than(leases.c.renewed_at, term_ms), ~registered)

    def select_leases(self, term_ms: int) -> Select[Any]:
        """Every lease: its name, holder and whether it is lapsed (1) or held (0), judged by the
        database (one read: what a node that holds none of them looks at)."""
        leases = schema.leases
        lapsed = case((self._lapsed(term_ms), 1), else_=0)
        return select(leases.c.lease_name, leases.c.holder, lapsed.label("lapsed"))

    def poll_and_leases(
        self,
        node_id: Any,
        limit: int | None,
        steal_after_ms: int | None,
        unreachable_ms: int,
        term_ms: int,
    ) -> Select[Any] | CompoundSelect:
        """:meth:`select_leases` beside the idle poll (``select_claimable``; none when
        ``limit`` is None) as one read: what a heartbeat carries for a node that holds none of
        its leases, so that its look for a lapsed one costs no round trip of its own. Each row
        is ``(step_execution_id, job_execution_id, lease_name, holder, lapsed)``: a partition
        found (the lease's columns NULL) or a lease (the poll's columns NULL)."""
        leases, partitions = schema.leases, schema.partitions
        read = self.select_leases(term_ms).subquery("dbc_leases")
        ids = partitions.c.step_execution_id.type, partitions.c.job_execution_id.type
        lease_rows = select(
            cast(null(), ids[0]).label("step_execution_id"),
            cast(null(), ids[1]).label("job_execution_id"),
            read.c.lease_name,
            read.c.holder,
            read.c.lapsed,
        )
        if limit is None:
            return lease_rows
        found = self.select_claimable(node_id, limit, steal_after_ms, unreachable_ms).subquery(
            "dbc_poll"
        )
        poll_rows = select(
            found.c.step_execution_id,
            found.c.job_execution_id,
            cast(null(), leases.c.lease_name.type).label("lease_name"),
            cast(null(), leases.c.holder.type).label("holder"),
            cast(null(), Integer).label("lapsed"),
        )
        return union_all(poll_rows, lease_rows)

    def renew_leases(self, names: Any, holder: Any, term_ms: int) -> Update:
        """The holder renews its leases ``names`` (a list, or an expanding bound parameter) in
        one statement: it changes a lease's row only while ``holder`` still holds it and it has
        not lapsed (a holder that was silent past its term, or was removed, must take it again
        like any node). The row count says how many it renewed."""
        leases = schema.leases
        return (
            update(leases)
            .where(
                leases.c.lease_name.in_(names),
                leases.c.holder == holder,
                ~self._lapsed(term_ms),
            )
            .values(renewed_at=self.now())
        )

    def heartbeat_renewing(
        self, node_id: Any, load: Any, names: Any, term_ms: int
    ) -> Update | None:
        """The node's heartbeat (``heartbeat``) and its renewal of the leases ``names`` it holds
        (:meth:`renew_leases`, under the same fence) as one UPDATE, where the database updates
        two joined tables in one (:attr:`supports_multi_table_update`): the node's row, outer
        joined to those of its lease rows that it holds and that have not lapsed (the node's
        row being there is what "its holder is registered" asks). Its row count is the node
        rows it changed (1; 0 when the node was removed, and then it renewed nothing) plus the
        lease rows it renewed (rows matched: ``CLIENT_FOUND_ROWS``, which SQLAlchemy's MySQL
        drivers set). ``names``: a list (of bound parameters, so that a driver can send it as
        plain text beside a read: see ``read_then_write``). None elsewhere."""
        if not self.supports_multi_table_update:
            return None
        leases, nodes = schema.leases, schema.nodes
        held = and_(
            leases.c.lease_name.in_(names),
            leases.c.holder == nodes.c.node_id,
            ~self.older_than(leases.c.renewed_at, term_ms),
        )
        return (
            update(nodes.outerjoin(leases, held))
            .where(nodes.c.node_id == node_id)
            .values({**self.heartbeat_values(load), leases.c.renewed_at: self.now()})
        )

    def heartbeat_renewing_and_read(
        self, node_id: Any, load: Any, names: Any, term_ms: int, read: Any = None
    ) -> Select[Any] | None:
        """The node's heartbeat, its renewal of the leases ``names`` it holds
        (:meth:`renew_leases`, under the same fence) and ``read`` (a SELECT or a UNION of
        SELECTs, such as ``select_claimable`` or :meth:`poll_and_leases`; None: no read) in one
        statement that commits on its own, where the database can write in a read (PostgreSQL:
        a data-modifying CTE): one row per row of ``read``, or one whose ``read`` columns are
        NULL when it has none (or there is no read); each row's first column ``alive`` counts
        the node rows the heartbeat changed (0: the node was removed and must fence), its
        second ``renewed`` lists the names of the leases it renewed. None: elsewhere (see
        :meth:`heartbeat_renewing`)."""
        return None

    def take_lapsed_lease(self, name: Any, holder: Any, term_ms: int) -> Update:
        """Take the lease ``name`` once it has lapsed (see :meth:`select_leases`); exactly one
        of several takers changes the row."""
        leases = schema.leases
        return (
            update(leases)
            .where(leases.c.lease_name == name, self._lapsed(term_ms))
            .values(holder=holder, renewed_at=self.now())
        )

    def insert_lease(self, name: Any, holder: Any) -> Insert:
        """The lease's first row (a duplicate-key error when another node inserted it first)."""
        return insert(schema.leases).values(lease_name=name, holder=holder, renewed_at=self.now())

    def release_lease(self, name: Any, holder: Any) -> Delete:
        """Give the lease up (its row goes; the next taker inserts it again)."""
        leases = schema.leases
        return delete(leases).where(leases.c.lease_name == name, leases.c.holder == holder)
