"""Fencing holds at commit time: one deterministic interleaving test per defect of the fencing
issue, each driving its exact window with a fault point (dbcluster.testing.points).

Every test runs on SQLite, PostgreSQL and MariaDB (where the window does not exist on SQLite,
because a writer there holds the whole database's write lock, the test still pins the behaviour).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    select,
    update,
)

from dbcluster.batch import ChunkStep, Job, PartitionStep, TaskletStep
from dbcluster.batch.listeners import JobListener
from dbcluster.batch.partition import FunctionPartitioner
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.service import Service
from dbcluster.dialects.base import NODE_UNREACHABLE
from dbcluster.schema import job_coordination, job_execution, nodes, partitions
from dbcluster.testing import points
from dbcluster.testing.app import (
    FAST_SETTINGS,
    RangePartitioner,
    build_registry,
    install_observer,
    ledger_tasklet,
    master_effects,
    remove_observer,
)
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import (
    cut_node,
    fail_statements,
    freeze,
    hold_services,
    lock_waiters,
    lose_commit_acks,
    record_events,
    transfer_while_parked,
)
from dbcluster.testing.invariants import commit_in_order
from dbcluster.testing.waiting import in_thread, wait_for

#: Thresholds with room for a test to act inside a window: a session idle in a transaction is
#: ended by the server after 2 s (the unreachable threshold), a silent node is removed after 4 s.
SETTINGS = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)
#: The same, with survivors abandoning (not taking over) a job whose master is lost: the tests
#: that pin what a lost master may still write need a survivor that does not go on with the job.
ABANDON = SETTINGS.with_overrides(master_failover="abandon")

items_md = MetaData()
items_out = Table(
    "t_fence_items",
    items_md,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("partition_name", String(50), nullable=False),
    Column("item", BigInteger, nullable=False),
    Column("node_id", String(100)),
)

ITEMS = 30


class ItemWriter:
    """Writes each item as a row, through the chunk's transaction."""

    def write(self, items: list[int], ctx: Any) -> None:
        from dbcluster.cluster.executor import current_node_id

        name = ctx.step_execution.step_name.split(":", 1)[1]
        ctx.connection.execute(
            insert(items_out),
            [{"partition_name": name, "item": i, "node_id": current_node_id.get()} for i in items],
        )


def _reader(se: Any) -> Any:
    from dbcluster.batch import IterableItemReader

    lo, hi = int(se.execution_context["lo"]), int(se.execution_context["hi"])
    return IterableItemReader(range(lo, hi))


def items_registry(partitions_: int = 1, transferable: bool = True, count: int = ITEMS) -> Any:
    """A job ``items``: ``partitions_`` chunk-step partitions over [0, count), 5 items a chunk."""
    registry = build_registry()
    width = count // partitions_

    def split(grid: int) -> dict[str, dict[str, int]]:
        return {
            f"p{lo:03d}": {"lo": lo, "hi": min(count, lo + width)} for lo in range(0, count, width)
        }

    worker = ChunkStep("items.worker", reader=_reader, writer=ItemWriter(), chunk_size=5)
    registry.register(
        Job(
            "items",
            [PartitionStep("items.master", worker, FunctionPartitioner(split, transferable))],
        )
    )
    return registry


@pytest.fixture
def items(backend: Backend) -> Iterator[Table]:
    items_md.drop_all(backend.engine)
    items_md.create_all(backend.engine)
    yield items_out
    items_md.drop_all(backend.engine)


@pytest.fixture
def observed() -> Iterator[None]:
    """Every fenced transaction records the owner row it holds at commit time."""
    install_observer()
    yield
    remove_observer()


def written(backend: Backend) -> Counter[int]:
    with backend.engine.connect() as conn:
        return Counter(r.item for r in conn.execute(select(items_out.c.item)))


def partition_row(backend: Backend, job_execution_id: int) -> Any:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(partitions).where(partitions.c.job_execution_id == job_execution_id)
        ).first()


def commits_out_of_order(backend: Backend) -> list[Any]:
    from dbcluster.testing.app import commits

    with backend.engine.connect() as conn:
        return [r for r in conn.execute(select(commits)) if not commit_in_order(r)]


