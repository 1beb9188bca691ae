"""The node registry: registration, heartbeats, sweeps, capacity, leaving, and the live nodes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.engine import Connection

from dbcluster.cluster.store.records import NodeInfo
from dbcluster.cluster.store.wakeups import WakeUps
from dbcluster.states import NODE_ACTIVE, NODE_REMOVING, NODE_UNREACHABLE


class NodeRegistry(WakeUps):
    """``batch_nodes``."""

    def db_now(self) -> datetime:
        return self.rows(self.provider.select_now(), "clock")[0][0]

    def register(self, node_id: str, host: str, capacity: int) -> None:
        def work(conn: Connection) -> None:
            self.provider.register_node(conn, node_id, host, capacity)

        self.transaction(work, "register")

    def heartbeat(self, node_id: str, load: int) -> bool:
        """False when the node's row is gone: it was declared dead and must fence. One
        statement, committed on its own."""
        changed = self.write_one(
            "heartbeat",
            lambda: self.provider.heartbeat(bindparam("b_node"), bindparam("b_load")),
            {"b_node": node_id, "b_load": load},
            "heartbeat",
        )
        return changed == 1

    def sweep(self, unreachable_ms: int, cleanup_ms: int) -> tuple[int, int]:
        """Mark silent nodes UNREACHABLE; remove those silent past ``cleanup_ms``, fencing the
        partitions they had claimed in the same transaction (see
        :meth:`QueryProvider.fence_partitions_of_removing`). A read first says whether there is
        anything to do: an idle cluster's sweep is one statement. Where a sweep made unstarted
        partitions claimable by others (PENDING on a node it marked or removes), it wakes the
        live worker nodes in its transaction (where the database has LISTEN/NOTIFY): they poll
        at once rather than at their fallback poll."""
        provider = self.provider
        stale = self.prepared(
            ("stale", unreachable_ms, cleanup_ms),
            lambda: provider.select_stale_node(unreachable_ms, cleanup_ms),
        )
        if not self.rows(stale, "sweep check"):
            return 0, 0

        def mark(conn: Connection) -> int:
            marked = self.execute(conn, provider.mark_unreachable(unreachable_ms))
            if marked:
                self._wake_for_pending_of(conn, NODE_UNREACHABLE)
            return marked

        def remove(conn: Connection) -> int:
            if not self.execute(conn, provider.mark_removing(cleanup_ms)):
                return 0
            self._wake_for_pending_of(conn, NODE_REMOVING)
            # Waits for a final write of theirs that claimed its next partition (see
            # QueryProvider.lock_removing): the fencing below then moves that one too.
            conn.execute(provider.lock_removing()).all()
            self.execute(conn, provider.fence_partitions_of_removing())
            return self.execute(conn, provider.delete_removing())

        return self.transaction(mark, "mark unreachable"), self.transaction(remove, "remove nodes")

    def _wake_for_pending_of(self, conn: Connection, status: str) -> None:
        """In a sweep's transaction: when a node in ``status`` holds PENDING partitions (others
        may claim them now), wake the live worker nodes, where the database has wake-ups."""
        if not self.provider.supports_listen_notify:
            return
        pending = self.prepared(
            ("pending of", status), lambda: self.provider.select_pending_of(status)
        )
        if conn.execute(pending).first() is None:
            return
        self.wake_nodes(conn, [node.node_id for node in self.worker_nodes(conn)])

    def set_capacity(self, node_id: str, capacity: int) -> None:
        def work(conn: Connection) -> None:
            self.execute(conn, self.provider.set_node_capacity(node_id, capacity))

        self.transaction(work, "capacity")

    def deregister(self, node_id: str) -> None:
        """Leave the registry: lock the node's row, fence what it still has CLAIMED (as a
        removal does), delete the row; one transaction."""
        provider = self.provider

        def work(conn: Connection) -> None:
            if self.execute(conn, provider.touch_node(node_id, 0)) != 1:
                return
            conn.execute(provider.lock_node(node_id)).all()  # see QueryProvider.lock_node
            self.execute(conn, provider.fence_claims_of(node_id))
            self.execute(conn, provider.deregister_node(node_id))

        self.transaction(work, "deregister")

    def select_nodes(self, status: str | None = NODE_ACTIVE) -> Any:
        """The read of the registered nodes (in ``status``), built once."""
        return self.prepared(("nodes", status), lambda: self.provider.select_nodes(status))

    def nodes(
        self,
        status: str | None = NODE_ACTIVE,
        conn: Connection | None = None,
        *,
        found: Sequence[Sequence[Any]] | None = None,
    ) -> list[NodeInfo]:
        """The registered nodes (in ``status``); read in ``conn``'s transaction if given;
        ``found``: the rows of :meth:`select_nodes`' read that another statement made (no read
        here)."""
        stmt = self.select_nodes(status)
        if found is not None:
            # Rows of that read made by another statement (a launch's creating one): by name.
            names = [column.key for column in stmt.selected_columns]
            rows = [SimpleNamespace(**dict(zip(names, r, strict=True))) for r in found]
            rows.sort(key=lambda r: r.node_id)  # as the read orders them
        elif conn is None:
            rows = self.rows(stmt, "nodes")
        else:
            rows = conn.execute(stmt).all()
        return [
            NodeInfo(r.node_id, r.host, r.status, r.current_load, r.capacity, r.last_heartbeat)
            for r in rows
        ]

    def worker_nodes(
        self,
        conn: Connection | None = None,
        *,
        found: Sequence[Sequence[Any]] | None = None,
    ) -> list[NodeInfo]:
        """ACTIVE nodes that take partitions (``found``: see :meth:`nodes`)."""
        return [n for n in self.nodes(NODE_ACTIVE, conn, found=found) if n.capacity > 0]
