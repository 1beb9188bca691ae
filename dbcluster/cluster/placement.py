"""Where a partitioned step's partitions go: the master reads the live workers, runs the
partitioner, and places the partitions in one transaction that holds its mastership, or, for a
first run the cluster creates with its partitions, in the transaction that creates the job
execution (see :meth:`dbcluster.cluster.app.Cluster.create_execution`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from dbcluster import points
from dbcluster.batch.domain import StepExecution
from dbcluster.batch.exceptions import BatchError
from dbcluster.batch.grouped import groupable
from dbcluster.batch.observe import observers
from dbcluster.batch.repository import InsertExtras
from dbcluster.cluster import offers
from dbcluster.cluster.assignment import AssignmentStrategy
from dbcluster.cluster.mastership import Mastership
from dbcluster.cluster.patience import Patience
from dbcluster.cluster.store import NodeInfo

if TYPE_CHECKING:
    from dbcluster.batch.partition import PartitionStep, PartitionWork
    from dbcluster.batch.runtime import BatchRuntime
    from dbcluster.cluster.context import NodeContext

    #: A placement: the partitions, the node of each (by name), the step execution ids on each
    #: node.
    Placed = tuple[list[PartitionWork], dict[str, str], dict[str, list[int]]]


class NoLiveNodeError(BatchError):
    """No live node could take the partitions within the timeout."""


class Placer:
    """Places a master's partitions on the live worker nodes by ``strategy``."""

    def __init__(
        self,
        context: NodeContext,
        strategy: AssignmentStrategy,
        no_node_timeout_ms: int,
        patience: Patience | None = None,
    ) -> None:
        self.store = context.store
        self.settings = context.settings
        self.strategy = strategy
        self.no_node_timeout_ms = no_node_timeout_ms
        self.patience = patience or Patience.of(context)

    def wait_for_workers(self, mastership: Mastership) -> list[NodeInfo]:
        deadline = time.monotonic() + self.no_node_timeout_ms / 1000
        while True:
            workers = self.patience.run(mastership, self.store.worker_nodes, "read the nodes")
            if workers:
                return workers
            if time.monotonic() >= deadline:
                raise NoLiveNodeError(
                    f"no live worker node joined within {self.no_node_timeout_ms} ms"
                )
            time.sleep(self.settings.master_check_interval / 1000)

    def place(
        self,
        step: PartitionStep,
        master: StepExecution,
        runtime: BatchRuntime,
        mastership: Mastership,
        workers: list[NodeInfo],
        planned: Any,
    ) -> Placed:
        """One transaction on the coordination engine (on SQLite it begins IMMEDIATE, and it reads
        before it writes): hold the mastership while pointing the coordination row at this step,
        create the partitions' step executions and insert their PENDING rows. Returns the
        partitions, the node of each (by name) and the step execution ids placed on each node."""
        store = self.store
        context = master.execution_context.copy()
        placed: dict[str, Any] = {}

        def work(conn: Connection) -> Placed:
            master.execution_context.reset_to(context)
            placed["result"] = self.place_in(
                conn, step, master, runtime, mastership, workers, planned
            )
            return placed["result"]  # type: ignore[no-any-return]

        def verify(conn: Connection) -> Placed | None:
            # The first try committed when its partitions exist; its in-memory result stands.
            if "result" in placed and store.partitions(master.id):
                return placed["result"]  # type: ignore[no-any-return]
            return None

        return self.patience.run(
            mastership, lambda: store.transaction(work, "place partitions", verify), "place"
        )

    def place_in(
        self,
        conn: Connection,
        step: PartitionStep,
        master: StepExecution,
        runtime: BatchRuntime,
        mastership: Mastership,
        workers: list[NodeInfo],
        planned: Any,
        *,
        pointed: bool = False,
    ) -> Placed:
        """The placement's statements, in ``conn``'s transaction: the coordination row held and
        pointed at this step (``pointed``: the transaction wrote it so), the partitions' step
        executions, their PENDING rows, the wake-ups (sent at COMMIT)."""
        store = self.store
        if not pointed:
            mastership.place(conn, master.id, step.worker_step.name)
        traced = {"trace_context": tc} if (tc := observers.trace_context(master)) else {}
        chosen: dict[str, str] = {}

        def row(name: str, transferable: bool) -> dict[str, Any]:
            return {
                "job_execution_id": master.job_execution.id,
                "master_step_execution_id": master.id,
                "partition_name": name,
                "assigned_node": chosen[name],
                "transferable": transferable,
                "max_attempts": step.max_attempts if transferable else 1,
                **traced,
            }

        #: The lone partition's placement, where it rides on its step execution's creation.
        lone: list[InsertExtras] = []
        carried = Carried(
            store.provider.notify_payload_max if self.settings.carried_wakeups else 0, master, step
        )

        def place_lone_partition(pending: list[tuple[str, Any, bool]]) -> InsertExtras | None:
            """A lone partition is placed (and its node woken) by the statement that creates
            its step execution, where the database can: one round trip fewer."""
            if len(pending) != 1:
                return None
            name, context, transferable = pending[0]
            chosen.update(self.strategy.assign([name], workers))
            placement = store.lone_partition_placement(
                row(name, transferable), carried.around_id(name, context, transferable)
            )
            lone.extend([placement] if placement is not None else [])
            return placement

        works = step.split(
            master, len(workers), runtime, conn, planned=planned, riders_for=place_lone_partition
        )
        if works and not chosen:
            chosen.update(self.strategy.assign([w.name for w in works], workers))
        placement = {w.name: chosen[w.name] for w in works}
        placed_on: dict[str, list[int]] = {}
        for w in works:
            placed_on.setdefault(placement[w.name], []).append(w.step_execution.id)
        if works and not (lone and lone[0].rows is not None):
            store.place_partitions(
                conn,
                [
                    {"step_execution_id": w.step_execution.id, **row(w.name, w.transferable)}
                    for w in works
                ],
                placed_on,
                carried.payloads(works, placement),
            )
        return works, placement, placed_on

    def place_at_launch(
        self,
        conn: Connection,
        step: PartitionStep,
        master: StepExecution,
        runtime: BatchRuntime,
        mastership: Mastership,
        *,
        found: Sequence[Sequence[Any]] | None = None,
    ) -> None:
        """Place a first run's partitions in the transaction that creates its job execution (see
        :meth:`Cluster.create_execution`), so that one COMMIT makes them visible: read the live
        workers in it, run the partitioner, place. That transaction wrote the coordination row
        (this node the master, epoch 1) already pointing at ``master``.

        The outcome is left on ``master.prepared`` for the handler: the placement, or a
        :class:`Planned` whose partitioner failed (the step fails with that error, as if the
        partitioner had run there). With no live worker nothing is placed (the handler waits
        for one as usual). Raises :class:`PlaceLater` when the placement must not go in this
        transaction: the partitioner took so long that the server may end the idle transaction
        (``idle_transaction_timeout``), this node was fenced meanwhile, or a statement of the
        placement failed (the step must fail with it, not the launch). ``found``: the live
        nodes' rows where the statement that created the execution read them (else they are
        read here)."""
        workers = self.store.worker_nodes(conn, found=found)
        if not workers:
            return
        began = time.monotonic()
        try:
            planned = Planned(step.plan(master, len(workers)))
        except Exception as error:  # noqa: BLE001 - the step fails with it, as it would later
            planned = Planned(None, error)
        budget_ms = self.settings.idle_transaction_ms / 2
        if (time.monotonic() - began) * 1000 >= budget_ms or mastership.fenced:
            raise PlaceLater(planned)
        if planned.error is not None:
            master.prepared = planned
            return
        points.reach("master.before_place", job_execution=master.job_execution)
        try:
            master.prepared = self.place_in(
                conn, step, master, runtime, mastership, workers, planned.slices, pointed=True
            )
        except Exception as error:
            raise PlaceLater(planned) from error
        # Partitions exist under it now: the step must run (a stop requested meanwhile stops
        # them through its handler) rather than end at once as a fresh one would.
        master.fresh = False


