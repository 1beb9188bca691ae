"""The node registry (``batch_nodes``): registration, heartbeats, the sweeps that mark silent
nodes UNREACHABLE and remove them (fencing what they had claimed), and the reads of who is alive.

A node's row is the fence of its claims: a claim updates it first (``touch_node``), and a
removal locks it before it moves the node's partitions to their next attempt, so a removed node
commits nothing more. A provider overrides ``register_node`` where its database has a native
upsert (the default updates, then inserts).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Delete, Select, Update, and_, delete, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from dbcluster.dialects.family import StatementFamily
from dbcluster.schema import nodes, partitions
from dbcluster.states import (
    NODE_ACTIVE,
    NODE_REMOVING,
    NODE_UNREACHABLE,
    PARTITION_CLAIMED,
    PARTITION_PENDING,
)


class NodeStatements(StatementFamily):
    """The node registry's statements."""

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        """Insert the node ACTIVE, or refresh it if the id is already there."""
        values = self._node_values(host, capacity)
        refreshed = conn.execute(
            update(nodes).where(nodes.c.node_id == node_id).values(**values)
        ).rowcount
        if refreshed:
            return
        try:
            with conn.begin_nested():
                conn.execute(
                    insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
                )
        except IntegrityError:
            conn.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))

    def _node_values(self, host: str, capacity: int) -> dict[str, Any]:
        return {
            "host": host,
            "capacity": capacity,
            "status": NODE_ACTIVE,
            "last_heartbeat": self.now(),
            "current_load": 0,
        }

    def heartbeat(self, node_id: str, load: int) -> Update:
        """Refresh the heartbeat; changes no row when the node was removed (then it must fence)."""
        return update(nodes).where(nodes.c.node_id == node_id).values(self.heartbeat_values(load))

    def heartbeat_values(self, load: Any) -> dict[Any, Any]:
        """What a heartbeat sets on the node's row (by column): also what a statement that
        carries the heartbeat with another write sets (``heartbeat_renewing``)."""
        return {
            nodes.c.last_heartbeat: self.now(),
            nodes.c.current_load: load,
            nodes.c.status: NODE_ACTIVE,
        }

    def set_node_capacity(self, node_id: str, capacity: int) -> Update:
        return update(nodes).where(nodes.c.node_id == node_id).values(capacity=capacity)

    def touch_node(self, node_id: str, load: int) -> Update:
        """The first statement of a claim: the claiming node is still registered (exactly one
        row changes) and stays so until the claim commits, because the row is now locked and a
        sweeper's removal of it waits (or was seen)."""
        return update(nodes).where(nodes.c.node_id == node_id).values(current_load=load)

    # --- sweeps: silent nodes are marked, then removed with their claims fenced -----------------

    def mark_unreachable(self, threshold_ms: int) -> Update:
        return (
            update(nodes)
            .where(
                nodes.c.status == NODE_ACTIVE,
                self.older_than(nodes.c.last_heartbeat, threshold_ms),
            )
            .values(status=NODE_UNREACHABLE)
        )

    def select_stale_node(self, unreachable_ms: int, cleanup_ms: int) -> Select[Any]:
        """Whether a sweep has anything to do (an ACTIVE node to mark, an UNREACHABLE one to
        remove): one cheap read, so an idle cluster's sweeps cost one statement."""
        return (
            select(nodes.c.node_id)
            .where(
                or_(
                    and_(
                        nodes.c.status == NODE_ACTIVE,
                        self.older_than(nodes.c.last_heartbeat, unreachable_ms),
                    ),
                    and_(
                        nodes.c.status == NODE_UNREACHABLE,
                        self.older_than(nodes.c.last_heartbeat, cleanup_ms),
                    ),
                )
            )
            .limit(1)
        )

    def select_pending_of(self, status: str) -> Select[Any]:
        """Whether a sweep made work claimable by others: a PENDING partition placed on a node
        in ``status`` (UNREACHABLE: marked just now; REMOVING: being removed), which the live
        nodes' polls may take at once (see ``select_claimable``). One row at most."""
        silent = select(nodes.c.node_id).where(nodes.c.status == status)
        return (
            select(partitions.c.step_execution_id)
            .where(
                partitions.c.assigned_node.in_(silent.scalar_subquery()),
                partitions.c.status == PARTITION_PENDING,
            )
            .limit(1)
        )

    def mark_removing(self, threshold_ms: int) -> Update:
        """Removal, first statement: lock the UNREACHABLE nodes silent past ``threshold_ms`` by
        marking them REMOVING (a state no other transaction ever sees committed)."""
        return (
            update(nodes)
            .where(
                nodes.c.status == NODE_UNREACHABLE,
                self.older_than(nodes.c.last_heartbeat, threshold_ms),
            )
            .values(status=NODE_REMOVING)
        )

    def lock_removing(self) -> Select[Any]:
        """Removal, between :meth:`mark_removing` and :meth:`fence_partitions_of_removing`: the
        REMOVING rows locked ``FOR UPDATE``. Marking them took a lock that a partition's final
        write claiming the next one (``FOR KEY SHARE``: see :meth:`_claim_after`) does not wait
        for, nor it for that; this one waits for such a write to commit, so the fencing UPDATE
        after it (a statement of its own, which sees that commit) moves what it claimed too, and
        a final write that comes later finds the row locked and claims nothing."""
        return self.locked(select(nodes.c.node_id).where(nodes.c.status == NODE_REMOVING))

    def fence_partitions_of_removing(self) -> Update:
        """Removal, second statement: every partition the removed nodes had CLAIMED moves to its
        next attempt, in the removal's transaction. Its row lock makes the removal wait for a
        chunk transaction of the removed node that holds it, or that transaction sees the new
        attempt and rolls back: a removed node commits nothing more. Unclaimed partitions keep
        their attempt (no claim commits once the node row is gone)."""
        removing = select(nodes.c.node_id).where(nodes.c.status == NODE_REMOVING)
        return (
            update(partitions)
            .where(
                partitions.c.status == PARTITION_CLAIMED,
                partitions.c.assigned_node.in_(removing.scalar_subquery()),
            )
            .values(attempt=partitions.c.attempt + 1, last_updated=self.now())
        )

    def delete_removing(self) -> Delete:
        """Removal, last statement."""
        return delete(nodes).where(nodes.c.status == NODE_REMOVING)

    # --- a node leaving of its own accord -------------------------------------------------------

    def lock_node(self, node_id: Any) -> Select[Any]:
        """A node leaving, before :meth:`fence_claims_of`: its row locked ``FOR UPDATE``, for
        the reason :meth:`lock_removing` gives."""
        return self.locked(select(nodes.c.node_id).where(nodes.c.node_id == node_id))

    def fence_claims_of(self, node_id: str) -> Update:
        """A node leaving the registry of its own accord (a graceful stop): what it still has
        CLAIMED moves to its next attempt, in the transaction that deletes its row (its master
        then moves it under a token this node never held)."""
        return (
            update(partitions)
            .where(partitions.c.status == PARTITION_CLAIMED, partitions.c.assigned_node == node_id)
            .values(attempt=partitions.c.attempt + 1, last_updated=self.now())
        )

    def deregister_node(self, node_id: str) -> Delete:
        return delete(nodes).where(nodes.c.node_id == node_id)

    # --- who is there ---------------------------------------------------------------------------

    def select_nodes(self, status: str | None = NODE_ACTIVE) -> Select[Any]:
        stmt = select(
            nodes.c.node_id,
            nodes.c.host,
            nodes.c.status,
            nodes.c.current_load,
            nodes.c.capacity,
            nodes.c.created_time,
            nodes.c.last_heartbeat,
        ).order_by(nodes.c.node_id)
        if status is not None:
            stmt = stmt.where(nodes.c.status == status)
        return stmt

    def select_nodes_with_age(self) -> Select[Any]:
        """Every node with the database clock beside it (heartbeat age is computed by the caller
        from two values read from the same clock)."""
        return self.select_nodes(None).add_columns(self.now().label("db_now"))
