"""A first run places its partitions in the transaction that creates it, where the provider allows
it (``places_at_launch``: PostgreSQL): one COMMIT makes the execution, its owner and its PENDING
partitions visible together. Elsewhere, or when something could tell the difference (listeners, a
tracing observer), the launch keeps two transactions. Either way the job runs the same."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from dbcluster.batch import Job, PartitionStep, TaskletStep
from dbcluster.batch.listeners import JobListener
from dbcluster.batch.observe import BatchObserver, observers
from dbcluster.batch.partition import FunctionPartitioner
from dbcluster.batch.status import BatchStatus
from dbcluster.dialects import get_provider
from dbcluster.dialects.base import PARTITION_IN_FLIGHT
from dbcluster.schema import job_coordination, job_execution, partitions
from dbcluster.testing import points
from dbcluster.testing.app import FAST_SETTINGS, build_registry, ledger, ledger_tasklet
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import freeze, lose_commit_acks, record_events
from dbcluster.testing.waiting import in_thread, wait_for


def _placed(backend: Backend, job_execution_id: int, statuses: tuple[str, ...] = ()) -> int:
    """The job execution's partition rows (in ``statuses``, if given)."""
    stmt = select(func.count()).select_from(partitions)
    stmt = stmt.where(partitions.c.job_execution_id == job_execution_id)
    if statuses:
        stmt = stmt.where(partitions.c.status.in_(statuses))
    with backend.engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def _in_flight(backend: Backend, job_execution_id: int) -> int:
    return _placed(backend, job_execution_id, PARTITION_IN_FLIGHT)


def _placed_when_created(backend: Backend, master: Any, job: str, run: int) -> tuple[int, Any]:
    """Launch ``job`` and count its partitions at the moment its creation has committed."""
    with points.parked("master.after_create_execution") as park:
        launch = in_thread(lambda: master.launch(job, {"run": run}))
        created = park.wait()[0]["job_execution"]
        placed = _placed(backend, created.id)
    launch["thread"].join(30)
    return placed, launch["result"]


def test_a_first_run_is_created_with_its_partitions(backend: Backend, make_cluster: Any) -> None:
    master = make_cluster(work=False)
    make_cluster()  # one worker: 4 partitions
    placed, execution = _placed_when_created(backend, master, "ledger", 1)
    assert execution.status is BatchStatus.COMPLETED
    expected = 4 if get_provider(backend.engine).places_at_launch else 0
    assert placed == expected
    with backend.engine.connect() as conn:
        row = conn.execute(
            select(job_coordination).where(job_coordination.c.job_execution_id == execution.id)
        ).one()
    assert row.worker_step_name == "ledger.worker" and row.master_epoch == 1


def test_a_placed_first_run_owns_and_reads_the_nodes_in_the_statement_that_creates_it(
    backend: Backend, make_cluster: Any
) -> None:
    """Where the database has data-modifying CTEs (PostgreSQL), the launch's coordination row,
    its master history row and the placement's read of the live nodes go in the statement that
    creates the instance, the execution and its first step: a placed first run makes no read
    of its own, and three statements before its COMMIT."""
    from dbcluster.schema import job_masters

    master = make_cluster(work=False)
    make_cluster()
    created, sent = _created_recording(master, "ledger", {"run": 9})
    owning = [s for s in sent if "INSERT INTO batch_job_coordination" in s]
    assert len(owning) == 1, sent
    if backend.name == "postgresql":
        assert "FROM batch_nodes" in owning[0] and "batch_job_masters" in owning[0], owning
        assert "INSERT INTO batch_job_instance" in owning[0], owning
        assert not [s for s in sent if s.lstrip().startswith("SELECT")], sent
        # The instance with its execution, first step, ownership and the nodes' read; the four
        # partitions' step executions and their contexts; the partition rows.
        assert len(sent) == 4, sent
    with backend.engine.connect() as conn:
        reasons = (
            conn.execute(
                select(job_masters.c.reason).where(job_masters.c.job_execution_id == created.id)
            )
            .scalars()
            .all()
        )
        coordination = conn.execute(
            select(job_coordination).where(job_coordination.c.job_execution_id == created.id)
        ).one()
    assert reasons[0] == "launched" and coordination.master_epoch == 1
    assert coordination.worker_step_name == "ledger.worker"


