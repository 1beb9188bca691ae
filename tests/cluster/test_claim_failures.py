"""A node whose claims keep failing on something other than the database's passing trouble
(a schema this version cannot use, a bug) withdraws from taking partitions: its work runs
elsewhere, it takes work again once a claim works, and with no node left to run a job's
partitions the job ends instead of waiting for ever."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import column as text_column
from sqlalchemy import create_engine, delete, select
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.pool import NullPool

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import Cluster
from dbcluster.cluster.health import readiness
from dbcluster.cluster.worker import CLAIM_FAILURES_TO_WITHDRAW, is_passing
from dbcluster.schema import nodes, partitions, step_execution
from dbcluster.testing.app import FAST_SETTINGS, ledger
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import record_events
from dbcluster.testing.waiting import in_thread, wait_for

#: The broken node's partitions leave it only through its withdrawal, which these tests are
#: about: no node steals them while it holds them, not even when a loaded machine delays its
#: heartbeats past the usual test threshold (a silent node's unclaimed partitions may be taken
#: at once, and then the job can end before the broken node has failed a claim).
HELD = FAST_SETTINGS.with_overrides(
    unreachable_threshold=5000, cleanup_threshold=10000, work_stealing_delay=600_000
)


def _break_claims(cluster: Cluster, *, only_with_partitions: bool = False) -> dict[str, Any]:
    """Every claim of this node (with ``only_with_partitions``: every claim of at least one
    partition) fails as a schema it cannot use would, until ``broken`` is cleared."""
    store = cluster.node.store
    real = store.claim
    state: dict[str, Any] = {"broken": True, "failed": 0}

    def claim(node_id: str, load: int, ids: Any, *args: Any, **kwargs: Any) -> Any:
        if state["broken"] and (ids or not only_with_partitions):
            state["failed"] += 1
            raise ProgrammingError(
                "UPDATE batch_partitions ...", {}, Exception('column "attempt" does not exist')
            )
        return real(node_id, load, ids, *args, **kwargs)

    store.claim = claim  # type: ignore[method-assign]
    return state


def _capacity(backend: Backend, cluster: Cluster) -> int | None:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(nodes.c.capacity).where(nodes.c.node_id == cluster.node.node_id)
        ).scalar_one_or_none()


def _real_error(engine: Any, work: Any) -> BaseException:
    with pytest.raises(DBAPIError) as raised, engine.connect() as conn:
        work(conn)
    return raised.value


def test_only_trouble_the_database_gets_over_is_passing(backend: Backend) -> None:
    """Errors the database raised for real: a missing column (an ``OperationalError`` on SQLite
    and MySQL) is not passing trouble; a write refused by a read-only transaction (what a
    demoted primary answers) is."""
    provider, engine = backend.provider, backend.engine
    missing = _real_error(
        engine, lambda conn: conn.execute(select(text_column("dbc_no_such_column")))
    )
    assert not is_passing(provider, missing), missing
    assert not is_passing(provider, KeyError("p_id"))
    assert is_passing(provider, ConnectionError("refused"))
    if provider.name == "sqlite":
        read_only = create_engine(f"sqlite:///file:{engine.url.database}?mode=ro&uri=true")
        session_read_only = None
    else:
        # A session of its own (discarded after): its transactions are READ ONLY.
        read_only = create_engine(engine.url, poolclass=NullPool)
        session_read_only = (
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"
            if provider.name == "postgresql"
            else "SET SESSION TRANSACTION READ ONLY"
        )

    def write(conn: Any) -> None:
        if session_read_only is not None:
            conn.exec_driver_sql(session_read_only)
            conn.commit()
        conn.execute(delete(nodes).where(nodes.c.node_id == "x"))

    try:
        refused = _real_error(read_only, write)
    finally:
        read_only.dispose()
    assert provider.is_read_only(refused), refused
    assert is_passing(provider, refused)


def test_a_node_whose_claims_keep_failing_withdraws_and_its_work_runs_elsewhere(
    backend: Backend, make_cluster
) -> None:
    broken = make_cluster(HELD)
    healthy = make_cluster(HELD)
    state = _break_claims(broken)
    recorder = record_events(broken.node)
    execution = healthy.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED
    assert state["failed"] >= CLAIM_FAILURES_TO_WITHDRAW, "the fault was not injected"
    withdrawn = recorder.named("withdrawn")
    assert len(withdrawn) == 1 and "ProgrammingError" in withdrawn[0]["reason"], withdrawn
    assert _capacity(backend, broken) == 0
    ready, body = readiness(broken.node)
    assert not ready and "claims failed" in body["status"], body
    with backend.engine.connect() as conn:
        ran_on = {
            r.assigned_node
            for r in conn.execute(
                select(partitions.c.assigned_node).where(
                    partitions.c.job_execution_id == execution.id
                )
            )
        }
        written = conn.execute(
            select(ledger.c.partition_name).where(ledger.c.job_execution_id == execution.id)
        ).all()
    assert ran_on == {healthy.node.node_id}
    assert len(written) == len({r.partition_name for r in written}) == 8
    # Mended: the next claim it tries works, and it takes work again.
    state["broken"] = False
    # Its capacity is written before the node drops its withdrawal (Worker._take_work_again):
    # wait for both, not for the first alone.
    wait_for(
        lambda: (
            _capacity(backend, broken) == FAST_SETTINGS.concurrency_limit
            and readiness(broken.node)[0]
        ),
        timeout=10,
        what="the mended node to give its capacity back and report ready",
    )
    assert readiness(broken.node)[0]
    assert healthy.launch("ledger", {"run": 2}).status is BatchStatus.COMPLETED


@pytest.mark.parametrize("only_with_partitions", [False, True])
def test_a_job_whose_only_node_cannot_claim_ends_instead_of_waiting(
    backend: Backend, make_cluster, only_with_partitions: bool
) -> None:
    """Also when a claim of nothing works (the node takes work again, fails again, and waits
    twice as long each time, until its master gives up on the job's partitions)."""
    settings = FAST_SETTINGS.with_overrides(no_node_timeout=1500)
    master = make_cluster(settings, work=False)
    worker = make_cluster(settings)
    state = _break_claims(worker, only_with_partitions=only_with_partitions)
    run = in_thread(lambda: master.launch("ledger", {"run": 3}))
    run["thread"].join(timeout=30)
    assert not run["thread"].is_alive(), "the job waits on a node that cannot claim"
    assert state["failed"] >= CLAIM_FAILURES_TO_WITHDRAW
    execution = run["result"]
    assert execution.status is BatchStatus.FAILED
    with backend.engine.connect() as conn:
        messages = [
            r.exit_message
            for r in conn.execute(
                select(step_execution.c.exit_message).where(
                    step_execution.c.job_execution_id == execution.id,
                    step_execution.c.step_name.like("ledger.worker:%"),
                )
            )
        ]
    assert messages and all("no live node" in m for m in messages), messages


def test_a_withdrawn_node_keeps_no_capacity_after_a_failed_write_or_a_rejoin(
    backend: Backend, make_cluster
) -> None:
    """Its capacity 0 is written again after a failed try until it lands under the node's
    current id: when the first write failed (a database blip), and when the node rejoined under
    a new id (it registers without capacity)."""
    broken = make_cluster(HELD)
    healthy = make_cluster(HELD)
    _break_claims(broken)
    store = broken.node.store
    real_set_capacity = store.set_capacity
    blips: list[int] = []

    def set_capacity(node_id: str, capacity: int) -> None:
        if capacity == 0 and not blips:
            blips.append(capacity)
            raise OperationalError("UPDATE batch_nodes ...", {}, Exception("server closed"))
        real_set_capacity(node_id, capacity)

    store.set_capacity = set_capacity  # type: ignore[method-assign]
    assert healthy.launch("ledger", {"run": 4}).status is BatchStatus.COMPLETED
    assert blips, "the fault was not injected"
    wait_for(lambda: _capacity(backend, broken) == 0, timeout=10, what="capacity 0 written again")
    old_id = broken.node.node_id
    broken.node.fence(broken.node.identity, "test: fenced while withdrawn")
    wait_for(
        lambda: broken.node.node_id != old_id and _capacity(backend, broken) is not None,
        timeout=10,
        what="the node to rejoin",
    )
    assert _capacity(backend, broken) == 0, "it rejoined with capacity while withdrawn"
    assert healthy.launch("ledger", {"run": 5}).status is BatchStatus.COMPLETED


def _landing_then_failing(
    cluster: Cluster, times: int, thread_prefix: str = "", error: Exception | None = None
) -> dict[str, Any]:
    """The first ``times`` claims of partitions by this node (on threads whose names start with
    ``thread_prefix``) commit and then raise, as a claim whose acknowledgement was lost and
    whose retries were spent does (or ``error``: one after its commit, reading its rows)."""
    store = cluster.node.store
    real = store.claim
    state: dict[str, Any] = {"left": times, "landed": []}

    def claim(node_id: str, load: int, ids: Any, *args: Any, **kwargs: Any) -> Any:
        won = real(node_id, load, ids, *args, **kwargs)
        if (
            ids
            and won
            and state["left"]
            and threading.current_thread().name.startswith(thread_prefix)
        ):
            state["left"] -= 1
            state["landed"].extend(w.partition.step_execution_id for w in won)
            raise error or OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return won

    store.claim = claim  # type: ignore[method-assign]
    return state


def test_a_claim_that_landed_but_failed_runs_what_it_won(backend: Backend, make_cluster) -> None:
    """A claim whose commit landed though the claim raised (its acknowledgement lost, its
    retries spent) is read back once the database answers, and what it won runs: left alone,
    those partitions would stay CLAIMED on a live node (their master recovers only the
    partitions of nodes that are gone) and the job would never end."""
    master = make_cluster(HELD, work=False)
    worker = make_cluster(HELD)
    state = _landing_then_failing(worker, 2)
    run = in_thread(lambda: master.launch("ledger", {"run": 4}))
    run["thread"].join(timeout=30)
    assert not run["thread"].is_alive(), "partitions claimed by a failed claim never ran"
    assert state["landed"], "no claim landed and failed"
    assert run["result"].status is BatchStatus.COMPLETED, run["result"].exit_status
    with backend.engine.connect() as conn:
        ran = conn.execute(
            select(ledger.c.step_execution_id).where(ledger.c.job_execution_id == run["result"].id)
        ).all()
    assert len(ran) == len({r.step_execution_id for r in ran}) == 4


def test_a_claim_whose_read_back_is_refused_too_still_withdraws(
    backend: Backend, make_cluster
) -> None:
    """A claim that fails on a statement the database refuses as it is, whose read back (what
    it may have won) is refused too: the read back says so once and gives up (only the
    database's passing trouble is waited out), so the node still withdraws and the job whose
    only node it is ends instead of waiting on a poller that waits for ever."""
    settings = FAST_SETTINGS.with_overrides(no_node_timeout=1500)
    master = make_cluster(settings, work=False)
    worker = make_cluster(settings)
    state = _break_claims(worker)
    store = worker.node.store
    refused: list[int] = []

    def read_refused(*args: Any, **kwargs: Any) -> Any:
        refused.append(1)
        raise ProgrammingError(
            "SELECT ... FROM batch_partitions", {}, Exception('column "attempt" does not exist')
        )

    # The read back of a failed claim, by either name it has had.
    for name in ("read_back", "claimed_by"):
        setattr(store, name, read_refused)
    run = in_thread(lambda: master.launch("ledger", {"run": 6}))
    run["thread"].join(timeout=30)
    assert not run["thread"].is_alive(), "the node's poller waits for ever on its read back"
    assert state["failed"] >= CLAIM_FAILURES_TO_WITHDRAW
    assert refused, "no read back was tried"
    assert run["result"].status is BatchStatus.FAILED
    assert worker.node.worker.withdrawn is not None


def _a_partition(backend: Backend, make_cluster) -> tuple[Cluster, Any]:
    """A node, and a claim of one partition as a claim reads it back (not run by anyone)."""
    from dbcluster.cluster.store import ClaimedPartition, PendingPartition

    cluster = make_cluster(HELD)
    partition = PendingPartition(
        step_execution_id=987_654,
        job_execution_id=1,
        master_step_execution_id=2,
        partition_name="p-1",
        attempt=3,
        transferable=True,
        worker_step_name="ledger.worker",
    )
    return cluster, ClaimedPartition(partition, {})  # type: ignore[arg-type]


def test_two_read_backs_at_once_never_both_take_a_partition(backend: Backend, make_cluster) -> None:
    """Two threads taking the same claimed partition at once (a slot's read back and the
    poller's, both finding what one landed claim won): exactly one holds it."""
    cluster, won = _a_partition(backend, make_cluster)
    executor = cluster.node.worker.executor
    identity = cluster.node.identity
    real = executor.claimed.step_execution
    both_in = threading.Barrier(2, timeout=5)

    def step_execution(claimed: Any) -> Any:
        try:
            both_in.wait()  # the other thread gets as far as it can meanwhile
        except threading.BrokenBarrierError:
            pass
        return None if claimed is won else real(claimed)

    executor.claimed.step_execution = step_execution  # type: ignore[method-assign]
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(executor.take(identity, [won])))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    try:
        assert sorted(len(r) for r in results) == [0, 1], results
    finally:
        for taken in results:
            for task in taken:
                executor._forget(task)


