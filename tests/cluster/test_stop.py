"""Stopping a job cluster-wide (dbcluster.cluster.stopping): partitions on three nodes stop at
their next chunk, the job ends STOPPED with nothing in flight, and a restart writes every item
exactly once; a stop racing a node's death or its master's takeover ends the same way."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import func, select

from dbcluster.batch import ChunkStep, Job, PartitionStep
from dbcluster.batch.exceptions import NoSuchJobExecutionError
from dbcluster.batch.items import IterableItemReader, item_writer
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.executor import current_node_id
from dbcluster.cluster.stopping import NothingToStopError
from dbcluster.schema import job_execution, partitions, step_execution
from dbcluster.testing import points
from dbcluster.testing.app import (
    FAST_SETTINGS,
    RangePartitioner,
    _write_items,
    build_registry,
    items_written,
)
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import freeze, record_events
from dbcluster.testing.waiting import in_thread, wait_for

JOB = "stop-items"
#: Two partitions a worker (three workers): six partitions of 50 items, 5 items a chunk.
ITEMS, CHUNK, ITEM_MS = 300, 5, 20
#: A node silent for 2 s is unreachable, for 4 s removed (a loaded CI machine's heartbeats can
#: take a second); the stop itself is checked every 50 ms (master_check_interval).
#: The cluster tests run once per server (the MySQL provider runs the rest of the suite against
#: the same MariaDB server; these exercise nothing provider-specific).
THREE_SERVERS = pytest.mark.backends("sqlite", "postgresql", "mariadb")
SETTINGS = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)


class _Reader(IterableItemReader):
    """Reads the partition's slice; each read passes the test app's checkpoint (outside any
    transaction), where the partitions of a frozen node park as a stopped process's would."""

    def read(self) -> Any:
        points.reach("app.checkpoint", node_id=current_node_id.get())
        return super().read()


def _registry() -> Any:
    registry = build_registry()
    worker = ChunkStep(
        f"{JOB}.worker",
        reader=lambda se: _Reader(
            range(int(se.execution_context["lo"]), int(se.execution_context["hi"])), name="items"
        ),
        writer=item_writer(_write_items),
        chunk_size=CHUNK,
    )
    registry.register(
        Job(JOB, [PartitionStep(f"{JOB}.master", worker, RangePartitioner(True, 2, ITEMS))])
    )
    return registry


def _items(backend: Backend, job_key: str | None = None) -> Counter[int]:
    with backend.engine.connect() as conn:
        stmt = select(items_written.c.item)
        if job_key is not None:
            stmt = stmt.where(items_written.c.job_key == job_key)
        return Counter(r[0] for r in conn.execute(stmt))


def _partition_statuses(backend: Backend, job_execution_id: int) -> Counter[str]:
    with backend.engine.connect() as conn:
        rows = conn.execute(
            select(partitions.c.status).where(partitions.c.job_execution_id == job_execution_id)
        )
        return Counter(r[0] for r in rows)


def _claimed_on(backend: Backend) -> set[str]:
    with backend.engine.connect() as conn:
        rows = conn.execute(
            select(partitions.c.assigned_node).where(partitions.c.status == "CLAIMED")
        )
        return {r[0] for r in rows}


def _step_statuses(backend: Backend, job_execution_id: int) -> Counter[str]:
    with backend.engine.connect() as conn:
        rows = conn.execute(
            select(step_execution.c.status).where(
                step_execution.c.job_execution_id == job_execution_id
            )
        )
        return Counter(r[0] for r in rows)


def _status(backend: Backend, job_execution_id: int) -> str:
    with backend.engine.connect() as conn:
        return str(
            conn.execute(
                select(job_execution.c.status).where(
                    job_execution.c.job_execution_id == job_execution_id
                )
            ).scalar_one()
        )


def _launch(master: Any, run: int, item_ms: int = ITEM_MS) -> tuple[int, dict[str, Any]]:
    job = master.registry.get_job(JOB)
    execution = master.create_execution(job, _params(run, item_ms))
    return execution.id, in_thread(lambda: master.run_execution(job, execution))