def test_a_lone_partition_is_placed_by_the_statement_that_creates_its_step_execution(
    backend: Backend, make_cluster: Any
) -> None:
    """Where the database can (PostgreSQL), a first run of one partition is two statements
    before its COMMIT: the creation with its ownership and the nodes' read; the partition's
    step execution with its context, the master's context, the partition's row and its node's
    wake-up. The row is the one a placement of many writes, and the woken worker runs it."""
    registry = _with_partitioned_job("lone", lambda grid: {"only": {"lo": 0, "hi": 1}})
    master = make_cluster(work=False, registry=registry)
    worker = make_cluster(registry=registry)
    created, sent = _created_recording(master, "lone", {"run": 1})
    with backend.engine.connect() as conn:
        row = conn.execute(
            select(partitions).where(partitions.c.job_execution_id == created.id)
        ).one()
    assert row.partition_name == "only" and row.status == "COMPLETED" and row.attempt == 1
    assert row.assigned_node == worker.node.identity.node_id
    step = registry.get_job("lone").first_step()
    assert row.transferable and row.max_attempts == step.max_attempts
    assert row.trace_context is None
    if backend.name == "postgresql":
        assert len(sent) == 2, sent
        assert "INSERT INTO batch_partitions" in sent[1] and "pg_notify" in sent[1], sent


def _created_recording(master: Any, job: str, params: dict[str, Any]) -> tuple[Any, list[str]]:
    """Launch ``job`` (it must complete): its execution, and the statements the master sent
    until its creation committed."""
    from sqlalchemy import event

    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    engine = master.repository.engine
    with points.parked("master.after_create_execution") as park:
        event.listen(engine, "before_cursor_execute", record)
        try:
            launch = in_thread(lambda: master.launch(job, params))
            created = park.wait()[0]["job_execution"]
        finally:
            event.remove(engine, "before_cursor_execute", record)
    launch["thread"].join(30)
    assert launch["result"].status is BatchStatus.COMPLETED
    return created, sent


def _with_partitioned_job(name: str, partition: Any) -> Any:
    """The test registry with job ``name``: one partitioned step whose partitions come from
    ``partition(grid_size)``."""
    registry = build_registry()
    worker = TaskletStep(f"{name}.worker", ledger_tasklet)
    step = PartitionStep(f"{name}.master", worker, FunctionPartitioner(partition))
    registry.register(Job(name, [step]))
    return registry


def _owner(backend: Backend, job_execution_id: int) -> tuple[Any, list[str]]:
    """The execution's coordination row and the reasons of its master history."""
    from dbcluster.schema import job_masters

    owned = job_coordination.c.job_execution_id == job_execution_id
    history = select(job_masters.c.reason).where(job_masters.c.job_execution_id == job_execution_id)
    with backend.engine.connect() as conn:
        coordination = conn.execute(select(job_coordination).where(owned)).one()
        reasons = list(conn.execute(history).scalars().all())
    return coordination, reasons


def test_a_launch_whose_instance_exists_owns_its_execution_by_statements_of_its_own(
    backend: Backend, make_cluster: Any
) -> None:
    """The creating statement writes nothing where the instance exists (its last run failed):
    nothing rode on it, so the launch writes its ownership itself, and the step places its
    partitions once the job runs. A job that starts with a step the master runs owns its
    execution too (in its creating statement where the database can)."""
    calls: list[int] = []

    def fails_once(grid_size: int) -> dict[str, Any]:
        calls.append(grid_size)
        if len(calls) == 1:
            raise ValueError("no input file yet")
        return {f"p{i}": {"lo": i, "hi": i + 1} for i in range(3)}

    registry = _with_partitioned_job("again", fails_once)
    master = make_cluster(work=False, registry=registry)
    make_cluster(registry=registry)
    failed = master.launch("again", {"run": 1})
    assert failed.status is BatchStatus.FAILED
    placed, second = _placed_when_created(backend, master, "again", 1)
    assert second.status is BatchStatus.COMPLETED and second.id != failed.id
    assert second.job_instance.id == failed.job_instance.id
    # An instance that ran before places after its job starts (a restart may skip steps).
    assert placed == 0
    for execution in (failed, second):
        coordination, reasons = _owner(backend, execution.id)
        assert coordination.master_epoch == 1 and reasons == ["launched"]
    assert _owner(backend, second.id)[0].worker_step_name == "again.worker"
    chunks = master.launch("ledger-chunks", {"run": 1})
    assert chunks.status is BatchStatus.COMPLETED
    coordination, reasons = _owner(backend, chunks.id)
    assert coordination.master_epoch == 1 and reasons == ["launched"]


class _Tracer(BatchObserver):
    def trace_context(self, step_execution: Any) -> str | None:
        return None


