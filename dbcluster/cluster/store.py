"""Executes the provider's coordination statements and judges their row counts.

Every method is one short transaction on the node's coordination engine, or one statement on its
autocommit engine (a read, a heartbeat: one round trip each, where the database has an
autocommit mode). Statements on the hot paths (heartbeat, poll, claim, a partition's fence) are
built once per store with bound parameters and reused. Transient errors (as the provider
classifies them) are retried with backoff; a guarded transition whose first try may have
committed before the error is re-checked from the row rather than trusted to a second row count.
Methods that act for a master take its :class:`~dbcluster.batch.fence.Fence` and hold it first in
the same transaction, so a master that lost its mastership changes nothing.

Lock order (every dbcluster transaction takes rows in this order, so none deadlocks with another):
``batch_nodes`` -> ``batch_job_coordination`` -> ``batch_partitions`` -> the application's rows
-> ``batch_step_execution`` (and its context) -> ``batch_job_execution`` (and its context).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any, TypeVar

from sqlalchemy import Engine, Text, bindparam, cast, select
from sqlalchemy.engine import Connection, RowMapping

from dbcluster.batch.domain import utcnow
from dbcluster.batch.fence import Fence, hold
from dbcluster.batch.repository import JobRepository, Riders
from dbcluster.batch.status import EXIT_ABANDONED, EXIT_NODE_LOST, BatchStatus
from dbcluster.dialects import QueryProvider, get_provider
from dbcluster.dialects.base import PLACED_COLUMNS, array_parameters
from dbcluster.inlists import in_batches
from dbcluster.prebuilt import Prebuilt, PrebuiltStatements
from dbcluster.retry import Retry
from dbcluster.schema import job_coordination, job_execution, partitions
from dbcluster.states import (
    COORD_ABANDONED,
    COORD_COMPLETED,
    COORD_FAILED,
    COORD_RECOVERING,
    COORD_STARTED,
    JOB_COMPLETED,
    NODE_ACTIVE,
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_PENDING,
    PARTITION_RELEASED,
    PARTITION_RETRIED,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class NodeRemovedError(RuntimeError):
    """The node's registry row is gone: it was declared dead and must fence itself."""


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    host: str
    status: str
    current_load: int
    capacity: int
    last_heartbeat: datetime | None = None


@dataclass(frozen=True)
class PendingPartition:
    step_execution_id: int
    job_execution_id: int
    master_step_execution_id: int
    partition_name: str
    attempt: int
    transferable: bool
    worker_step_name: str
    max_attempts: int = 1


@dataclass(frozen=True)
class ClaimedPartition:
    """A partition a claim won, with its step execution's row as the claim left it (STARTED)."""

    partition: PendingPartition
    row: RowMapping


@dataclass(frozen=True)
class OrphanedPartition:
    step_execution_id: int
    partition_name: str
    assigned_node: str | None
    attempt: int
    status: str
    transferable: bool
    #: When it was put back for another try (None: not a retry), and the database clock now.
    retried_at: datetime | None = None
    db_now: datetime | None = None

    def due(self, backoff_ms: int) -> bool:
        """Whether it may be placed now (a retry waits out its backoff)."""
        if self.retried_at is None or self.db_now is None:
            return True
        return (self.db_now - self.retried_at).total_seconds() * 1000 >= backoff_ms


@dataclass(frozen=True)
class StalledPartition:
    step_execution_id: int
    partition_name: str
    assigned_node: str
    attempt: int
    max_attempts: int
    transferable: bool


@dataclass(frozen=True)
class StrandedJob:
    job_execution_id: int
    master_node: str
    master_epoch: int
    master_step_execution_id: int
    status: str


def offer_payload(step_execution_ids: Iterable[int], limit: int) -> str:
    """A wake-up's payload: the ids placed on the node, comma-separated, as many as fit in
    ``limit`` bytes (the node polls for the rest)."""
    text = ""
    for sid in step_execution_ids:
        item = f"{text and ','}{int(sid)}"
        if len(text) + len(item) > limit:
            break
        text += item
    return text


def offered_ids(payload: str) -> list[int]:
    """The step execution ids a wake-up's payload names (none for an empty or foreign one)."""
    ids = []
    for item in payload.split(","):
        item = item.strip()
        if item.isdigit():
            ids.append(int(item))
    return ids