def _params(run: int, item_ms: int = ITEM_MS) -> Any:
    from dbcluster.batch.parameters import as_job_parameters

    return as_job_parameters({"run": run, "item_ms": item_ms})


def _assert_stopped_and_restart(backend: Backend, master: Any, job_id: int) -> None:
    """Nothing of the stopped execution is in flight; its restart writes the rest once."""
    statuses = _partition_statuses(backend, job_id)
    assert not statuses["PENDING"] and not statuses["CLAIMED"], statuses
    steps = _step_statuses(backend, job_id)
    assert not {"STARTING", "STARTED", "STOPPING"} & set(steps), steps
    assert steps["STOPPED"] >= 2, steps  # the master step and at least one partition
    restarted = master.restart(job_id)
    assert restarted.status is BatchStatus.COMPLETED, restarted.exit_status
    written = _items(backend, restarted.job_instance.job_key)
    assert set(written) == set(range(ITEMS)), sorted(set(range(ITEMS)) - set(written))[:10]
    assert set(written.values()) == {1}, [i for i, n in written.items() if n > 1][:10]


@THREE_SERVERS
def test_stop_partitions_running_on_three_nodes_then_restart(
    backend: Backend, make_cluster: Any
) -> None:
    registry = _registry()
    master = make_cluster(SETTINGS, work=False, registry=registry)
    workers = [make_cluster(SETTINGS, registry=registry) for _ in range(3)]
    job_id, run = _launch(master, 1)
    worker_ids = {w.node.node_id for w in workers}
    wait_for(
        lambda: _claimed_on(backend) >= worker_ids and len(_items(backend)) >= 3 * CHUNK,
        what="partitions to run on all three workers",
    )
    # Stopped from a node that is neither the master nor running the job's step there: only
    # the database carries the request.
    other = make_cluster(SETTINGS, work=False, registry=registry)
    before = sum(_items(backend).values())
    asked = time.monotonic()
    requested = other.stop_execution(job_id)
    # As read after the request: STOPPING, or already STOPPED when every node was that quick.
    assert requested.status in (BatchStatus.STOPPING, BatchStatus.STOPPED), requested
    run["thread"].join(20)
    took = time.monotonic() - asked
    assert not run["thread"].is_alive() and "error" not in run, run.get("error")
    ended = run["result"]
    assert (ended.status, ended.exit_status.code) == (BatchStatus.STOPPED, "STOPPED")
    assert _status(backend, job_id) == "STOPPED"
    # About one chunk: each of the six running partitions commits the chunk it was in and one
    # more (the node's check interval is 50 ms, a chunk 100 ms); one more again is allowed for a
    # check delayed on a loaded machine. Without the stop they would write 300 - before.
    after = sum(_items(backend).values())
    assert after - before <= 6 * 3 * CHUNK, (before, after)
    assert after < ITEMS
    assert took < 5, took
    # Stopping it again: it ended.
    with pytest.raises(NothingToStopError):
        other.stop_execution(job_id)
    with pytest.raises(NoSuchJobExecutionError):
        other.stop_execution(job_id + 10_000)
    _assert_stopped_and_restart(backend, master, job_id)


@THREE_SERVERS
def test_stop_racing_a_node_death_moves_none_of_its_partitions(
    backend: Backend, make_cluster: Any
) -> None:
    registry = _registry()
    master = make_cluster(SETTINGS, work=False, registry=registry)
    workers = [make_cluster(SETTINGS, registry=registry) for _ in range(3)]
    recorder = record_events(master.node)
    job_id, run = _launch(master, 2)
    dying = workers[2]
    wait_for(
        lambda: dying.node.node_id in _claimed_on(backend) and len(_items(backend)) >= 3 * CHUNK,
        what="partitions to run on the node about to die",
    )
    # The node stops answering (its partitions park, its heartbeat stops), then the stop
    # arrives: its partitions can only be ended by the master, and must not run elsewhere.
    with freeze(dying.node):
        master.stop_execution(job_id)
        run["thread"].join(20)
        assert not run["thread"].is_alive() and "error" not in run, run.get("error")
        assert run["result"].status is BatchStatus.STOPPED
        assert not recorder.named("reassigned"), recorder.named("reassigned")
        _assert_stopped_and_restart(backend, master, job_id)