def test_listeners_or_a_tracer_keep_the_placement_after_the_job_starts(
    backend: Backend, make_cluster: Any
) -> None:
    seen: list[int] = []

    class Before(JobListener):
        def before_job(self, job_execution: Any) -> None:
            seen.append(_placed(backend, job_execution.id))

    registry = build_registry()
    registry.register(
        Job(
            "listened",
            [
                PartitionStep(
                    "listened.master",
                    TaskletStep("listened.worker", ledger_tasklet),
                    FunctionPartitioner(
                        lambda grid: {f"p{i}": {"lo": i, "hi": i + 1} for i in range(3)}
                    ),
                )
            ],
            listeners=[Before()],
        )
    )
    master = make_cluster(work=False, registry=registry)
    make_cluster(registry=registry)
    placed, execution = _placed_when_created(backend, master, "listened", 1)
    assert execution.status is BatchStatus.COMPLETED
    assert placed == 0 and seen == [0], "before_job ran before the partitioner"
    tracer = _Tracer()
    observers.subscribe(tracer)
    try:
        placed, execution = _placed_when_created(backend, master, "ledger", 2)
    finally:
        observers.unsubscribe(tracer)
    assert execution.status is BatchStatus.COMPLETED
    assert placed == 0


def test_a_partitioner_that_fails_fails_the_job_once(backend: Backend, make_cluster: Any) -> None:
    calls: list[int] = []

    def broken(grid_size: int) -> dict[str, Any]:
        calls.append(grid_size)
        raise ValueError("no input file")

    registry = _with_partitioned_job("broken", broken)
    master = make_cluster(work=False, registry=registry)
    make_cluster(registry=registry)
    execution = master.launch("broken", {"run": 1})
    assert execution.status is BatchStatus.FAILED
    assert "no input file" in execution.exit_status.description
    assert calls == [1]
    assert _placed(backend, execution.id) == 0


def test_a_stop_before_the_first_step_stops_what_the_creation_placed(
    backend: Backend, make_cluster: Any
) -> None:
    """The partitions exist from the creation on: a stop that the master learns of before its
    first step begins must still stop them, leaving nothing in flight."""
    master = make_cluster(work=False)
    worker = make_cluster()
    worker_id = worker.node.node_id
    # The worker polls but does not claim until released: the stop comes first.
    with points.parked(
        "node.between_poll_and_claim", lambda node_id, **_: node_id == worker_id, limit=None
    ) as held:
        with points.parked("master.after_create_execution") as park:
            launch = in_thread(lambda: master.launch("ledger", {"run": 1}))
            created = park.wait()[0]["job_execution"]
            master.stop_execution(created.id)
            created.stop_requested = True  # the master learned of it before the step began
        launch["thread"].join(30)
        execution = launch["result"]
        assert execution.status is BatchStatus.STOPPED
        assert _in_flight(backend, execution.id) == 0
        held.release()
    wait_for(lambda: worker.node.worker.executor.load == 0, 10, "the worker to be idle")
    assert _in_flight(backend, execution.id) == 0


def test_a_master_that_dies_right_after_creating_a_placed_run_is_taken_over(
    backend: Backend, make_cluster: Any
) -> None:
    """Its partitions (placed with the creation where the provider allows it, else placed by the
    survivor) each run once, and the job completes under its new master."""
    settings = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)
    master = make_cluster(settings, work=False)
    survivor = make_cluster(settings)
    recorder = record_events(survivor.node)
    with points.parked("master.after_create_execution") as park:
        launch = in_thread(lambda: master.launch("ledger", {"run": 1}))
        created = park.wait()[0]["job_execution"]
        with freeze(master.node):
            park.release()
            wait_for(lambda: recorder.named("took_over"), 30, "the survivor to take the job over")
            wait_for(
                lambda: not survivor.repository.get_job_execution(created.id).is_running,
                30,
                "the job to end under its new master",
            )
    execution = survivor.repository.get_job_execution(created.id)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        parts = conn.execute(
            select(partitions).where(partitions.c.job_execution_id == created.id)
        ).all()
        effects = Counter(
            r.partition_name
            for r in conn.execute(select(ledger).where(ledger.c.job_execution_id == created.id))
        )
    assert len(parts) == 4 and {p.status for p in parts} == {"COMPLETED"}
    assert len(effects) == 4 and set(effects.values()) == {1}
    launch["thread"].join(30)
    assert launch["result"].status is BatchStatus.COMPLETED


def _one_step_job(name: str, fn: Any, transferable: Any = True, listeners: Any = ()) -> Job:
    return Job(
        name,
        [
            PartitionStep(
                f"{name}.master",
                TaskletStep(f"{name}.worker", ledger_tasklet),
                FunctionPartitioner(fn, transferable),
            )
        ],
        listeners=listeners,
    )