def of_job(step_name_prefix: str, chunk: int | None = None) -> Callable[..., bool]:
    """A fault-point filter: a chunk transaction of the named step (its ``chunk``-th commit)."""

    def match(step_execution: Any = None, final: bool = False, **_: Any) -> bool:
        if step_execution is None or final:
            return False
        if not step_execution.step_name.startswith(step_name_prefix):
            return False
        return chunk is None or step_execution.commit_count == chunk

    return match


def silence(backend: Backend, node_id: str) -> None:
    """Set a node's heartbeat far in the past and its status UNREACHABLE."""
    from datetime import timedelta

    with backend.engine.connect() as conn:
        now = conn.execute(backend.provider.select_now()).scalar_one()
    with backend.engine.begin() as conn:
        conn.execute(
            update(nodes)
            .where(nodes.c.node_id == node_id)
            .values(status=NODE_UNREACHABLE, last_heartbeat=now - timedelta(seconds=60))
        )


def registered(backend: Backend, node_id: str) -> bool:
    """Whether the node's registry row is still there."""
    with backend.engine.connect() as conn:
        row = conn.execute(select(nodes.c.node_id).where(nodes.c.node_id == node_id)).first()
    return row is not None


# --- 1. the write guard is a lock held to COMMIT -----------------------------------------------


def test_a_transfer_waits_for_the_chunk_that_holds_its_partition(
    backend: Backend, items: Table, make_cluster: Any, observed: None
) -> None:
    """A worker's chunk transaction holds its partition row to COMMIT: failing the partition (as
    a master or a survivor does) waits for that commit, so the commit lands first, and a restart
    resumes after it: every item exactly once."""
    registry = items_registry()
    master = make_cluster(SETTINGS, registry=registry, work=False)
    make_cluster(SETTINGS, registry=registry)
    run, transfer, _ = transfer_while_parked(
        backend.engine,
        lambda: master.launch("items", {"run": 1}),
        "chunk.before_commit",
        of_job("items.worker", chunk=2),
        "a chunk transaction",
    )
    moved = transfer["moved"]
    transfer["thread"].join(20)
    assert "error" not in transfer, transfer.get("error")
    run["thread"].join(30)
    first = run["result"]
    assert not commits_out_of_order(backend)
    if moved == [0]:
        # SQLite's lock is no queue: the worker may go on and finish before the waiting writer
        # gets the lock. The transfer then finds nothing in flight. So may a failure tried
        # again after a deadlock (seen once on a Galera node): the partition finished between.
        assert backend.provider.network_backend is False or len(transfer["tries"]) > 1
        assert first.status is BatchStatus.COMPLETED
    else:
        # The held chunk committed before the partition was failed: items 0-9 at least, each
        # once, and none after the failure (commits_out_of_order above). Later chunks may also
        # commit first: SQLite's lock is no queue, and on PostgreSQL the failing UPDATE, woken
        # by the held chunk's COMMIT, must lock the row's new version, which the worker's next
        # chunk may lock before it (a waiter keeps no place in line across a committed update;
        # seen 2 in 20 runs here before this session's changes as after them).
        assert moved == [1]
        assert first.status is BatchStatus.FAILED
        before = written(backend)
        assert len(before) >= 10 and before == Counter(range(len(before))), before
        restarted = master.restart(first.id)
        assert restarted.status is BatchStatus.COMPLETED, restarted.exit_status
    assert written(backend) == Counter(range(ITEMS)), "an item was written twice or lost"