def _claim_binds() -> tuple[Any, ...]:
    """The bind parameters of the one-statement claim (built once per statement, not per
    claim)."""
    return (
        bindparam("b_node"),
        bindparam("b_ids", expanding=True),
        bindparam("b_started_at"),
        bindparam("b_load"),
    )


def _placed_arrays(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Partition rows as the array parameters of ``insert_partitions_from_arrays``."""
    unknown = {name for row in rows for name in row} - set(PLACED_COLUMNS)
    if unknown:
        raise ValueError(f"partition rows name columns a placement does not set: {unknown}")
    return array_parameters(rows, PLACED_COLUMNS)


class CoordinationStore:
    def __init__(
        self,
        engine: Engine,
        provider: QueryProvider | None = None,
        *,
        retries: int = 4,
        backoff_s: float = 0.05,
        autocommit: Engine | None = None,
    ) -> None:
        self.engine = engine
        self.provider = provider or get_provider(engine)
        #: Transient errors (as the provider classifies them) are tried ``retries`` times more.
        self.retry = Retry(self.provider.is_transient, attempts=retries + 1, pause_s=backoff_s)
        #: Single statements (reads, heartbeats) run here, each committing on its own; None:
        #: in a transaction of ``engine``.
        self.autocommit = autocommit
        self._prepared: dict[Any, Any] = {}
        #: The launch's statements of those, prebuilt (see :mod:`dbcluster.prebuilt`).
        self._prebuilt = PrebuiltStatements(engine.dialect)

    # --- plumbing -------------------------------------------------------------------------------

    def execute(self, conn: Connection, stmt: Any) -> int:
        """Run a writing statement with a bounded lock wait; its row count."""
        rowcount = 0
        for part in self.provider.bounded(stmt):
            rowcount = conn.execute(part).rowcount
        return rowcount

    def prepared(self, key: Any, build: Callable[[], Any]) -> Any:
        """The statement ``build()`` makes, built once per store and ``key`` (with bound
        parameters for what varies; SQLAlchemy then reuses its compiled form)."""
        try:
            return self._prepared[key]
        except KeyError:
            stmt = self._prepared[key] = build()  # None too: "this database has none"
            return stmt

    def run(self, conn: Connection, key: Any, build: Callable[[], Any], params: Any) -> int:
        """Run a prepared writing statement (with its bounded lock wait); its row count."""
        rowcount = 0
        for part in self.prepared(("bounded", key), lambda: self.provider.bounded(build())):
            rowcount = conn.execute(part, params).rowcount
        return rowcount

    def write_one(self, key: Any, build: Callable[[], Any], params: Any, what: str) -> int:
        """One prepared writing statement that is harmless to repeat, committed on its own: one
        round trip on the autocommit engine (a transaction where the database has no
        autocommit, or bounds lock waits with a statement of its own); its row count."""
        bounded = self.prepared(("bounded", key), lambda: self.provider.bounded(build()))
        engine = self.autocommit
        if engine is None or len(bounded) != 1:
            return self.transaction(lambda conn: self.run(conn, key, build, params), what)

        def once() -> int:
            with engine.connect() as conn:
                return int(conn.execute(bounded[0], params).rowcount)

        return self.retry.call(once, what)

    def transaction(
        self,
        work: Callable[[Connection], T],
        what: str,
        verify: Callable[[Connection], T | None] | None = None,
        *,
        engine: Engine | None = None,
    ) -> T:
        """Run ``work`` in one transaction, repeating it on transient errors. After an error the
        first try may have committed: ``verify`` (when given) reads the outcome from the rows
        and its non-None answer is returned instead of repeating ``work``. ``engine``: the
        autocommit engine, for a ``work`` that is one statement (it commits on its own)."""
        run = self.retry.start(what)
        while True:
            try:
                if run.attempt > 1 and verify is not None:
                    with self.engine.connect() as conn:
                        found = verify(conn)
                    if found is not None:
                        return found
                if engine is not None:
                    with engine.connect() as conn:
                        return work(conn)
                with self.engine.begin() as conn:
                    return work(conn)
            except Exception as error:
                if not run.again(error):
                    raise

    def _rows(self, stmt: Any, what: str, params: Any = None) -> Sequence[Any]:
        """A read: one statement on the autocommit engine (no BEGIN/ROLLBACK), repeated on
        transient errors."""
        engine = self.autocommit or self.engine

        def once() -> Sequence[Any]:
            with engine.connect() as conn:
                return conn.execute(stmt, params).all()

        return self.retry.call(once, what)

    def _guarded(
        self,
        stmt: Any,
        what: str,
        verify: Callable[[Connection], bool],
        fence: Fence | None = None,
    ) -> bool:
        """A guarded UPDATE (after ``fence``, if any); True when it changed exactly one row."""

        def work(conn: Connection) -> bool:
            hold(fence, conn)
            return self.execute(conn, stmt) == 1

        return self.transaction(work, what, lambda conn: True if verify(conn) else None)

    def _partition_is(
        self, step_execution_id: int, status: str, node_id: str | None, attempt: int
    ) -> Callable[[Connection], bool]:
        def verify(conn: Connection) -> bool:
            row = conn.execute(
                select(partitions.c.status, partitions.c.assigned_node, partitions.c.attempt).where(
                    partitions.c.step_execution_id == step_execution_id
                )
            ).first()
            return row is not None and tuple(row) == (status, node_id, attempt)

        return verify

    # --- nodes ----------------------------------------------------------------------------------

    def db_now(self) -> datetime:
        return self._rows(self.provider.select_now(), "clock")[0][0]

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
        anything to do: an idle cluster's sweep is one statement."""
        provider = self.provider
        stale = self.prepared(
            ("stale", unreachable_ms, cleanup_ms),
            lambda: provider.select_stale_node(unreachable_ms, cleanup_ms),
        )
        if not self._rows(stale, "sweep check"):
            return 0, 0

        def mark(conn: Connection) -> int:
            return self.execute(conn, provider.mark_unreachable(unreachable_ms))

        def remove(conn: Connection) -> int:
            if not self.execute(conn, provider.mark_removing(cleanup_ms)):
                return 0
            # Waits for a final write of theirs that claimed its next partition (see
            # QueryProvider.lock_removing): the fencing below then moves that one too.
            conn.execute(provider.lock_removing()).all()
            self.execute(conn, provider.fence_partitions_of_removing())
            return self.execute(conn, provider.delete_removing())

        return self.transaction(mark, "mark unreachable"), self.transaction(remove, "remove nodes")

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
            rows = self._rows(stmt, "nodes")
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

    # --- partitions (worker side) ---------------------------------------------------------------

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
        rows = self._rows(stmt, "poll", {"b_node": node_id})
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
        rows = self._rows(
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

    # --- a running partition's fence ------------------------------------------------------------

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
        return self._guarded(
            self.provider.release_partition(step_execution_id, node_id, attempt),
            "release",
            self._partition_is(step_execution_id, PARTITION_PENDING, None, attempt + 1),
        )

    def release_pending(self, node_id: str) -> int:
        def work(conn: Connection) -> int:
            return self.execute(conn, self.provider.release_pending_for_node(node_id))

        return self.transaction(work, "release pending")

    # --- partitions (master side) ---------------------------------------------------------------

    def orphans(self, master_step_execution_id: int) -> list[OrphanedPartition]:
        stmt = self.prepared(
            "orphans", lambda: self.provider.select_orphaned_partitions(bindparam("b_master"))
        )
        rows = self._rows(stmt, "orphans", {"b_master": master_step_execution_id})
        return [
            OrphanedPartition(
                r.step_execution_id,
                r.partition_name,
                r.assigned_node,
                r.attempt,
                r.status,
                bool(r.transferable),
                r.retried_at,
                r.db_now,
            )
            for r in rows
        ]

    def stalled(self, master_step_execution_id: int, timeout_ms: int) -> list[StalledPartition]:
        rows = self._rows(
            self.provider.select_stalled(master_step_execution_id, timeout_ms), "stalled"
        )
        return [
            StalledPartition(
                r.step_execution_id,
                r.partition_name,
                r.assigned_node,
                r.attempt,
                int(r.max_attempts),
                bool(r.transferable),
            )
            for r in rows
        ]

    def time_out(
        self,
        stalled: StalledPartition,
        timeout_ms: int,
        message: str,
        repository: JobRepository,
        fence: Fence,
    ) -> str | None:
        """Fence a stalled partition (one transaction, after the master's fence): PENDING for
        another try when it is transferable and has tries left, else FAILED with its step
        execution. Returns the status written, or None when it moved on meanwhile."""
        provider = self.provider
        retry = stalled.transferable and stalled.attempt < stalled.max_attempts

        def work(conn: Connection) -> str | None:
            hold(fence, conn)
            stmt = provider.time_out_partition(
                stalled.step_execution_id,
                stalled.assigned_node,
                stalled.attempt,
                timeout_ms,
                retry=retry,
            )
            if self.execute(conn, stmt) != 1:
                return None
            if retry:
                return PARTITION_PENDING
            repository.fail_running(message, conn, step_execution_id=stalled.step_execution_id)
            return PARTITION_FAILED

        def verify(conn: Connection) -> str | None:
            row = conn.execute(
                select(partitions.c.status, partitions.c.attempt).where(
                    partitions.c.step_execution_id == stalled.step_execution_id
                )
            ).first()
            if row is not None and row[1] == stalled.attempt + 1:
                return str(row[0])
            return None

        return self.transaction(work, "time out", verify)

    def reassign(self, orphan: OrphanedPartition, to_node: str, fence: Fence) -> bool:
        """Move an orphaned partition to ``to_node`` (after the master's fence), waking that
        node where the database can."""
        stmt = self.provider.reassign_partition(
            orphan.step_execution_id, orphan.assigned_node, orphan.attempt, to_node
        )

        def work(conn: Connection) -> bool:
            hold(fence, conn)
            if self.execute(conn, stmt) != 1:
                return False
            self.wake_nodes(conn, [to_node])
            return True

        verify = self._partition_is(
            orphan.step_execution_id, PARTITION_PENDING, to_node, orphan.attempt
        )
        return self.transaction(work, "reassign", lambda conn: True if verify(conn) else None)

    def wake_nodes(
        self,
        conn: Connection,
        node_ids: Iterable[str],
        placed: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        """In the caller's transaction (which placed work on them): wake these nodes' pollers
        when it commits, where the database has LISTEN/NOTIFY (elsewhere they poll). With
        ``placed`` (node -> step execution ids placed on it), each wake-up names what it
        placed, as many as fit: the node claims those without polling first."""
        provider = self.provider
        if not provider.supports_listen_notify:
            return
        woken = sorted(set(node_ids))
        if not woken:
            return
        if placed is None or not provider.notify_payload_max:
            stmt = self.prepared(
                "notify", lambda: provider.notify(provider.notify_parameter("b_channels"))
            )
            conn.execute(stmt, {"b_channels": [provider.wake_channel(n) for n in woken]})
            return
        conn.execute(self._notify_with_offers(), self._offers(woken, placed))

    def _notify_with_offers(self) -> Any:
        provider = self.provider
        return self.prepared(
            "notify with offers",
            lambda: provider.notify(
                provider.notify_parameter("b_channels"), provider.notify_parameter("b_payloads")
            ),
        )

    def _offers(self, woken: Sequence[str], placed: Mapping[str, Sequence[int]]) -> dict[str, Any]:
        """The parameters of a wake-up of each node of ``woken`` naming what was placed on it."""
        provider = self.provider
        return {
            "b_channels": [provider.wake_channel(node_id) for node_id in woken],
            "b_payloads": [
                offer_payload(placed.get(node_id, ()), provider.notify_payload_max)
                for node_id in woken
            ],
        }

    def fail_orphan(
        self,
        orphan: OrphanedPartition,
        message: str,
        repository: JobRepository,
        fence: Fence,
        *,
        stopped: bool = False,
    ) -> bool:
        """Fail a lost partition and its step execution together (partition row first).
        ``stopped``: its job is being stopped, so its step execution ends STOPPED (a restart
        resumes it from its last commit) rather than FAILED."""
        provider = self.provider

        def work(conn: Connection) -> bool:
            hold(fence, conn)
            stmt = provider.fail_orphaned_partition(
                orphan.step_execution_id, orphan.assigned_node, orphan.attempt
            )
            if self.execute(conn, stmt) != 1:
                return False
            if stopped:
                repository.fail_running(
                    message,
                    conn,
                    step_execution_id=orphan.step_execution_id,
                    exit_code=BatchStatus.STOPPED.value,
                    status=BatchStatus.STOPPED,
                )
            else:
                repository.fail_running(
                    message,
                    conn,
                    step_execution_id=orphan.step_execution_id,
                    exit_code=EXIT_NODE_LOST,
                )
            return True

        verify = self._partition_is(
            orphan.step_execution_id, PARTITION_FAILED, orphan.assigned_node, orphan.attempt
        )
        return self.transaction(work, "fail orphan", lambda conn: True if verify(conn) else None)

    def fail_in_flight(
        self, job_execution_id: int, message: str, repository: JobRepository, fence: Fence
    ) -> int:
        """Fail every in-flight partition of a job execution and their step executions."""

        def work(conn: Connection) -> int:
            hold(fence, conn)
            failed = self._fail_job_partitions(conn, job_execution_id)
            for step_execution_id in failed:
                repository.fail_running(message, conn, step_execution_id=step_execution_id)
            return len(failed)

        return self.transaction(work, "fail in flight")

    # --- stopping a job (see dbcluster.cluster.stopping) ----------------------------------------

    def request_stop(self, job_execution_id: int) -> bool:
        """The durable stop request (one guarded UPDATE); True when this call made the
        execution STOPPING (a repeat after an unclear commit answers False: the caller reads
        the execution to judge)."""
        provider = self.provider
        return self.transaction(
            lambda conn: self.execute(conn, provider.request_stop(job_execution_id, utcnow())) == 1,
            "request stop",
        )

    def stopping(self, job_execution_ids: Iterable[int]) -> set[int]:
        """Which of these job executions are STOPPING (one read per ``partition_write_batch``
        ids; a node watches a handful)."""
        stmt = self.prepared("select_stopping", self.provider.select_stopping)
        found: set[int] = set()
        for batch in in_batches(list(job_execution_ids), self.provider.partition_write_batch):
            found.update(int(r[0]) for r in self._rows(stmt, "stopping", {"ids": batch}))
        return found

    def stop_pending(
        self, master_step_execution_id: int, repository: JobRepository, fence: Fence
    ) -> int:
        """End the partitions of a stopping job that no node has claimed: partition rows, then
        their step executions STOPPED, under the master's fence, at most
        ``partition_write_batch`` of them a transaction (a big job's stop never holds many row
        locks at once). A claim that races it either committed first (the partition runs and
        stops itself) or finds the row gone. Returns how many were stopped."""
        provider = self.provider
        size = provider.partition_write_batch
        pending = provider.select_pending_partition_ids(master_step_execution_id).limit(size)

        def work(conn: Connection) -> tuple[int, int]:
            hold(fence, conn)
            batch = [int(r[0]) for r in conn.execute(pending)]
            if not batch:
                return 0, 0
            changed = self.execute(conn, provider.stop_pending_partitions(batch))
            stopped = batch
            if changed != len(batch):
                # A claim won some of them between the read and this write: only those this
                # transaction ended (FAILED now, their step not started) are ours; a step that
                # ended otherwise is not running, so the write below leaves it alone.
                rows = conn.execute(provider.select_partition_ids_in(batch, PARTITION_FAILED))
                stopped = [int(r[0]) for r in rows]
            if stopped:
                repository.fail_running(
                    "its job was stopped before a node started it",
                    conn,
                    step_execution_ids=stopped,
                    exit_code=BatchStatus.STOPPED.value,
                    status=BatchStatus.STOPPED,
                )
            return len(batch), len(stopped)

        total = 0
        while True:
            seen, stopped = self.transaction(work, "stop pending partitions")
            total += stopped
            if seen < size:
                return total

    def counts(self, master_step_execution_id: int) -> dict[str, int]:
        stmt = self.prepared(
            "counts", lambda: self.provider.select_partition_counts(bindparam("b_master"))
        )
        rows = self._rows(stmt, "counts", {"b_master": master_step_execution_id})
        return {r[0]: int(r[1]) for r in rows}

    def in_flight(self, job_execution_id: int, conn: Connection | None = None) -> int:
        """How many partitions of the execution are PENDING or CLAIMED (in ``conn``'s
        transaction when given)."""
        stmt = self.provider.select_in_flight_count(job_execution_id)
        rows = conn.execute(stmt).all() if conn is not None else self._rows(stmt, "in flight")
        return int(rows[0][0])

    def place_partitions(
        self,
        conn: Connection,
        rows: Sequence[dict[str, Any]],
        placed: Mapping[str, Sequence[int]],
    ) -> None:
        """Insert PENDING partitions and wake the nodes they were placed on (``placed``: node ->
        step execution ids), in the caller's transaction: in one statement where the provider
        can write from arrays and notify in the same statement, else as
        :meth:`insert_partitions` then :meth:`wake_nodes`."""
        provider = self.provider
        arrays = self.prepared(
            "insert partitions from arrays", provider.insert_partitions_from_arrays
        )
        together = None
        if arrays is not None and provider.supports_listen_notify and provider.notify_payload_max:
            together = self.prepared(
                "insert partitions and notify",
                lambda: provider.together(arrays, self._notify_with_offers()),
            )
        if together is None or not placed:
            self.insert_partitions(conn, rows)
            self.wake_nodes(conn, placed.keys(), placed)
            return
        self._prebuilt.rows(
            conn, together, {**_placed_arrays(rows), **self._offers(sorted(placed), placed)}
        )

    def placing_one(self, row: Mapping[str, Any]) -> Riders | None:
        """A lone partition's row and the wake-up of its node, to go in the statement that
        creates its step execution (see :class:`~dbcluster.batch.repository.Riders`): ``row``
        as :meth:`place_partitions` takes one, without its step execution's id. None where the
        database cannot wake a node from that statement (the partition is then placed by
        :meth:`place_partitions`)."""
        provider = self.provider
        if not (
            provider.supports_writable_cte
            and provider.supports_listen_notify
            and provider.notify_payload_max
        ):
            return None

        def build(step_execution_id: Any, _first_step: Any, source: Any) -> tuple[Any, Any]:
            placed = provider.insert_partition_from(source, step_execution_id)
            # The payload names the one partition, as offer_payload would.
            payload = cast(step_execution_id, Text())
            wake = provider.notify_from(source, bindparam("b_channel"), payload)
            assert wake is not None, f"{provider.name} wakes nodes, but not from a statement"
            return [placed], wake

        params: dict[str, Any] = {f"b_{name}": None for name in PLACED_COLUMNS}
        params.update({f"b_{name}": value for name, value in row.items()})
        params["b_channel"] = provider.wake_channel(row["assigned_node"])
        del params["b_step_execution_id"]
        return Riders("place one, notified", build, params)

    def insert_partitions(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Place PENDING partitions in the caller's transaction, at most the provider's
        ``partition_write_batch`` rows a statement (SQL Server escalates a statement's row
        locks to a table lock past about 5,000)."""
        arrays = self.prepared(
            "insert partitions from arrays", self.provider.insert_partitions_from_arrays
        )
        if arrays is not None and len(rows) > 1:
            conn.execute(arrays, _placed_arrays(rows))
            return
        stmt = self.prepared("insert partitions", self.provider.insert_partitions)
        for batch in in_batches(rows, self.provider.partition_write_batch):
            conn.execute(stmt, batch)

    def _fail_job_partitions(self, conn: Connection, job_execution_id: int) -> list[int]:
        """FAILED for every in-flight partition of a job execution, in the caller's transaction,
        at most ``partition_write_batch`` rows a statement. Returns the ids failed."""
        provider = self.provider
        ids = [
            row[0]
            for row in conn.execute(provider.select_in_flight_partition_ids(job_execution_id))
        ]
        failed: list[int] = []
        for batch in in_batches(ids, provider.partition_write_batch):
            if self.execute(conn, provider.fail_job_partitions(job_execution_id, batch)):
                failed.extend(batch)
        return failed

    def partitions(self, master_step_execution_id: int) -> list[Any]:
        stmt = self.prepared(
            "partitions", lambda: self.provider.select_partitions(bindparam("b_master"))
        )
        return list(self._rows(stmt, "list", {"b_master": master_step_execution_id}))

    # --- job coordination -----------------------------------------------------------------------

    def coordination(self, job_execution_id: int) -> Any | None:
        rows = self._rows(
            select(job_coordination).where(job_coordination.c.job_execution_id == job_execution_id),
            "coordination",
        )
        return rows[0] if rows else None

    def stranded_jobs(self) -> list[StrandedJob]:
        return self._stranded(self.provider.select_stranded_masters(), "stranded")

    def unfinished_recoveries(self, node_id: str) -> list[StrandedJob]:
        return self._stranded(self.provider.select_recovering_owned_by(node_id), "recovering")

    def _stranded(self, stmt: Any, what: str) -> list[StrandedJob]:
        return [
            StrandedJob(
                r.job_execution_id,
                r.master_node,
                r.master_epoch,
                r.master_step_execution_id,
                r.status,
            )
            for r in self._rows(stmt, what)
        ]

    def claim_stranded(self, job: StrandedJob, new_owner: str, reason: str) -> StrandedJob | None:
        """Take a stranded job's coordination row (RECOVERING, next epoch) and record the new
        owner in the job's master history (``reason``: takeover or abandon), in one
        transaction; the job as now owned, or None when another survivor won."""
        provider = self.provider
        stmt = provider.claim_stranded_master(
            job.job_execution_id, job.master_node, job.master_epoch, job.status, new_owner
        )
        won = StrandedJob(
            job.job_execution_id,
            new_owner,
            job.master_epoch + 1,
            job.master_step_execution_id,
            COORD_RECOVERING,
        )

        def claim(conn: Connection) -> bool:
            if self.execute(conn, stmt) != 1:
                return False
            conn.execute(
                provider.insert_master(job.job_execution_id, won.master_epoch, new_owner, reason)
            )
            return True

        def verify(conn: Connection) -> bool:
            row = conn.execute(
                select(
                    job_coordination.c.status,
                    job_coordination.c.master_node,
                    job_coordination.c.master_epoch,
                ).where(job_coordination.c.job_execution_id == job.job_execution_id)
            ).first()
            return row is not None and tuple(row) == (COORD_RECOVERING, new_owner, won.master_epoch)

        claimed = self.transaction(
            claim, "claim stranded master", lambda conn: True if verify(conn) else None
        )
        return won if claimed else None

    def start_mastership(self, job: StrandedJob) -> bool:
        """The survivor that claimed a stranded job becomes its master: RECOVERING -> STARTED
        under the claimed epoch."""
        stmt = self.provider.set_coordination_status(
            job.job_execution_id,
            job.master_node,
            job.master_epoch,
            [COORD_RECOVERING],
            COORD_STARTED,
        )

        def verify(conn: Connection) -> bool:
            row = conn.execute(
                select(
                    job_coordination.c.status,
                    job_coordination.c.master_node,
                    job_coordination.c.master_epoch,
                ).where(job_coordination.c.job_execution_id == job.job_execution_id)
            ).first()
            expected = (COORD_STARTED, job.master_node, job.master_epoch)
            return row is not None and tuple(row) == expected

        return self._guarded(stmt, "start mastership", verify)

    def abandon(self, job: StrandedJob, message: str, repository: JobRepository) -> str | None:
        """Finish the recovery of a stranded job this node owns (RECOVERING): in one transaction
        that holds the coordination row, fail its in-flight partitions, its running step
        executions and the execution; close the row ABANDONED (or, when the job had ended,
        with the job's own outcome). Returns the coordination status written, or None when
        the row is no longer this node's to close."""
        provider = self.provider

        def work(conn: Connection) -> str | None:
            if (
                self.execute(
                    conn,
                    provider.hold_mastership(
                        job.job_execution_id, job.master_node, job.master_epoch, [COORD_RECOVERING]
                    ),
                )
                != 1
            ):
                return None
            self._fail_job_partitions(conn, job.job_execution_id)
            repository.fail_running(
                message, conn, job_execution_id=job.job_execution_id, exit_code=EXIT_ABANDONED
            )
            if repository.fail_running_job(
                job.job_execution_id, message, conn, exit_code=EXIT_ABANDONED
            ):
                status = COORD_ABANDONED
            else:
                ended = conn.execute(
                    select(job_execution.c.status).where(
                        job_execution.c.job_execution_id == job.job_execution_id
                    )
                ).scalar_one_or_none()
                status = COORD_COMPLETED if ended == JOB_COMPLETED else COORD_FAILED
            self.execute(
                conn,
                provider.set_coordination_status(
                    job.job_execution_id,
                    job.master_node,
                    job.master_epoch,
                    [COORD_RECOVERING],
                    status,
                ),
            )
            return status

        def verify(conn: Connection) -> str | None:
            row = conn.execute(
                select(job_coordination.c.status, job_coordination.c.master_node).where(
                    job_coordination.c.job_execution_id == job.job_execution_id
                )
            ).first()
            if row is not None and row[1] == job.master_node and row[0] != COORD_RECOVERING:
                return str(row[0])
            return None

        return self.transaction(work, "abandon", verify)
