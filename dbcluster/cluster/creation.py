"""Creating a job execution with this node as its master (``Cluster.create_execution``).

The execution and its coordination row (this node its master, epoch 1) are created in one
transaction, the launcher's, so no execution ever exists without an owner that survivors can
see. A first run whose job starts with a partitioned step may place that step's partitions in
the same transaction (one COMMIT before a partition can start: :func:`placed_at_launch`); where
the database can, the ownership rows and the live nodes' read even ride on the statement that
creates the execution (:class:`~dbcluster.batch.repository.InsertExtras`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam

from dbcluster.batch.domain import JobExecution
from dbcluster.batch.exceptions import JobRestartError
from dbcluster.batch.observe import observers
from dbcluster.batch.partition import PartitionStep
from dbcluster.batch.repository import InsertExtras
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.mastership import Mastership
from dbcluster.cluster.placement import PlaceLater, Placer
from dbcluster.cluster.store import CoordinationStore
from dbcluster.states import COORD_STARTED, MASTER_LAUNCHED

if TYPE_CHECKING:
    from dbcluster.batch.context import ExecutionContext
    from dbcluster.batch.job import Job
    from dbcluster.batch.launcher import JobLauncher
    from dbcluster.batch.parameters import JobParameters
    from dbcluster.batch.partition import PartitionHandler


def placed_at_launch(
    job: Job, store: CoordinationStore, handler: PartitionHandler, launcher: JobLauncher
) -> PartitionStep | None:
    """The partitioned step whose partitions a first run of ``job`` places in the transaction
    that creates it (one COMMIT before a partition can start), or None.

    Only where nothing can tell the difference: the job starts with a partitioned step that the
    cluster's ``handler`` runs, neither has listeners (they would see the partitioner run before
    ``before_job``) and no batch observer traces (the partitions would be placed before the
    job's trace began), on a database whose provider allows the partitioner to run inside that
    transaction (:attr:`~dbcluster.dialects.base.QueryProvider.places_at_launch`)."""
    if not store.provider.places_at_launch or observers.tracing or job.listeners:
        return None
    first = job.first_step()
    if (
        isinstance(first, PartitionStep)
        and not first.listeners
        and first.partition_handler in (None, handler)
        and launcher.runtime.partition_handler is handler
    ):
        return first
    return None


class ExecutionCreation:
    """One creation (see the module doc and ``Cluster.create_execution`` for the arguments).

    :meth:`create` runs the launcher's transaction (twice when the placement must come after
    it); inside it the launcher calls :meth:`check` on the instance's executions and, last,
    :meth:`own` on the new execution.
    """

    def __init__(
        self,
        store: CoordinationStore,
        identity: Identity,
        launcher: JobLauncher,
        placer: Placer,
        job: Job,
        params: JobParameters,
        *,
        placing: PartitionStep | None,
        context: ExecutionContext | None = None,
        after: int | None = None,
        on_created: Callable[[Connection, JobExecution], None] | None = None,
        existing: bool = False,
    ) -> None:
        self.store = store
        self.identity = identity
        self.launcher = launcher
        self.placer = placer
        self.job = job
        self.params = params
        #: The partitioned step placed in the creating transaction (None: none is).
        self.placing = placing
        self.context = context
        self.after = after
        self.on_created = on_created
        #: A restart reads its instance first: nothing rides on a statement it does not make.
        self.restart = existing or after is not None
        #: Set when the placement must come after the creating transaction.
        self.later: PlaceLater | None = None
        #: What rides on the creating statement this time (None: nothing).
        self.riders: InsertExtras | None = None

    def create(self) -> JobExecution:
        try:
            return self._create_once()
        except PlaceLater as deferred:
            # Nothing of that transaction was committed: create the execution again, and the
            # step places the partitions after it (the partitioner does not run again).
            self.later = deferred
            return self._create_once()

    def _create_once(self) -> JobExecution:
        self.riders = None if self.restart else self._riding_ownership()
        return self.launcher.create_execution(
            self.job,
            self.params,
            on_created=self.own,
            context=self.context,
            check=self.check,
            existing=self.restart,
            riders=self.riders,
        )

    # --- inside the creating transaction ------------------------------------------------------

    def check(self, conn: Connection, executions: list[JobExecution]) -> None:
        """The cluster's checks of the instance's executions (newest first), besides the
        launcher's: a restart ``after`` an execution still finds it the newest, and the last
        execution has no partition in flight (it could run in both executions at once)."""
        after, job = self.after, self.job
        if after is not None and (not executions or executions[0].id != after):
            raise JobRestartError(f"execution {after} of job {job.name!r} was restarted already")
        if executions and not executions[0].status.is_running:
            last = executions[0]
            in_flight = self.store.in_flight(last.id, conn)
            if in_flight:
                raise JobRestartError(
                    f"job {job.name!r} execution {last.id} ended {last.status.value} but "
                    f"{in_flight} of its partition(s) are still in flight; restart it once "
                    f"they finish or their nodes are removed from the cluster"
                )

    def own(self, conn: Connection, execution: JobExecution) -> None:
        """The new execution is this node's, epoch 1 (its ownership rows, unless they rode on
        the creating statement), then ``on_created``, then its placement where it goes here."""
        placing = self.placing
        master = execution.prepared_steps.get(placing.name) if placing else None
        # The ownership went with the creating statement (and the nodes' read, when placing
        # here), where the repository could put it there; else it is written here (and the
        # placement reads the nodes itself).
        found = self.riders.rows if self.riders is not None else None
        if found is None:
            self._write_ownership(conn, execution, master)
        if self.on_created is not None:
            self.on_created(conn, execution)
        execution.fence = Mastership(self.store, execution.id, self.identity)
        if placing is None or master is None:
            return
        if self.later is not None:
            master.prepared = self.later.planned
            return
        self.placer.place_at_launch(
            conn, placing, master, self.launcher.runtime, execution.fence, found=found
        )

    def _write_ownership(self, conn: Connection, execution: JobExecution, master: Any) -> None:
        row: dict[str, Any] = {"b_id": execution.id, "b_node": self.identity.node_id}
        if self.placing is not None and master is not None:
            row.update(b_master=master.id, b_worker_step=self.placing.worker_step.name)
        pointing = "b_master" in row
        statements = self.store.prepared(
            ("own execution", pointing), partial(self._ownership_statements, pointing)
        )
        for statement in statements:
            conn.execute(statement, row)

    # --- the ownership's statements (built once per store and key) ----------------------------

    def _ownership_statements(self, pointing: bool) -> list[Any]:
        """This node the execution's master, epoch 1: its coordination row (when ``pointing``,
        already pointing at the partitioned step, as the placement in this transaction or a
        later one leaves it) and its master history row; one statement where the provider can
        put two writes together."""
        coordination, launched = self._ownership_writes(pointing)
        one = self.store.provider.together(coordination, launched)
        return [coordination, launched] if one is None else [one]

    def _ownership_writes(
        self,
        pointing: bool,
        execution_id: Any = None,
        master_id: Any = None,
        source: Any | None = None,
    ) -> tuple[Any, Any]:
        """The coordination row and the master history row, of bound parameters (``b_id``,
        ``b_master``) or, riding on the creating statement, of its new rows' ids and taking
        their values from ``source`` (see :class:`~dbcluster.batch.repository.InsertExtras`)."""
        provider = self.store.provider
        execution_id = bindparam("b_id") if execution_id is None else execution_id
        master_id = bindparam("b_master") if master_id is None else master_id
        node = bindparam("b_node")
        at_step = (COORD_STARTED, master_id, bindparam("b_worker_step"))
        coordination = provider.insert_coordination(
            execution_id, node, *(at_step if pointing else ()), source=source
        )
        launched = provider.insert_master(execution_id, 1, node, MASTER_LAUNCHED, source=source)
        return coordination, launched

    def _riding_ownership(self) -> InsertExtras:
        """The ownership rows (pointing at the partitioned step that a first run starts with,
        when it places its partitions) and, when it places them in this transaction, the live
        nodes' read, in the statement that creates the execution where the database can: the
        launch's first round trip makes and reads all of it."""
        pointing = self.placing is not None
        reading = pointing and self.later is None
        params = {"b_node": self.identity.node_id}
        if self.placing is not None:
            params["b_worker_step"] = self.placing.worker_step.name
        build = partial(self._ride, pointing, reading)
        return InsertExtras(("own execution", pointing, reading), build, params)

    def _ride(
        self, pointing: bool, reading: bool, execution_id: Any, first_step_id: Any, source: Any
    ) -> tuple[Any, Any]:
        owned = self._ownership_writes(pointing, execution_id, first_step_id, source)
        return list(owned), self.store.select_nodes() if reading else None