@pytest.mark.backends("postgresql", "mariadb", "mysql")
def test_removing_a_node_waits_for_its_chunk_and_fences_the_rest(
    backend: Backend, items: Table, make_cluster: Any, observed: None
) -> None:
    """Removing a node fences its claimed partitions in the removal's transaction: the removal
    waits for a chunk transaction of that node holding its partition (once it committed, the
    node's next chunk sees the new attempt and commits nothing), or commits first and the chunk
    sees the new attempt at its guard and rolls back. (Not on SQLite: there a chunk
    transaction holds the one write lock, so nothing at all can commit beside it.)"""
    registry = items_registry()
    master = make_cluster(SETTINGS, registry=registry, work=False)
    victim = make_cluster(SETTINGS, registry=registry)
    with points.parked("chunk.before_commit", of_job("items.worker", chunk=2)) as park:
        run = in_thread(lambda: master.launch("items", {"run": 2}))
        park.wait()
        with hold_services(victim.node):  # its heartbeat stops, as a stopped process's would
            victim_id = victim.node.node_id
            silence(backend, victim_id)
            removal = in_thread(
                lambda: master.node.store.sweep(SETTINGS.unreachable_threshold, 1000)
            )
            # The removal is under way before the chunk may commit: blocked on the chunk's
            # lock, or already done (the chunk then sees the new attempt at its guard and rolls
            # back). Released before either, on a loaded host the victim could finish its
            # partition first and the removal would have nothing to fence.
            wait_for(
                lambda: lock_waiters(backend.engine) >= 1 or not registered(backend, victim_id),
                what="the removal to wait for the chunk, or to be done",
            )
            park.release()
            removal["thread"].join(20)
            assert "error" not in removal, removal.get("error")
            # Removed once the chunk committed: by this sweep or, on a loaded machine, by the
            # master's own sweeper (which waited on the same lock) just before it.
            assert not registered(backend, victim_id), "the victim's node row was not removed"
        # It finds its row gone, fences itself and rejoins; the master moves the partition.
        run["thread"].join(30)
    execution = run["result"]
    # Its second chunk committed before the removal (or rolled back after it); then the
    # partition moved, and ran again elsewhere from the last chunk that committed.
    assert not commits_out_of_order(backend)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert written(backend) == Counter(range(ITEMS))
    row = partition_row(backend, execution.id)
    assert row.attempt == 2 and row.assigned_node != victim.node.ids[0]


# --- 2. a master rides out an outage ---------------------------------------------------------


def test_a_master_rides_out_a_short_outage(backend: Backend, make_cluster: Any) -> None:
    """A master whose database connection is cut for less than the unreachable threshold keeps
    its job: no partition is failed, the job completes."""
    master = make_cluster(SETTINGS, work=False)
    make_cluster(SETTINGS)
    run = in_thread(lambda: master.launch("ledger", {"run": 3, "delay_ms": 1500, "tick_ms": 50}))
    wait_for(lambda: _claimed(backend) >= 4, what="the partitions to start")
    with cut_node(master.node):
        time.sleep(SETTINGS.unreachable_threshold / 1000 / 2)
    run["thread"].join(60)
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        statuses = {r.status for r in conn.execute(select(partitions))}
    assert statuses == {"COMPLETED"}


def _claimed(backend: Backend) -> int:
    with backend.engine.connect() as conn:
        return len(conn.execute(select(partitions).where(partitions.c.status == "CLAIMED")).all())


# --- 3. no execution without an owner survivors can see ---------------------------------------


def _listened_ledger() -> Any:
    """The test application with ``ledger-listened``: the ledger job with a job listener, which
    keeps its placement out of the creating transaction on every database (see
    ``dbcluster.cluster.creation.placed_at_launch``), so that a master can die between the two."""
    registry = build_registry()
    registry.register(
        Job(
            "ledger-listened",
            [
                PartitionStep(
                    "ledger-listened.master",
                    TaskletStep("ledger-listened.worker", ledger_tasklet),
                    RangePartitioner(True),
                )
            ],
            listeners=[JobListener()],
        )
    )
    return registry


def test_an_execution_whose_master_dies_before_running_it_is_recovered(
    backend: Backend, make_cluster: Any
) -> None:
    registry = _listened_ledger()
    master = make_cluster(ABANDON, work=False, registry=registry)
    survivor = make_cluster(ABANDON, registry=registry)
    recorder = record_events(survivor.node)
    with points.parked("master.after_create_execution") as park:
        run = in_thread(lambda: master.launch("ledger-listened", {"run": 4}))
        created = park.wait()[0]["job_execution"]
        frozen = freeze(master.node)  # it dies, as far as the cluster can tell
        wait_for(
            lambda: recorder.named("abandoned"),
            timeout=30,
            what="a survivor to recover the execution",
        )
    frozen.thaw()
    run["thread"].join(30)
    recovered = survivor.repository.get_job_execution(created.id)
    assert (
        recovered.status is BatchStatus.FAILED and "abandoned" in recovered.exit_status.description
    )
    with backend.engine.connect() as conn:
        assert conn.execute(select(partitions)).all() == [], "the lost master ran its job"


