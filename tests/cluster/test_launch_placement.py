"""A first run places its partitions in the transaction that creates it, where the provider allows
it (``places_at_launch``: PostgreSQL): one COMMIT makes the execution, its owner and its PENDING
partitions visible together. Elsewhere, or when something could tell the difference (listeners, a
tracing observer), the launch keeps two transactions. Either way the job runs the same."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import func, select

from dbcluster.batch import Job, PartitionStep, TaskletStep
from dbcluster.batch.listeners import JobListener
from dbcluster.batch.observe import BatchObserver, observers
from dbcluster.batch.partition import FunctionPartitioner
from dbcluster.batch.status import BatchStatus
from dbcluster.dialects import get_provider
from dbcluster.dialects.base import PARTITION_IN_FLIGHT
from dbcluster.schema import job_coordination, partitions
from dbcluster.testing import points
from dbcluster.testing.app import FAST_SETTINGS, build_registry, ledger, ledger_tasklet
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import freeze, record_events
from dbcluster.testing.waiting import in_thread, wait_for


def _placed(backend: Backend, job_execution_id: int) -> int:
    with backend.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(partitions)
                .where(partitions.c.job_execution_id == job_execution_id)
            ).scalar_one()
        )


def _in_flight(backend: Backend, job_execution_id: int) -> int:
    with backend.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(partitions)
                .where(
                    partitions.c.job_execution_id == job_execution_id,
                    partitions.c.status.in_(PARTITION_IN_FLIGHT),
                )
            ).scalar_one()
        )


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

    registry = build_registry()
    registry.register(
        Job(
            "broken",
            [
                PartitionStep(
                    "broken.master",
                    TaskletStep("broken.worker", ledger_tasklet),
                    FunctionPartitioner(broken),
                )
            ],
        )
    )
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