@THREE_SERVERS
def test_a_master_taking_over_a_stopping_job_ends_it_stopped(
    backend: Backend, make_cluster: Any
) -> None:
    registry = _registry()
    master = make_cluster(SETTINGS, work=False, registry=registry)
    workers = [make_cluster(SETTINGS, registry=registry) for _ in range(3)]
    recorders = [record_events(w.node) for w in workers]
    job_id, run = _launch(master, 3)
    wait_for(lambda: len(_items(backend)) >= 3 * CHUNK, what="partitions to run")
    with freeze(master.node):
        # The master is gone (frozen); the stop is requested while nobody masters the job.
        workers[0].stop_execution(job_id)
        wait_for(
            lambda: any(r.named("took_over") for r in recorders),
            timeout=20,
            what="a survivor to take the job over",
        )
        wait_for(
            lambda: _status(backend, job_id) != "STOPPING",
            timeout=20,
            what="the job to end under its new master",
        )
    assert _status(backend, job_id) == "STOPPED"
    run["thread"].join(20)
    assert run["result"].status is BatchStatus.STOPPED
    _assert_stopped_and_restart(backend, workers[0], job_id)


def test_a_master_write_of_a_running_status_keeps_the_stop_request(backend: Backend) -> None:
    """The race where the stop lands between an execution's creation (STARTING) and its
    master's STARTED write: the request survives and the job's steps see it."""
    from dbcluster.batch.repository import JobRepository
    from dbcluster.cluster.store import CoordinationStore

    repository = JobRepository(backend.engine)
    instance = repository.create_job_instance("stop-race", _params(4))
    execution = repository.create_job_execution(instance, _params(4))
    assert CoordinationStore(backend.engine).request_stop(execution.id)
    execution.status = BatchStatus.STARTED
    repository.update_job_execution(execution)
    assert _status(backend, execution.id) == "STOPPING"
    execution.status = BatchStatus.STOPPED
    repository.update_job_execution(execution)
    assert _status(backend, execution.id) == "STOPPED"
    with backend.engine.connect() as conn:
        version = conn.execute(
            select(func.max(job_execution.c.version)).where(
                job_execution.c.job_execution_id == execution.id
            )
        ).scalar_one()
    assert version == execution.version


@THREE_SERVERS
def test_partitions_no_node_has_claimed_are_never_started(
    backend: Backend, make_cluster: Any
) -> None:
    """One worker running one partition at a time: the stop ends the other (PENDING) one
    through the master, without any node starting it."""
    registry = _registry()
    # The worker learns of the stop a second after the master (which asks it): a worker that
    # learns first may claim the waiting partition as its slot frees, which then ends STOPPED
    # at once without doing any work; here the master must end it before anyone claims it.
    one_slot = SETTINGS.with_overrides(concurrency_limit=1, master_check_interval=1000)
    master = make_cluster(SETTINGS, work=False, registry=registry)
    make_cluster(one_slot, registry=registry)
    job_id, run = _launch(master, 5, item_ms=8)  # a partition of 150 items: 1.2 s
    wait_for(
        lambda: (
            len(_items(backend)) >= CHUNK
            and _partition_statuses(backend, job_id) == {"CLAIMED": 1, "PENDING": 1}
        ),
        what="one partition to run and the other to wait",
    )
    master.stop_execution(job_id)
    run["thread"].join(20)
    assert run["result"].status is BatchStatus.STOPPED
    with backend.engine.connect() as conn:
        rows = conn.execute(
            select(step_execution.c.status, step_execution.c.start_time).where(
                step_execution.c.job_execution_id == job_id,
                step_execution.c.step_name.like(f"{JOB}.worker:%"),
            )
        ).all()
    assert sorted(r.status for r in rows) == ["STOPPED", "STOPPED"], rows
    assert sum(r.start_time is None for r in rows) == 1, rows  # never claimed, never started
    _assert_stopped_and_restart(backend, master, job_id)