def test_a_claim_read_back_before_its_partition_ended_does_not_run_it_again(
    backend: Backend, make_cluster
) -> None:
    """A read back whose rows were read before this node ended one of them (the partition and
    its attempt) takes nothing: it ran. A claim that just won it (not read back: SQLite may
    hand a pruned partition's id out again), or a read back of its next attempt, takes it."""
    from dbcluster.cluster.store import ClaimedPartition

    cluster, won = _a_partition(backend, make_cluster)
    executor = cluster.node.worker.executor
    identity = cluster.node.identity
    executor.claimed.step_execution = lambda claimed: None  # type: ignore[method-assign]
    [task] = executor.take(identity, [won])
    executor._forget(task)
    assert executor.take(identity, [won], read_back=True) == []
    again = ClaimedPartition(replace(won.partition, attempt=won.partition.attempt + 1), {})
    for claimed, read_back in ((won, False), (again, True)):
        [task] = executor.take(identity, [claimed], read_back=read_back)
        executor._forget(task)
    # One claim naming a partition twice holds it once.
    [task] = executor.take(identity, [again, again])
    executor._forget(task)


def test_a_landed_claim_that_cannot_be_read_back_gives_its_partitions_to_their_master(
    backend: Backend, make_cluster
) -> None:
    """A claim that landed and then failed on something other than the database's passing
    trouble (reading its rows after its commit), whose read back fails the same way: the node
    cannot tell what it holds, so it gives that id up (one ERROR), the old id is removed and
    the master recovers its partitions; the job completes. Left alone (the read back's ERROR
    and nothing more), they stayed CLAIMED on a live node and the job never ended."""
    master = make_cluster(FAST_SETTINGS, work=False)
    broken = make_cluster(FAST_SETTINGS)
    make_cluster(FAST_SETTINGS)
    old_id = broken.node.node_id
    state = _landing_then_failing(broken, 1, error=TypeError("'NoneType' object is not iterable"))
    store = broken.node.store

    def read_refused(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("'NoneType' object is not iterable")

    store.read_back = read_refused  # type: ignore[method-assign]
    recorder = record_events(broken.node)
    run = in_thread(lambda: master.launch("ledger", {"run": 7}))
    run["thread"].join(timeout=60)
    assert not run["thread"].is_alive(), "partitions of a landed claim stayed CLAIMED"
    assert state["landed"], "no claim landed and failed"
    assert run["result"].status is BatchStatus.COMPLETED, run["result"].exit_status
    fenced = [e for e in recorder.named("fenced") if e["node_id"] == old_id]
    assert fenced and "could not read back" in fenced[0]["reason"], recorder.named("fenced")
    with backend.engine.connect() as conn:
        ran = conn.execute(
            select(ledger.c.partition_name).where(ledger.c.job_execution_id == run["result"].id)
        ).all()
        placed = conn.execute(
            select(partitions.c.step_execution_id).where(
                partitions.c.job_execution_id == run["result"].id
            )
        ).all()
    assert placed and len(ran) == len({r.partition_name for r in ran}) == len(placed)
