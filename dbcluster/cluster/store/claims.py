"""A worker's side of a partition: polls, the claim, the fence of its transactions, its end, and
handing it back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.engine import Connection

from dbcluster.cluster.store.connector import Connector
from dbcluster.cluster.store.leases import LeaseRow
from dbcluster.cluster.store.records import ClaimedPartition, NodeRemovedError, PendingPartition
from dbcluster.cluster.store.verify import partition_is
from dbcluster.prebuilt import Prebuilt
from dbcluster.states import (
    PARTITION_CLAIMED,
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


def claimed_partitions(rows: Iterable[Any]) -> list[ClaimedPartition]:
    """The partitions a claim won, from the rows it read back (``p_*`` columns, and the step
    execution's as the claim left it)."""
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


class Claims(Connector):
    """``batch_partitions`` as workers see them."""

    def touch_own_row(self, conn: Connection, node_id: str, load: int) -> None:
        """Lock the node's own registry row (publishing its load): a node removed since it
        polled gets :class:`NodeRemovedError` (a removal waits for what locked it to commit)."""
        touched = self.run(
            conn,
            "touch",
            lambda: self.provider.touch_node(bindparam("b_node"), bindparam("b_load")),
            {"b_node": node_id, "b_load": load},
        )
        if touched != 1:
            raise NodeRemovedError(f"node {node_id} is no longer registered")

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
        rows = self.prepared_rows(stmt, "poll", {"b_node": node_id})
        return [(int(r[0]), int(r[1])) for r in rows]

    def beat_and_poll(
        self,
        node_id: str,
        load: int,
        limit: int,
        *,
        steal_after_ms: int | None = None,
        unreachable_ms: int | None = None,
    ) -> tuple[bool, list[tuple[int, int]]] | None:
        """The node's heartbeat and :meth:`poll_jobs` in one round trip (one statement on the
        autocommit engine), where the database can: (whether the node's row was there,
        what the poll found). None where it cannot (the caller sends the two itself)."""
        provider = self.provider
        engine = self.autocommit
        bounded = self._bounded_heartbeat()
        if engine is None or len(bounded) != 1:
            return None
        params = {"b_node": node_id, "b_load": load}
        key = (limit, steal_after_ms, unreachable_ms)
        stmt = self.prepared(
            ("beat and poll", *key),
            lambda: provider.heartbeat_and_poll(
                bindparam("b_node"), bindparam("b_load"), limit, steal_after_ms, unreachable_ms
            ),
        )
        if stmt is not None:
            rows = self.prepared_rows(stmt, "heartbeat and poll", params)
            alive = bool(rows) and int(rows[0][0]) == 1
            return alive, [(int(r[1]), int(r[2])) for r in rows if r[1] is not None]
        # Else the poll and the heartbeat as one request, where the driver can send them so.
        pair = self.paired(
            ("poll then beat", *key),
            lambda: provider.select_claimable(
                bindparam("b_node"), limit, steal_after_ms, unreachable_ms
            ),
            bounded[0],
        )
        if pair is None:
            return None
        rows, changed = self.run_pair(pair, params, "poll and heartbeat")
        return changed == 1, [(int(r[0]), int(r[1])) for r in rows]

    def beat_reading_leases(
        self,
        node_id: str,
        load: int,
        limit: int | None,
        term_ms: int,
        *,
        steal_after_ms: int | None = None,
        unreachable_ms: int = 0,
    ) -> tuple[bool, list[tuple[int, int]], dict[str, LeaseRow]] | None:
        """The node's heartbeat, the idle poll (unless ``limit`` is None) and every lease (see
        ``LeaseRows.leases``) in one round trip, where the database can (one statement on the
        autocommit engine, or a read and a write in one request): (whether the node's row was
        there, what the poll found, the leases). None where it cannot (the caller sends them
        itself)."""
        provider = self.provider
        engine = self.autocommit
        bounded = self._bounded_heartbeat()
        if engine is None or len(bounded) != 1:
            return None
        params = {"b_node": node_id, "b_load": load}
        key = (limit, steal_after_ms, unreachable_ms, term_ms)

        def read() -> Any:
            return provider.poll_and_leases(
                bindparam("b_node"), limit, steal_after_ms, unreachable_ms, term_ms
            )

        stmt = self.prepared(
            ("beat reading leases", *key),
            lambda: provider.heartbeat_and_read(bindparam("b_node"), bindparam("b_load"), read()),
        )
        if stmt is not None:
            rows = self.prepared_rows(stmt, "heartbeat reading leases", params)
            alive = bool(rows) and int(rows[0][0]) == 1
            return (alive, *polled_and_leases([r[1:] for r in rows]))
        pair = self.paired(("read then beat", *key), read, bounded[0])
        if pair is None:
            return None
        rows, changed = self.run_pair(pair, params, "heartbeat reading leases")
        return (changed == 1, *polled_and_leases(rows))

    def _bounded_heartbeat(self) -> Any:
        """The heartbeat with its bounded lock wait (one statement where the session bounds
        it)."""
        return self.prepared(
            ("bounded", "heartbeat"),
            lambda: self.provider.bounded(
                self.provider.heartbeat(bindparam("b_node"), bindparam("b_load"))
            ),
        )

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
        claim = PartitionClaim(self, node_id, load, step_execution_ids, started_at, with_jobs)
        if claim.one_statement is not None and self.autocommit is not None:
            return self.transaction(claim.at_once, "claim", claim.verify, engine=self.autocommit)
        return self.transaction(claim.in_steps, "claim", claim.verify)

    def _select_claimed(self) -> Any:
        return self.prepared(
            "select claimed",
            lambda: self.provider.select_claimed(
                bindparam("b_node"), bindparam("b_ids", expanding=True)
            ),
        )

    def read_back(
        self, node_id: str, load: int, step_execution_ids: Sequence[int]
    ) -> list[ClaimedPartition]:
        """Those of these partitions this node holds CLAIMED, read as an unclear claim is
        judged (:meth:`PartitionClaim.verify`: the node's own row locked first), for a claim
        that failed past its retries: a node removed meanwhile gets :class:`NodeRemovedError`
        rather than partitions its removal already gave their masters. Repeated on transient
        errors like any statement; the caller decides how long to wait for the database."""
        return self.transaction(
            lambda conn: read_claimed_locked(self, conn, node_id, load, step_execution_ids),
            "read back a claim",
        )

    def claimed_by(self, node_id: str, step_execution_ids: Sequence[int]) -> list[ClaimedPartition]:
        """Those of these partitions this node holds CLAIMED, with what the executor needs (as
        a claim reads them back). One read."""
        rows = self.rows(
            self._select_claimed(),
            "read claimed",
            {"b_node": node_id, "b_ids": list(step_execution_ids)},
        )
        return claimed_partitions(row._mapping for row in rows)

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

    @staticmethod
    def claimed_next(row: Any) -> ClaimedPartition | None:
        """The partition a final write claimed next (the row its claim read back:
        ``PartitionFence.next_claim``), or None when it won none."""
        if row is None or row["p_id"] is None:
            return None
        return claimed_partitions([row])[0]

    def hold_partition(
        self,
        conn: Connection,
        step_execution_id: int,
        node_id: str,
        attempt: int,
        *,
        placed: bool = False,
    ) -> int:
        """The fence of one transaction of a running partition (see
        :meth:`QueryProvider.hold_partition`; ``placed``: it claims a partition placed on this
        node that it runs before claiming); its row count."""
        return self.run(
            conn,
            ("hold", placed),
            lambda: self.provider.hold_partition(
                bindparam("b_id"), bindparam("b_node"), bindparam("b_attempt"), placed=placed
            ),
            {"b_id": step_execution_id, "b_node": node_id, "b_attempt": attempt},
        )

    def end_partition(
        self,
        conn: Connection,
        outcome: str,
        step_execution_id: int,
        node_id: str,
        attempt: int,
        *,
        placed: bool = False,
    ) -> int:
        """A running partition's last transaction records its outcome: COMPLETED or FAILED
        (:meth:`QueryProvider.finish_partition`), RELEASED (handed back) or RETRIED (back to
        PENDING for another try); its row count. ``placed``: from PENDING too (a partition
        run before it was claimed, see :meth:`hold_partition`)."""
        return self.run(
            conn,
            ("end", outcome, placed),
            lambda: self._end_partition(outcome, placed),
            {"b_id": step_execution_id, "b_node": node_id, "b_attempt": attempt},
        )

    def end_partitions(
        self, conn: Connection, node_id: str, members: Sequence[tuple[int, int]]
    ) -> int:
        """A group's final transaction records its partitions COMPLETED (each ``(id,
        attempt)`` of ``members`` CLAIMED by this node), in one statement built once per group
        size; its row count (the caller requires one per member)."""
        count = len(members)
        params: dict[str, Any] = {"g_node": node_id}
        for k, (step_execution_id, attempt) in enumerate(members):
            params[f"g_id{k}"], params[f"g_at{k}"] = step_execution_id, attempt
        return self.run(
            conn,
            ("end group", count),
            lambda: self.provider.finish_partitions(
                bindparam("g_node"),
                [(bindparam(f"g_id{k}"), bindparam(f"g_at{k}")) for k in range(count)],
                PARTITION_COMPLETED,
            ),
            params,
        )

    def _end_partition(self, outcome: str, placed: bool = False) -> Any:
        provider = self.provider
        builders: dict[str, Callable[[Any, Any, Any], Any]] = {
            PARTITION_RELEASED: lambda i, n, a: provider.release_partition(i, n, a, placed=placed),
            PARTITION_RETRIED: lambda i, n, a: provider.retry_partition(i, n, a, placed=placed),
            PARTITION_COMPLETED: lambda i, n, a: provider.finish_partition(
                i, n, a, PARTITION_COMPLETED, placed=placed
            ),
            PARTITION_FAILED: lambda i, n, a: provider.finish_partition(
                i, n, a, PARTITION_FAILED, placed=placed
            ),
        }
        return builders[outcome](bindparam("b_id"), bindparam("b_node"), bindparam("b_attempt"))

    def end_partition_statement(self, outcome: str, placed: bool = False) -> Any | None:
        """:meth:`end_partition`'s guarded UPDATE (parameters ``b_id``, ``b_node``,
        ``b_attempt``), built once, for a write that runs it in its own statement; None where
        the database bounds its lock wait with statements of its own first."""

        def build() -> Any:
            statement = self._end_partition(outcome, placed)
            return statement if len(self.provider.bounded(statement)) == 1 else None

        return self.prepared(("end statement", outcome, placed), build)

    def release(
        self, step_execution_id: int, node_id: str, attempt: int, *, placed: bool = False
    ) -> bool:
        return self.guarded(
            self.provider.release_partition(step_execution_id, node_id, attempt, placed=placed),
            "release",
            partition_is(
                step_execution_id, PARTITION_PENDING, None, attempt + 1, self.provider.locked
            ),
        )

    def claim_placed(self, step_execution_id: int, node_id: str, attempt: int) -> bool:
        """Claim a partition placed on this node that it runs already, before its first
        transaction commits (which would claim it): PENDING -> CLAIMED under the same node
        and attempt (a long first transaction must not leave it PENDING for others to take
        after ``work_stealing_delay``). Whether it changed the row (not: the first
        transaction claimed it already, or it moved)."""
        return self.guarded(
            self.provider.claim_partition(step_execution_id, node_id, attempt, placed=True),
            "claim placed",
            partition_is(
                step_execution_id, PARTITION_CLAIMED, node_id, attempt, self.provider.locked
            ),
        )

    def release_pending(self, node_id: str) -> int:
        def work(conn: Connection) -> int:
            return self.execute(conn, self.provider.release_pending_for_node(node_id))

        return self.transaction(work, "release pending")


def polled_and_leases(
    rows: Iterable[Any],
) -> tuple[list[tuple[int, int]], dict[str, LeaseRow]]:
    """The rows of ``poll_and_leases``: the partitions found (oldest first), the leases."""
    found: list[tuple[int, int]] = []
    leases: dict[str, LeaseRow] = {}
    for sid, jid, name, holder, lapsed in rows:
        if sid is not None:
            found.append((int(sid), int(jid)))
        elif name is not None:
            leases[str(name)] = LeaseRow(str(name), str(holder), bool(lapsed))
    found.sort()
    return found, leases


def read_claimed_locked(
    store: Claims, conn: Connection, node_id: str, load: int, ids: Sequence[int]
) -> list[ClaimedPartition]:
    """Those of ``ids`` the node holds CLAIMED, read in ``conn``'s transaction while its own row
    is locked: a node removed meanwhile (its claims fenced under a new attempt in the
    transaction that deleted its row) learns it here (:class:`NodeRemovedError`) instead of
    taking its partitions back under the new attempt."""
    store.touch_own_row(conn, node_id, load)
    params = {"b_node": node_id, "b_ids": list(ids)}
    return claimed_partitions(conn.execute(store._select_claimed(), params).mappings())


class PartitionClaim:
    """One claim of :meth:`Claims.claim`: polled partitions for one node, tried in one statement
    that commits on its own (:meth:`at_once`) or in one transaction of five (:meth:`in_steps`),
    each try judged by :meth:`verify` after an unclear commit."""

    def __init__(
        self,
        store: Claims,
        node_id: str,
        load: int,
        step_execution_ids: Sequence[int],
        started_at: datetime,
        with_jobs: bool,
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.load = load
        self.ids = list(step_execution_ids)
        self.started_at = started_at
        self.one_statement, self.prebuilt = store._claim_statement(with_jobs, len(self.ids))
        self.tries = 0

    def verify(self, conn: Connection) -> list[ClaimedPartition] | None:
        """What an unclear claim won (see :func:`read_claimed_locked`)."""
        with conn.begin():
            found = read_claimed_locked(self.store, conn, self.node_id, self.load, self.ids)
        return found or None

    def at_once(self, conn: Connection) -> list[ClaimedPartition]:
        """The whole claim in one statement (on the autocommit engine)."""
        self.tries += 1
        params = {
            "b_node": self.node_id,
            "b_ids": self.ids,
            "b_started_at": self.started_at,
            "b_load": self.load,
        }
        if self.prebuilt is not None:
            rows = [row._mapping for row in self.prebuilt.all(conn, params)]
        else:
            rows = conn.execute(self.one_statement, params).mappings().all()
        if not rows:
            raise NodeRemovedError(f"node {self.node_id} is no longer registered")
        won = claimed_partitions(row for row in rows if row["p_id"] is not None)
        if self.tries == 1:
            return won
        # An earlier try's statement may have gone on after its connection was lost (the server
        # finishes a statement whose client is gone) and committed a claim after this try's
        # verify looked: this try queued behind it on the node's row, so reading now finds
        # what either won.
        with self.store.engine.connect() as check:
            return self.verify(check) or []

    def in_steps(self, conn: Connection) -> list[ClaimedPartition]:
        """The claim as a transaction: the node's row, the partitions still PENDING locked,
        moved to CLAIMED, their step executions STARTED, and what was won read back."""
        store, provider = self.store, self.store.provider
        store.touch_own_row(conn, self.node_id, self.load)
        lock = store.prepared(
            "lock claimable",
            lambda: provider.lock_claimable(bindparam("b_ids", expanding=True)),
        )
        locked = [int(r[0]) for r in conn.execute(lock, {"b_ids": self.ids})]
        if not locked:
            return []
        params = {"b_node": self.node_id, "b_ids": locked}
        store.run(
            conn,
            "claim",
            lambda: provider.claim_partitions(
                bindparam("b_node"), bindparam("b_ids", expanding=True)
            ),
            params,
        )
        store.run(
            conn,
            "start claimed",
            lambda: provider.start_claimed(
                bindparam("b_node"),
                bindparam("b_ids", expanding=True),
                bindparam("b_started_at"),
            ),
            {**params, "b_started_at": self.started_at},
        )
        return claimed_partitions(conn.execute(store._select_claimed(), params).mappings())