def test_a_detached_master_whose_parent_is_gone_keeps_running() -> None:
    """Reporting the execution id to a parent that already exited must not kill the master."""
    code = (
        "import os, sys\n"
        "r, w = os.pipe()\n"
        "os.close(r)\n"
        "os.dup2(w, sys.stdout.fileno())\n"
        "from dbcluster.cli.master import report_to_parent\n"
        "report_to_parent(42)\n"
        "sys.stderr.write('still running\\n')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    assert "still running" in done.stderr


# --- 4. a paused master that resumes commits nothing -----------------------------------------


def test_a_master_paused_between_steps_commits_nothing_after_a_survivor_took_its_job(
    backend: Backend, make_cluster: Any, ledger_engine: Any, observed: None
) -> None:
    master = make_cluster(ABANDON)
    survivor = make_cluster(ABANDON)
    recorder = record_events(survivor.node)
    params = {"run": 5}
    with points.parked("master.between_steps") as park:
        run = in_thread(lambda: master.launch("ledger-steps", params))
        first = park.wait(timeout=30)[0]["job_execution"]
        with freeze(master.node):
            wait_for(lambda: recorder.named("abandoned"), timeout=30, what="the abandonment")
            restarted = survivor.restart(first.id)
            assert restarted.status is BatchStatus.COMPLETED, restarted.exit_status
            # The old master wakes up (before it learns it was removed) and goes on to its
            # job's next step.
            park.release()
            run["thread"].join(30)
    assert not run["thread"].is_alive()
    with backend.engine.connect() as conn:
        effects = conn.execute(select(master_effects)).all()
    assert [e.job_execution_id for e in effects] == [restarted.id], (
        "the old master published its step's effect after a survivor had taken the job"
    )
    assert not commits_out_of_order(backend)
    assert survivor.repository.get_job_execution(first.id).status is BatchStatus.FAILED


# --- 5. transient errors inside step transactions are retried ---------------------------------


def test_a_chunk_statement_lost_to_a_dropped_connection_is_repeated(
    backend: Backend, items: Table, make_cluster: Any
) -> None:
    registry = items_registry()
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    inserts = Counter[str]()

    def third_chunk(sql: str, params: Any) -> bool:
        if "INSERT INTO t_fence_items" not in sql:
            return False
        inserts["seen"] += 1
        return inserts["seen"] == 3

    failed = fail_statements(worker.node.work_engine, times=1, when=third_chunk)
    execution = master.launch("items", {"run": 6})
    assert failed.count == 1, "the fault was not injected"
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert written(backend) == Counter(range(ITEMS))


def test_a_chunk_commit_whose_acknowledgement_is_lost_is_not_repeated(
    backend: Backend, items: Table, make_cluster: Any
) -> None:
    registry = items_registry()
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    lost = lose_commit_acks(
        worker.node.work_engine,
        times=1,
        when=lambda statements: any("INSERT INTO t_fence_items" in s for s in statements),
    )
    execution = master.launch("items", {"run": 7})
    assert lost.count == 1, "the fault was not injected"
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert written(backend) == Counter(range(ITEMS)), "the committed chunk was written again"


@pytest.mark.parametrize("which", ["start", "final"])
def test_a_step_start_or_end_lost_to_a_dropped_connection_is_repeated(
    backend: Backend, items: Table, make_cluster: Any, which: str
) -> None:
    registry = items_registry()
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    status = "STARTED" if which == "start" else "COMPLETED"
    failed = fail_statements(
        worker.node.work_engine,
        times=1,
        when=lambda sql, params: "UPDATE batch_step_execution" in sql and status in str(params),
    )
    execution = master.launch("items", {"run": 8})
    assert failed.count == 1, "the fault was not injected"
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert written(backend) == Counter(range(ITEMS))


# --- 6. every engine bounds its lock waits; idle transactions end ------------------------------


@pytest.mark.backends("postgresql", "mariadb", "mysql")
def test_every_engine_a_node_opens_bounds_its_lock_waits(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(SETTINGS)
    node = cluster.node
    bounds = {
        "coordination": (node.coordination_engine, SETTINGS.coordination_lock_timeout_ms),
        "work": (node.work_engine, SETTINGS.work_lock_timeout_ms),
    }
    with backend.engine.connect() as holder, holder.begin():
        holder.execute(update(nodes).where(nodes.c.node_id == node.node_id).values(current_load=99))
        for name, (engine, bound_ms) in bounds.items():

            def blocked(engine: Any = engine) -> None:
                with engine.begin() as conn:
                    conn.execute(
                        update(nodes).where(nodes.c.node_id == node.node_id).values(capacity=3)
                    )

            waiting = in_thread(blocked)
            # MySQL and MariaDB bound lock waits in whole seconds.
            waiting["thread"].join(max(bound_ms / 1000, 1.0) + 1.5)
            assert not waiting["thread"].is_alive(), f"the {name} engine waits for a lock unbounded"
            assert "error" in waiting, f"the {name} engine's write went through a held lock"
            assert node.store.provider.is_transient(waiting["error"]), waiting["error"]


@pytest.mark.backends("postgresql", "mariadb")
def test_the_server_ends_a_node_session_idle_inside_a_transaction(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(SETTINGS)
    idle_s = SETTINGS.idle_transaction_ms / 1000
    with cluster.node.work_engine.connect() as conn:
        conn.begin()
        conn.execute(select(nodes.c.node_id)).all()
        time.sleep(idle_s + 1.5)
        with pytest.raises(Exception) as raised:
            conn.execute(select(nodes.c.node_id)).all()
    assert cluster.node.store.provider.is_transient(raised.value), raised.value


@pytest.mark.backends("postgresql", "mariadb")
def test_a_recovery_is_not_blocked_forever_by_a_worker_stopped_inside_its_transaction(
    backend: Backend, items: Table, make_cluster: Any
) -> None:
    """A worker parked between its fence and COMMIT, its master gone: the survivor's recovery
    waits (bounded, repeated) until the server ends the idle transaction, then completes."""
    registry = items_registry()
    master = make_cluster(ABANDON, registry=registry, work=False)
    worker = make_cluster(ABANDON, registry=registry)
    recorder = record_events(worker.node)
    with points.parked("chunk.before_commit", of_job("items.worker", chunk=2)) as park:
        run = in_thread(lambda: master.launch("items", {"run": 9}))
        park.wait()
        with freeze(master.node):
            began = time.monotonic()
            wait_for(
                lambda: recorder.named("abandoned"),
                timeout=30,
                what="the survivor to abandon the job",
            )
            took = time.monotonic() - began
    run["thread"].join(30)
    assert took < (SETTINGS.cleanup_threshold + SETTINGS.idle_transaction_ms) / 1000 + 10
    with backend.engine.connect() as conn:
        coordination = conn.execute(select(job_coordination)).one()
    assert coordination.status == "ABANDONED"


# --- 7. the pool is sized for the node's concurrency ------------------------------------------


@pytest.mark.backends("postgresql", "mariadb", "mysql")
def test_a_node_holds_as_many_chunk_transactions_as_its_concurrency(
    backend: Backend, items: Table, make_cluster: Any
) -> None:
    wide = SETTINGS.with_overrides(
        concurrency_limit=16, unreachable_threshold=5000, cleanup_threshold=10000
    )
    registry = items_registry(partitions_=16, count=32)  # 16 partitions of one chunk each
    master = make_cluster(wide, registry=registry)
    with points.parked("chunk.before_commit", of_job("items.worker", chunk=1), limit=None) as p:
        run = in_thread(lambda: master.launch("items", {"run": 10}))
        p.wait(count=16, timeout=20)
        # Every partition holds a connection inside its transaction; the master still writes.
    run["thread"].join(60)
    assert run["result"].status is BatchStatus.COMPLETED, run["result"].exit_status


# --- 8. a node removed between poll and claim claims nothing ----------------------------------


def test_a_node_removed_between_its_poll_and_its_claim_claims_nothing(
    backend: Backend, make_cluster: Any, ledger_engine: Any
) -> None:
    master = make_cluster(SETTINGS, work=False)
    victim = make_cluster(SETTINGS)
    with points.parked(
        "node.between_poll_and_claim", lambda node_id, **_: node_id in victim.node.ids
    ) as park:
        run = in_thread(lambda: master.launch("ledger-fixed", {"run": 11}))
        park.wait()
        with hold_services(victim.node):
            removed = victim.node.node_id
            silence(backend, removed)
            # Removed now, while it is parked between its poll and its claim: by this sweep or,
            # on a loaded machine, by the master's own sweeper (every 100 ms) just before it.
            master.node.store.sweep(SETTINGS.unreachable_threshold, 1000)
            assert not registered(backend, removed), "the victim's node row was not removed"
            backup = make_cluster(SETTINGS)  # a live node for the master to move them to
            park.release()
            wait_for(lambda: victim.node.is_fenced, what="the victim to fence itself")
    run["thread"].join(60)
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        rows = conn.execute(select(partitions)).all()
    # Never claimed by the removed node: moved under their first attempt and run elsewhere.
    assert {r.attempt for r in rows} == {1}
    # Run by live nodes: the backup, or the victim under the id it rejoined with (whichever
    # claimed them first: a master's move or a steal).
    live = {backup.node.node_id, *victim.node.ids[1:]}
    assert {r.assigned_node for r in rows} <= live


# --- 9. a node that rejoined does not act for its old identity ---------------------------------


def test_a_master_fenced_mid_job_writes_nothing_under_its_new_id(
    backend: Backend, make_cluster: Any
) -> None:
    master = make_cluster(ABANDON, work=False)
    survivor = make_cluster(ABANDON)
    recorders = [record_events(survivor.node), record_events(master.node)]
    run = in_thread(lambda: master.launch("ledger", {"run": 12, "delay_ms": 800, "tick_ms": 50}))
    wait_for(lambda: _claimed(backend) >= 2, what="the partitions to start")
    old_identity = master.node.identity
    # The master's node fences itself (it could not heartbeat) and rejoins under a new id;
    # its old id is left to be removed by the survivors.
    with hold_services(master.node):
        master.node.fence(old_identity, "test: no heartbeat")
    wait_for(lambda: master.node.node_id != old_identity.node_id, what="the master to rejoin")
    run["thread"].join(30)
    wait_for(
        lambda: any(r.named("abandoned") for r in recorders),
        timeout=30,
        what="a survivor to abandon it",
    )
    with backend.engine.connect() as conn:
        coordination = conn.execute(select(job_coordination)).one()
        job = conn.execute(select(job_execution)).one()
    assert coordination.status == "ABANDONED"
    assert coordination.master_node != old_identity.node_id
    assert "abandoned by node" in (job.exit_message or ""), (
        f"the fenced master wrote its job's end itself: {job.exit_message}"
    )


# --- 10. smaller -------------------------------------------------------------------------------


def test_a_recovered_job_that_had_ended_keeps_its_outcome(
    backend: Backend, make_cluster: Any
) -> None:
    """A coordination row left in flight by a master that died after its job ended FAILED is
    closed FAILED (not COMPLETED) by the survivor."""
    cluster = make_cluster(SETTINGS)
    execution = cluster.launch("ledger", {"run": 13, "fail": "*"})
    assert execution.status is BatchStatus.FAILED
    with backend.engine.begin() as conn:
        conn.execute(update(job_coordination).values(status="STARTED", master_node="gone-master"))
    wait_for(
        lambda: _coordination_status(backend) not in ("STARTED", "RECOVERING"),
        timeout=20,
        what="the survivor's recovery",
    )
    assert _coordination_status(backend) == "FAILED"


def _coordination_status(backend: Backend) -> str:
    with backend.engine.connect() as conn:
        return str(conn.execute(select(job_coordination.c.status)).scalar_one())


def test_a_service_keeps_a_wake_up_that_arrives_while_it_runs() -> None:
    runs: list[float] = []
    done = threading.Event()

    class Once(Service):
        name = "test"

        def run_once(self) -> None:
            runs.append(time.monotonic())
            if len(runs) == 1:
                self.wake()  # arrives while the body runs
            elif len(runs) == 2:
                done.set()

    service = Once(interval_ms=60_000)
    service.start()
    try:
        assert done.wait(5), "a wake-up that arrived while the body ran was lost"
    finally:
        service.stop()


def test_partitions_are_indexed_by_job_execution() -> None:
    assert any(
        [c.name for c in index.columns][:1] == ["job_execution_id"] for index in partitions.indexes
    )