class Carried:
    """The wake-ups of a placement that carry their partitions' executions, where the database
    sends payloads of ``limit`` bytes and ``step``'s worker step is transactional (see
    :mod:`dbcluster.cluster.offers`); none where a node's would not fit."""

    def __init__(self, limit: int, master: StepExecution, step: PartitionStep) -> None:
        self.limit = limit
        self.master = master
        self.step = step
        self.wanted = bool(limit) and groupable(step.worker_step)
        self._job: dict[str, Any] | None = None

    def _job_part(self) -> dict[str, Any]:
        if self._job is None:
            self._job = offers.job_part(self.master.job_execution)
        return self._job

    def _part(self, sid: int | None, name: str, context: Any, transferable: bool) -> list[Any]:
        step = self.step
        return offers.partition_part(
            sid,
            master_step_execution_id=self.master.id,
            partition_name=name,
            transferable=transferable,
            max_attempts=step.max_attempts if transferable else 1,
            worker_step_name=step.worker_step.name,
            step_name=step.execution_name(name),
            context=context,
        )

    def around_id(self, name: str, context: Any, transferable: bool) -> tuple[str, str] | None:
        """A lone partition's payload, before and after its id (None: ids only)."""
        if not self.wanted:
            return None
        head, tail = offers.split_around_id(
            self._job_part(), self._part(None, name, context, transferable)
        )
        # The id: at most 20 digits.
        return (head, tail) if offers.fits(head + tail, self.limit - 20) else None

    def payloads(self, works: list[PartitionWork], placement: dict[str, str]) -> dict[str, str]:
        """Each node's payload that carries the executions of what was placed on it."""
        if not self.wanted:
            return {}
        by_node: dict[str, list[list[Any]]] = {}
        for w in works:
            by_node.setdefault(placement[w.name], []).append(
                self._part(
                    w.step_execution.id, w.name, w.step_execution.execution_context, w.transferable
                )
            )
        found = {}
        for node, parts in by_node.items():
            text = offers.offer_text(self._job_part(), parts)
            if offers.fits(text, self.limit):
                found[node] = text
        return found


@dataclass(frozen=True)
class Planned:
    """What the partitioner gave for a first run (its slices, or its error), kept for the step's
    placement after the launch's transaction (see :class:`PlaceLater`)."""

    slices: Any
    error: BaseException | None = None


class PlaceLater(Exception):  # noqa: N818 - a signal to the launch, not a failure of it
    """Raised out of a launch's creating transaction to roll it back: create the execution again
    without its partitions, and place them afterwards with ``planned`` (the partitioner does not
    run again)."""

    def __init__(self, planned: Planned) -> None:
        super().__init__("the partitions are placed after the launch's transaction")
        self.planned = planned