def test_a_partitioner_slower_than_an_idle_transaction_may_be_still_launches_once(
    backend: Backend, make_cluster: Any
) -> None:
    """The server ends a session idle in its transaction past ``idle_transaction_timeout``: a
    partitioner that takes longer cannot run inside the creating transaction. Its result is kept
    and placed after it."""
    calls: list[int] = []
    pause_s = FAST_SETTINGS.idle_transaction_ms * 1.5 / 1000

    def slow(grid_size: int) -> dict[str, Any]:
        calls.append(grid_size)
        time.sleep(pause_s)
        return {f"p{i}": {"lo": i * 10, "hi": i * 10 + 10} for i in range(3)}

    registry = build_registry()
    registry.register(_one_step_job("slow", slow))
    master = make_cluster(work=False, registry=registry)
    make_cluster(registry=registry)
    execution = master.launch("slow", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert calls == [1], "the partitioner ran once"
    assert _placed(backend, execution.id) == 3


class _Twice(dict):  # type: ignore[type-arg]
    """A partitioner's result that names one partition twice."""

    def items(self) -> Any:
        return [("a", {}), ("a", {})]


def _refused(name: str) -> Job:
    long_name = {"x" * 400: {"lo": 0, "hi": 1}}
    if name == "twice":
        return _one_step_job(name, lambda grid: _Twice({"z": {}}))
    if name == "undecided":

        def transferable(partition: str, context: Any) -> bool:
            raise RuntimeError("cannot decide")

        return _one_step_job(name, lambda grid: {"p0": {"lo": 0, "hi": 1}}, transferable)
    if name == "too-long":
        return _one_step_job(name, lambda grid: long_name)
    # The same refusal on the path that places after the job started (a listener): the master
    # used to wait it out as if the database were away, and the job hung.
    return _one_step_job(name, lambda grid: long_name, listeners=[JobListener()])


@pytest.mark.parametrize("job", ["twice", "undecided", "too-long", "too-long-listened"])
def test_a_placement_the_database_or_the_step_refuses_fails_the_job_not_the_launch(
    backend: Backend, make_cluster: Any, job: str
) -> None:
    if job.startswith("too-long") and backend.name == "sqlite":
        pytest.skip("SQLite stores a text longer than its column's length")
    registry = build_registry()
    registry.register(_refused(job))
    master = make_cluster(work=False, registry=registry)
    make_cluster(registry=registry)
    execution = master.launch(job, {"run": 1})
    assert execution.status is BatchStatus.FAILED
    assert _placed(backend, execution.id) == 0
    with backend.engine.connect() as conn:
        row = conn.execute(
            select(job_coordination).where(job_coordination.c.job_execution_id == execution.id)
        ).one()
    assert row.status == "FAILED", "its master closed the job"


@pytest.mark.backends("postgresql")
def test_a_creating_transaction_repeated_after_a_lost_connection_runs_the_job_once(
    backend: Backend, make_cluster: Any
) -> None:
    """The connection drops after the partitioner, inside the creating transaction: the whole
    transaction is made again (a new execution), and nothing of the first one remains."""
    registry = build_registry()
    registry.register(
        _one_step_job("dropped", lambda grid: {f"p{i}": {"lo": i, "hi": i + 1} for i in range(3)})
    )
    master = make_cluster(work=False, registry=registry)
    make_cluster(registry=registry)
    dropped: list[int] = []

    def drop(**_: Any) -> None:
        if not dropped:
            dropped.append(1)
            raise OperationalError("place", {}, Exception("dropped"), connection_invalidated=True)

    points.install("master.before_place", drop)
    try:
        execution = master.launch("dropped", {"run": 1})
    finally:
        points.remove("master.before_place", drop)
    assert dropped and execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        placed = conn.execute(select(partitions.c.job_execution_id)).all()
    assert [r.job_execution_id for r in placed] == [execution.id] * 3


def test_a_launch_whose_commit_acknowledgement_is_lost_runs_its_job(
    backend: Backend, make_cluster: Any
) -> None:
    """The creating transaction committed but its acknowledgement was lost: the launch learns
    from the database that its execution exists and runs it (it used to raise, leaving a job
    that its live master never ran, hanging; its placed partitions ran masterless)."""
    master = make_cluster(work=False)
    make_cluster()
    lost = lose_commit_acks(
        master.node.work_engine,
        times=1,
        when=lambda statements: any("INSERT INTO batch_job_coordination" in s for s in statements),
    )
    execution = master.launch("ledger", {"run": 1})
    assert lost.count == 1, "the fault was not injected"
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        executions = conn.execute(select(func.count()).select_from(job_execution)).scalar_one()
    assert executions == 1
    assert _placed(backend, execution.id) == 4
