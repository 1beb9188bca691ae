"""Partitions (``batch_partitions``): their placement, the guarded transitions a worker makes
(each changes the row only while this node holds this attempt, and the worker judges the row
count), the master's monitor (orphans, stalled partitions, counts) and the writes that end a
job's partitions when its master was lost or it is stopped.

The claim itself (poll, lock, claim, start) is :mod:`dbcluster.dialects.claims`. Everything here
is portable Core; a provider overrides one only if its database cannot run it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Insert,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from dbcluster.dialects.family import StatementFamily, insert_from
from dbcluster.schema import job_coordination, partitions
from dbcluster.states import (
    PARTITION_CLAIMED,
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_IN_FLIGHT,
    PARTITION_PENDING,
)

#: The columns a placement gives each partition row it inserts (the others: see
#: :meth:`QueryProvider.insert_partitions`).
PLACED_COLUMNS = (
    "step_execution_id",
    "job_execution_id",
    "master_step_execution_id",
    "partition_name",
    "assigned_node",
    "transferable",
    "max_attempts",
    "trace_context",
)


class PartitionStatements(StatementFamily):
    """The partitions' statements, but for the claim."""

    if TYPE_CHECKING:

        def insert_from_arrays(
            self, table: Table, columns: Sequence[str], values: Mapping[str, Any] | None = None
        ) -> Insert | None: ...

    # --- placement ------------------------------------------------------------------------------

    def _placed_values(self) -> dict[str, Any]:
        return {
            "status": PARTITION_PENDING,
            "attempt": 1,
            "created_time": self.now(),
            "last_updated": self.now(),
        }

    def insert_partitions(self) -> Insert:
        """An executemany-able INSERT of PENDING partition rows; ``created_time`` and
        ``last_updated`` come from the database clock."""
        return insert(partitions).values(**self._placed_values())

    def insert_partition_from(self, source: Any, step_execution_id: Any) -> Insert:
        """One PENDING partition row as :meth:`insert_partitions` writes it, in the statement
        that creates its step execution: ``step_execution_id`` an expression of ``source`` (that
        statement's new row; see :func:`insert_from`), the other :data:`PLACED_COLUMNS` bound as
        ``b_<column>``."""
        values: dict[str, Any] = {
            name: bindparam(f"b_{name}") for name in PLACED_COLUMNS if name != "step_execution_id"
        }
        values.update(step_execution_id=step_execution_id, **self._placed_values())
        return insert_from(partitions, values, source)

    def insert_partitions_from_arrays(self) -> Insert | None:
        """:meth:`insert_partitions` as one statement for many rows, their
        :data:`PLACED_COLUMNS` passed as arrays (:meth:`insert_from_arrays`), or None."""
        values = {
            name: value if isinstance(value, ColumnElement) else literal(value)
            for name, value in self._placed_values().items()
        }
        return self.insert_from_arrays(partitions, PLACED_COLUMNS, values)

    # --- a worker's guarded transitions ---------------------------------------------------------

    def _guarded(
        self,
        step_execution_id: int,
        node_id: str,
        attempt: int,
        statuses: Iterable[str],
        *,
        placed: bool = False,
    ) -> ColumnElement[bool]:
        """(id, node, attempt) in one of ``statuses``; ``placed`` (a guard that may find the
        row still PENDING, see :meth:`_held`): the node's own row registered and held too. A
        removal moves a node's CLAIMED partitions on to the next attempt but leaves its PENDING
        ones at theirs (no claim of a removed node can commit): a partition claimed by a
        placed run's guard must not become CLAIMED on a node removed meanwhile."""
        wanted = list(statuses)
        # One status is an equality: an IN list is an "expanding" parameter, which SQLAlchemy
        # renders anew on every execution (the fence runs in every partition transaction).
        status = or_(*(partitions.c.status == one for one in wanted))
        return and_(
            partitions.c.step_execution_id == step_execution_id,
            partitions.c.assigned_node == node_id,
            partitions.c.attempt == attempt,
            status,
            *((self._node_registered(node_id),) if placed else ()),
        )

    def claim_partition(
        self, step_execution_id: int, node_id: str, attempt: int, *, placed: bool = False
    ) -> Update:
        """PENDING -> CLAIMED for this node and attempt. The worker runs the partition only when
        this changed exactly one row. ``placed``: a partition the node runs already, claimed
        beside its first transaction (the node's row held, see :meth:`_guarded`)."""
        return (
            update(partitions)
            .where(
                self._guarded(
                    step_execution_id, node_id, attempt, [PARTITION_PENDING], placed=placed
                )
            )
            .values(status=PARTITION_CLAIMED, last_updated=self.now())
        )

    def _held(self, placed: bool) -> list[str]:
        """The statuses a worker's guard accepts: CLAIMED; and, for a partition it runs before
        claiming it (``placed``: a wake-up carried its execution), PENDING too, its claim then
        riding in the transaction the guard is in (see docs/CONTRACTS.md, "A partition placed
        with its execution"). The node and the attempt are the guard's either way: a placed
        partition moved, handed back or claimed elsewhere has changed one of them."""
        return [PARTITION_PENDING, PARTITION_CLAIMED] if placed else [PARTITION_CLAIMED]

    def hold_partition(
        self, step_execution_id: int, node_id: str, attempt: int, *, placed: bool = False
    ) -> Update:
        """The fence of a partition's transaction: changes its row (its progress time) only while
        this node holds this attempt CLAIMED. The worker requires exactly one row; the row lock
        then lasts until its ``COMMIT``, so every transition that takes the partition away (which
        all update this row) is serialized with it. ``placed``: a PENDING row placed on this
        node under this attempt is claimed by it (CLAIMED when the transaction commits)."""
        values: dict[str, Any] = {"last_updated": self.now()}
        if placed:
            values["status"] = PARTITION_CLAIMED
        return (
            update(partitions)
            .where(
                self._guarded(
                    step_execution_id, node_id, attempt, self._held(placed), placed=placed
                )
            )
            .values(**values)
        )

    def finish_partition(
        self,
        step_execution_id: int,
        node_id: str,
        attempt: int,
        status: str,
        *,
        placed: bool = False,
    ) -> Update:
        """CLAIMED -> COMPLETED or FAILED, only while this node still holds this attempt
        (``placed``: from PENDING too, see :meth:`hold_partition`)."""
        if status not in (PARTITION_COMPLETED, PARTITION_FAILED):
            raise ValueError(f"a partition finishes COMPLETED or FAILED, not {status}")
        return (
            update(partitions)
            .where(
                self._guarded(
                    step_execution_id, node_id, attempt, self._held(placed), placed=placed
                )
            )
            .values(status=status, last_updated=self.now())
        )

    def finish_partitions(
        self, node_id: Any, members: Sequence[tuple[Any, Any]], status: str
    ) -> Update:
        """:meth:`finish_partition` of several partitions in one statement (a grouped commit):
        each ``(step_execution_id, attempt)`` of ``members`` CLAIMED by this node. The caller
        requires it to change one row per member."""
        if status not in (PARTITION_COMPLETED, PARTITION_FAILED):
            raise ValueError(f"a partition finishes COMPLETED or FAILED, not {status}")
        pt = partitions
        each = or_(*(and_(pt.c.step_execution_id == i, pt.c.attempt == a) for i, a in members))
        return (
            update(pt)
            .where(pt.c.assigned_node == node_id, pt.c.status == PARTITION_CLAIMED, each)
            .values(status=status, last_updated=self.now())
        )

    def retry_partition(
        self, step_execution_id: int, node_id: str, attempt: int, *, placed: bool = False
    ) -> Update:
        """A failed try of a transferable partition, in its final transaction: back to PENDING,
        unassigned, next attempt, stamped with the time (its master places it again after its
        backoff). Guarded like :meth:`finish_partition`."""
        return (
            update(partitions)
            .where(
                self._guarded(
                    step_execution_id, node_id, attempt, self._held(placed), placed=placed
                )
            )
            .values(
                status=PARTITION_PENDING,
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                retried_at=self.now(),
                last_updated=self.now(),
            )
        )

    def release_partition(
        self, step_execution_id: int, node_id: str, attempt: int, *, placed: bool = False
    ) -> Update:
        """Hand back a claimed partition this node has not started (or stopped while leaving):
        unassigned, next attempt, PENDING. The master places it anywhere (one that never ran,
        transferable or not). Guarded like :meth:`finish_partition`."""
        return (
            update(partitions)
            .where(
                self._guarded(
                    step_execution_id, node_id, attempt, self._held(placed), placed=placed
                )
            )
            .values(
                status=PARTITION_PENDING,
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                last_updated=self.now(),
            )
        )

    def release_pending_for_node(self, node_id: str) -> Update:
        """Hand back every partition assigned to a leaving node that it has not claimed."""
        return (
            update(partitions)
            .where(
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .values(
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                last_updated=self.now(),
            )
        )

    def select_pending_for_node(self, node_id: str, limit: int) -> Select[Any]:
        """The poll: this node's PENDING rows with what a claim needs, oldest first."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.job_execution_id,
                partitions.c.master_step_execution_id,
                partitions.c.partition_name,
                partitions.c.attempt,
                partitions.c.max_attempts,
                partitions.c.transferable,
                job_coordination.c.worker_step_name,
            )
            .join(
                job_coordination,
                job_coordination.c.job_execution_id == partitions.c.job_execution_id,
            )
            .where(
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .order_by(partitions.c.step_execution_id)
            .limit(limit)
        )

    # --- the master's monitor -------------------------------------------------------------------

    def select_orphaned_partitions(self, master_step_execution_id: int) -> Select[Any]:
        """In-flight partitions of one master step whose node is gone (or that were handed
        back and so have no node)."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.partition_name,
                partitions.c.assigned_node,
                partitions.c.attempt,
                partitions.c.status,
                partitions.c.transferable,
                partitions.c.retried_at,
                self.now().label("db_now"),
            )
            .where(
                partitions.c.master_step_execution_id == master_step_execution_id,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
                or_(
                    partitions.c.assigned_node.is_(None),
                    self._node_gone(partitions.c.assigned_node),
                ),
            )
            .order_by(partitions.c.step_execution_id)
        )

    def reassign_partition(
        self, step_execution_id: int, from_node: str | None, attempt: int, to_node: str
    ) -> Update:
        """Move an orphaned partition (its node removed, or handed back) to a live node, PENDING.

        The attempt is not changed here: whatever took the partition from its last owner moved
        it already (node removal fences a CLAIMED partition; a hand-back does), and an unclaimed
        partition of a removed node can never be claimed by that node again. The row's
        (node, attempt) pair, which every worker write is guarded by, changes all the same."""
        owner = (
            partitions.c.assigned_node.is_(None)
            if from_node is None
            else partitions.c.assigned_node == from_node
        )
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id == step_execution_id,
                owner,
                partitions.c.attempt == attempt,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .values(status=PARTITION_PENDING, assigned_node=to_node, last_updated=self.now())
        )

    def fail_orphaned_partition(
        self, step_execution_id: int, from_node: str | None, attempt: int
    ) -> Update:
        """A non-transferable partition whose node was lost after claiming it: FAILED."""
        owner = (
            partitions.c.assigned_node.is_(None)
            if from_node is None
            else partitions.c.assigned_node == from_node
        )
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id == step_execution_id,
                owner,
                partitions.c.attempt == attempt,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )

    def select_stalled(self, master_step_execution_id: int, timeout_ms: int) -> Select[Any]:
        """CLAIMED partitions of one master step whose progress (claim, or last committed chunk)
        is older than ``timeout_ms``."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.partition_name,
                partitions.c.assigned_node,
                partitions.c.attempt,
                partitions.c.max_attempts,
                partitions.c.transferable,
            )
            .where(
                partitions.c.master_step_execution_id == master_step_execution_id,
                partitions.c.status == PARTITION_CLAIMED,
                self.older_than(partitions.c.last_updated, timeout_ms),
            )
            .order_by(partitions.c.step_execution_id)
        )

    def time_out_partition(
        self,
        step_execution_id: int,
        node_id: str,
        attempt: int,
        timeout_ms: int,
        *,
        retry: bool,
    ) -> Update:
        """Fence a stalled partition: its attempt moves (its node commits nothing more for it);
        then PENDING and unassigned to be tried again, or FAILED. Guarded on its holder and on
        its progress still being older than the timeout (a chunk that just committed wins)."""
        values: dict[str, Any] = {"attempt": partitions.c.attempt + 1, "last_updated": self.now()}
        if retry:
            values.update(status=PARTITION_PENDING, assigned_node=None, retried_at=self.now())
        else:
            values.update(status=PARTITION_FAILED)
        return (
            update(partitions)
            .where(
                self._guarded(step_execution_id, node_id, attempt, [PARTITION_CLAIMED]),
                self.older_than(partitions.c.last_updated, timeout_ms),
            )
            .values(**values)
        )

    def select_partition_counts(self, master_step_execution_id: int) -> Select[Any]:
        return (
            select(partitions.c.status, func.count().label("n"))
            .where(partitions.c.master_step_execution_id == master_step_execution_id)
            .group_by(partitions.c.status)
        )

    def select_in_flight_count(self, job_execution_id: int) -> Select[Any]:
        """How many partitions of a job execution are PENDING or CLAIMED."""
        return select(func.count()).where(
            partitions.c.job_execution_id == job_execution_id,
            partitions.c.status.in_(PARTITION_IN_FLIGHT),
        )

    def select_partitions(self, master_step_execution_id: int) -> Select[Any]:
        return (
            select(partitions)
            .where(partitions.c.master_step_execution_id == master_step_execution_id)
            .order_by(partitions.c.step_execution_id)
        )

    # --- a job whose master was lost, or that is stopped ----------------------------------------

    def fail_job_partitions(
        self, job_execution_id: int, step_execution_ids: Sequence[int] | None = None
    ) -> Update:
        """Every in-flight partition of a job execution (or those of ``step_execution_ids``):
        FAILED (its master was lost). A worker still running one then finds its fence broken
        and commits nothing more."""
        where = [
            partitions.c.job_execution_id == job_execution_id,
            partitions.c.status.in_(PARTITION_IN_FLIGHT),
        ]
        if step_execution_ids is not None:
            where.append(partitions.c.step_execution_id.in_(list(step_execution_ids)))
        return (
            update(partitions)
            .where(*where)
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )

    def select_in_flight_partition_ids(self, job_execution_id: int) -> Select[Any]:
        """The ids of a job execution's PENDING and CLAIMED partitions."""
        return (
            select(partitions.c.step_execution_id)
            .where(
                partitions.c.job_execution_id == job_execution_id,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .order_by(partitions.c.step_execution_id)
        )

    def select_pending_partition_ids(self, master_step_execution_id: int) -> Select[Any]:
        """The ids of a partitioned step's partitions no node has claimed."""
        return (
            select(partitions.c.step_execution_id)
            .where(
                partitions.c.master_step_execution_id == master_step_execution_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .order_by(partitions.c.step_execution_id)
        )

    def select_partition_ids_in(
        self, step_execution_ids: Sequence[int], status: str
    ) -> Select[Any]:
        """Which of these partitions have ``status``."""
        return select(partitions.c.step_execution_id).where(
            partitions.c.step_execution_id.in_(list(step_execution_ids)),
            partitions.c.status == status,
        )

    def stop_pending_partitions(self, step_execution_ids: Sequence[int]) -> Update:
        """Partitions of a stopping job that were never claimed end (FAILED, their step
        executions STOPPED in the same transaction): a claim racing this finds them gone."""
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id.in_(list(step_execution_ids)),
                partitions.c.status == PARTITION_PENDING,
            )
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )
