"""A worker's side of a partition: polls, the claim, the fence of its transactions, its end, and
handing it back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.engine import Connection

from dbcluster.cluster.store.connector import Connector
from dbcluster.cluster.store.records import ClaimedPartition, NodeRemovedError, PendingPartition
from dbcluster.cluster.store.verify import partition_is
from dbcluster.prebuilt import Prebuilt
from dbcluster.states import (
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_PENDING,
    PARTITION_RELEASED,
    PARTITION_RETRIED,
)


def _claim_binds() -> tuple[Any, ...]:
    """The bind parameters of the one-statement claim (built once per statement, not per
    claim)."""
    return (
        bindparam("b_node"),
        bindparam("b_ids", expanding=True),
        bindparam("b_started_at"),
        bindparam("b_load"),
    )


class Claims(Connector):
    """``batch_partitions`` as workers see them."""

    def poll(
        self,
        node_id: str,
        limit: int,
        *,
        steal_after_ms: int | None = None,
        unreachable_ms: int | None = None,
    ) -> list[int]:
        """Ids of up to ``limit`` PENDING partitions this node may claim, oldest first: its own
        and, with ``unreachable_ms``, those it may steal (see
        :meth:`QueryProvider.select_claimable`). One read."""
        found = self.poll_jobs(
            node_id, limit, steal_after_ms=steal_after_ms, unreachable_ms=unreachable_ms
        )
        return [step_execution_id for step_execution_id, _ in found]

    def poll_jobs(
        self,
        node_id: str,
        limit: int,
        *,
        steal_after_ms: int | None = None,
        unreachable_ms: int | None = None,
    ) -> list[tuple[int, int]]:
        """:meth:`poll`, each id with its partition's job execution id. One read."""
        stmt = self.prepared(
            ("poll", limit, steal_after_ms, unreachable_ms),
            lambda: self.provider.select_claimable(
                bindparam("b_node"), limit, steal_after_ms, unreachable_ms
            ),
        )
        rows = self.rows(stmt, "poll", {"b_node": node_id})
        return [(int(r[0]), int(r[1])) for r in rows]

    def claim(
        self,
        node_id: str,
        load: int,
        step_execution_ids: Sequence[int],
        started_at: datetime,
        *,
        with_jobs: bool = False,
    ) -> list[ClaimedPartition]:
        """Claim polled partitions in one transaction: lock the node's own registry row first
        (a node removed since it polled claims nothing and gets :class:`NodeRemovedError`; a
        removal waits for the claim to commit), lock those still PENDING (skipping rows another
        claimer holds, where the database can), move them to CLAIMED by this node, record
        their step executions STARTED at ``started_at``, and read back what was won with what
        the executor needs (all five in one statement, committing on its own, where the
        provider has :meth:`~dbcluster.dialects.base.QueryProvider.claim_and_start`). A claim
        whose commit's outcome is unclear is judged from the rows. ``with_jobs``: the one
        statement also reads back each partition's job execution where it can (for partitions
        of jobs the node may not know yet: what a wake-up offered)."""
        provider = self.provider
        ids = list(step_execution_ids)
        node = {"b_node": node_id}
        select_claimed = self._select_claimed()
        claim_and_start, prebuilt_claim = self._claim_statement(with_jobs, len(ids))

        touch = lambda: provider.touch_node(bindparam("b_node"), bindparam("b_load"))  # noqa: E731

        def removed() -> NodeRemovedError:
            return NodeRemovedError(f"node {node_id} is no longer registered")

        def touch_own_row(conn: Connection) -> None:
            if self.run(conn, "touch", touch, {**node, "b_load": load}) != 1:
                raise removed()

        def verify(conn: Connection) -> list[ClaimedPartition] | None:
            # What an unclear claim won, read while the node's own row is locked: a node
            # removed meanwhile (its claims fenced under a new attempt in the transaction that
            # deleted its row) learns it here instead of taking its partitions back under the
            # new attempt.
            with conn.begin():
                touch_own_row(conn)
                found = conn.execute(select_claimed, {**node, "b_ids": ids}).mappings()
                return self._claimed(found) or None

        if claim_and_start is not None and self.autocommit is not None:
            params = {**node, "b_ids": ids, "b_started_at": started_at, "b_load": load}
            tries = 0

            def claim_at_once(conn: Connection) -> list[ClaimedPartition]:
                nonlocal tries
                tries += 1
                if prebuilt_claim is not None:
                    rows = [row._mapping for row in prebuilt_claim.all(conn, params)]
                else:
                    rows = conn.execute(claim_and_start, params).mappings().all()
                if not rows:
                    raise removed()
                won = self._claimed(row for row in rows if row["p_id"] is not None)
                if tries == 1:
                    return won
                # An earlier try's statement may have gone on after its connection was lost
                # (the server finishes a statement whose client is gone) and committed a claim
                # after this try's verify looked: this try queued behind it on the node's row,
                # so reading now finds what either won.
                with self.engine.connect() as check:
                    return verify(check) or []

            return self.transaction(claim_at_once, "claim", verify, engine=self.autocommit)

        def work(conn: Connection) -> list[ClaimedPartition]:
            touch_own_row(conn)
            lock = self.prepared(
                "lock claimable",
                lambda: provider.lock_claimable(bindparam("b_ids", expanding=True)),
            )
            locked = [int(r[0]) for r in conn.execute(lock, {"b_ids": ids})]
            if not locked:
                return []
            params = {**node, "b_ids": locked}
            self.run(
                conn,
                "claim",
                lambda: provider.claim_partitions(
                    bindparam("b_node"), bindparam("b_ids", expanding=True)
                ),
                params,
            )
            self.run(
                conn,
                "start claimed",
                lambda: provider.start_claimed(
                    bindparam("b_node"),
                    bindparam("b_ids", expanding=True),
                    bindparam("b_started_at"),
                ),
                {**params, "b_started_at": started_at},
            )
            return self._claimed(conn.execute(select_claimed, params).mappings())

        return self.transaction(work, "claim", verify)

    def _select_claimed(self) -> Any:
        return self.prepared(
            "select claimed",
            lambda: self.provider.select_claimed(
                bindparam("b_node"), bindparam("b_ids", expanding=True)
            ),
        )

    def claimed_by(self, node_id: str, step_execution_ids: Sequence[int]) -> list[ClaimedPartition]:
        """Those of these partitions this node holds CLAIMED, with what the executor needs (as
        a claim reads them back). One read."""
        rows = self.rows(
            self._select_claimed(),
            "read claimed",
            {"b_node": node_id, "b_ids": list(step_execution_ids)},
        )
        return self._claimed(row._mapping for row in rows)

    def _claim_statement(self, with_jobs: bool, count: int) -> tuple[Any, Prebuilt | None]:
        """The one-statement claim (None where the database has none), reading back the jobs
        where asked and it can; and its prebuilt form for ``count`` ids where it has one."""
        provider = self.provider
        # The whole claim in one statement that commits on its own, where the database can;
        # else a transaction of five.
        claim_and_start = None
        if with_jobs:
            claim_and_start = self.prepared(
                "claim and start, reading jobs",
                lambda: provider.claim_and_start_reading_jobs(*_claim_binds()),
            )
            with_jobs = claim_and_start is not None
        if claim_and_start is None:
            claim_and_start = self.prepared(
                "claim and start", lambda: provider.claim_and_start(*_claim_binds())
            )
        if claim_and_start is None or not count:
            return claim_and_start, None
        # Compiled once for this many ids where it can be (see dbcluster.prebuilt): the text
        # SQLAlchemy would send, without its per-execution compilation of the IN list.
        prebuilt: Prebuilt | None = self.prepared(
            ("claim and start, prebuilt", with_jobs, count),
            lambda: Prebuilt.build(claim_and_start, self.engine.dialect, {"b_ids": count}),
        )
        return claim_and_start, prebuilt

    def chained(self, row: Any) -> ClaimedPartition | None:
        """The partition a final write claimed next (see ``PartitionFence.chained``), or None
        when it won none."""
        if row is None or row["p_id"] is None:
            return None
        return self._claimed([row])[0]

    @staticmethod
    def _claimed(rows: Iterable[Any]) -> list[ClaimedPartition]:
        claimed = []
        for row in rows:
            partition = PendingPartition(
                int(row["p_id"]),
                int(row["job_execution_id"]),
                int(row["p_master_id"]),
                row["p_name"],
                int(row["p_attempt"]),
                bool(row["p_transferable"]),
                row["p_worker_step_name"],
                int(row["p_max_attempts"]),
            )
            claimed.append(ClaimedPartition(partition, row))
        return claimed

    def hold_partition(
        self, conn: Connection, step_execution_id: int, node_id: str, attempt: int
    ) -> int:
        """The fence of one transaction of a running partition (see
        :meth:`QueryProvider.hold_partition`); its row count."""
        return self.run(
            conn,
            "hold",
            lambda: self.provider.hold_partition(
                bindparam("b_id"), bindparam("b_node"), bindparam("b_attempt")
            ),
            {"b_id": step_execution_id, "b_node": node_id, "b_attempt": attempt},
        )

    def end_partition(
        self, conn: Connection, outcome: str, step_execution_id: int, node_id: str, attempt: int
    ) -> int:
        """A running partition's last transaction records its outcome: COMPLETED or FAILED
        (:meth:`QueryProvider.finish_partition`), RELEASED (handed back) or RETRIED (back to
        PENDING for another try); its row count."""
        return self.run(
            conn,
            ("end", outcome),
            lambda: self._end_partition(outcome),
            {"b_id": step_execution_id, "b_node": node_id, "b_attempt": attempt},
        )

    def _end_partition(self, outcome: str) -> Any:
        provider = self.provider
        builders: dict[str, Callable[[Any, Any, Any], Any]] = {
            PARTITION_RELEASED: provider.release_partition,
            PARTITION_RETRIED: provider.retry_partition,
            PARTITION_COMPLETED: lambda i, n, a: provider.finish_partition(
                i, n, a, PARTITION_COMPLETED
            ),
            PARTITION_FAILED: lambda i, n, a: provider.finish_partition(i, n, a, PARTITION_FAILED),
        }
        return builders[outcome](bindparam("b_id"), bindparam("b_node"), bindparam("b_attempt"))

    def end_partition_statement(self, outcome: str) -> Any | None:
        """:meth:`end_partition`'s guarded UPDATE (parameters ``b_id``, ``b_node``,
        ``b_attempt``), built once, for a write that runs it in its own statement; None where
        the database bounds its lock wait with statements of its own first."""

        def build() -> Any:
            statement = self._end_partition(outcome)
            return statement if len(self.provider.bounded(statement)) == 1 else None

        return self.prepared(("end statement", outcome), build)

    def release(self, step_execution_id: int, node_id: str, attempt: int) -> bool:
        return self.guarded(
            self.provider.release_partition(step_execution_id, node_id, attempt),
            "release",
            partition_is(step_execution_id, PARTITION_PENDING, None, attempt + 1),
        )

    def release_pending(self, node_id: str) -> int:
        def work(conn: Connection) -> int:
            return self.execute(conn, self.provider.release_pending_for_node(node_id))

        return self.transaction(work, "release pending")
