"""A slot hands itself on: a partition's final write claims the node's next partition in the same
statement (PostgreSQL, where the final write is one statement; see ``QueryProvider.fold_guard``).

The statement-level tests build the rows with the provider suite's helpers and run one final
write by hand, as a worker's fence does; the cluster test drains a job through one slot.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import select, text

from dbcluster.batch.dao.statements import UPDATE_STEP
from dbcluster.batch.domain import utcnow
from dbcluster.batch.fence import FencedError
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.fencing import PartitionFence
from dbcluster.schema import nodes, partitions, step_execution
from dbcluster.testing.app import FAST_SETTINGS, build_registry, ledger
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import lose_commit_acks, result_sizes
from dbcluster.testing.suite.provider_helpers import _place, _register, _store
from dbcluster.testing.waiting import in_thread, wait_for

NODE = "hand-on-node"
#: Where a partition's final write is one statement (writable CTEs): PostgreSQL.
FOLDS = pytest.mark.backends("postgresql")


def _claim_first(store: Any, ids: list[int]) -> int:
    won = store.claim(NODE, 1, [ids[0]], utcnow())
    assert [w.partition.step_execution_id for w in won] == [ids[0]]
    return won[0].partition.attempt


def _ending(
    engine: Any, store: Any, sid: int, attempt: int, following: int | None
) -> tuple[JobRepository, Any, PartitionFence, Any]:
    """Partition ``sid`` COMPLETED under its fence, which asks to claim ``following`` next:
    the repository, the step execution, the fence and its folded guard."""
    repository = JobRepository(engine)
    se = repository.get_step_execution(sid)
    assert se is not None
    fence = PartitionFence(
        store,
        sid,
        NODE,
        attempt,
        transferable=True,
        fenced=threading.Event(),
        stopping=lambda: False,
        next_partition=lambda: following,
    )
    se.fence = fence
    se.status = BatchStatus.COMPLETED
    se.end_time = utcnow()
    guard = fence.finish_guard(se)
    assert guard is not None and guard.then_params is not None
    return repository, se, fence, guard


def _final_write(
    engine: Any, store: Any, sid: int, attempt: int, following: int | None
) -> PartitionFence:
    """The final write of partition ``sid`` (COMPLETED) under its fence, asking to claim
    ``following`` next, committed."""
    repository, se, fence, guard = _ending(engine, store, sid, attempt, following)
    with engine.begin() as conn:
        repository.update_step_execution(se, conn, guard=guard)
        guard.done()
    return fence


def _state(engine: Any, sid: int) -> tuple[str, str | None, int, str]:
    with engine.connect() as conn:
        row = conn.execute(
            select(
                partitions.c.status,
                partitions.c.assigned_node,
                partitions.c.attempt,
                step_execution.c.status.label("step_status"),
            )
            .join(
                step_execution,
                step_execution.c.step_execution_id == partitions.c.step_execution_id,
            )
            .where(partitions.c.step_execution_id == sid)
        ).one()
    return row.status, row.assigned_node, row.attempt, row.step_status


def _setup(backend: Backend) -> tuple[Any, list[int], int]:
    engine, provider = backend.engine, backend.provider
    store = _store(engine, provider)
    _register(engine, provider, NODE)
    _, ids = _place(engine, provider, NODE, count=2)
    return store, ids, _claim_first(store, ids)


@FOLDS
def test_the_final_write_claims_the_next_partition_in_its_commit(backend: Backend) -> None:
    store, (first, second), attempt = _setup(backend)
    fence = _final_write(backend.engine, store, first, attempt, second)
    assert fence.outcome == "COMPLETED"
    assert _state(backend.engine, first)[0] == "COMPLETED"
    assert _state(backend.engine, second) == ("CLAIMED", NODE, 1, "STARTED")
    won = store.claimed_next(fence.next_claim)
    assert won is not None and won.partition.step_execution_id == second
    assert won.partition.worker_step_name == "suite.worker"
    assert won.row["status"] == "STARTED"


@FOLDS
def test_it_claims_nothing_another_node_claimed_first(backend: Backend) -> None:
    store, (first, second), attempt = _setup(backend)
    _register(backend.engine, backend.provider, "other-node")
    assert store.claim("other-node", 1, [second], utcnow())
    fence = _final_write(backend.engine, store, first, attempt, second)
    assert fence.outcome == "COMPLETED"
    assert store.claimed_next(fence.next_claim) is None
    assert _state(backend.engine, second)[:2] == ("CLAIMED", "other-node")


@FOLDS
def test_a_refused_final_write_claims_nothing(backend: Backend) -> None:
    store, (first, second), attempt = _setup(backend)
    # The partition moved (its node was fenced, say): the guard refuses, nothing commits.
    with backend.engine.begin() as conn:
        conn.execute(
            partitions.update()
            .where(partitions.c.step_execution_id == first)
            .values(attempt=partitions.c.attempt + 1, status="PENDING")
        )
    with pytest.raises(FencedError):
        _final_write(backend.engine, store, first, attempt, second)
    assert _state(backend.engine, second) == ("PENDING", NODE, 1, "STARTING")


@FOLDS
def test_it_waits_for_no_update_of_the_node_row(backend: Backend) -> None:
    """A heartbeat, or a sweep marking the node UNREACHABLE, holds the node's row while it
    updates it: the claim neither waits for it nor skips because of it (a lock that did, ``FOR
    SHARE``, would claim nothing here, or hold up every heartbeat of the node)."""
    store, (first, second), attempt = _setup(backend)
    with backend.engine.connect() as holder:
        holder.execute(nodes.update().where(nodes.c.node_id == NODE).values(current_load=3))
        fence = _final_write(backend.engine, store, first, attempt, second)
        holder.rollback()
    assert store.claimed_next(fence.next_claim) is not None
    assert _state(backend.engine, second)[:2] == ("CLAIMED", NODE)


@FOLDS
def test_a_node_row_being_deleted_is_skipped_without_waiting(backend: Backend) -> None:
    """A removal deleting the node's row: the final write commits at once, claims nothing."""
    store, (first, second), attempt = _setup(backend)
    with backend.engine.connect() as remover:
        remover.begin()
        remover.execute(nodes.delete().where(nodes.c.node_id == NODE))
        done = threading.Event()
        result: dict[str, Any] = {}

        def write() -> None:
            result["fence"] = _final_write(backend.engine, store, first, attempt, second)
            done.set()

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        assert done.wait(10), "the final write waited for the removal's lock"
        remover.rollback()
    assert result["fence"].outcome == "COMPLETED"
    assert store.claimed_next(result["fence"].next_claim) is None
    assert _state(backend.engine, second) == ("PENDING", NODE, 1, "STARTING")


@FOLDS
def test_a_node_that_is_gone_claims_nothing(backend: Backend) -> None:
    store, (first, second), attempt = _setup(backend)
    with backend.engine.begin() as conn:
        conn.execute(nodes.delete().where(nodes.c.node_id == NODE))
    fence = _final_write(backend.engine, store, first, attempt, second)
    assert store.claimed_next(fence.next_claim) is None
    assert _state(backend.engine, second)[0] == "PENDING"


@FOLDS
def test_the_hot_statement_is_not_parsed_by_the_driver_on_every_execution(
    backend: Backend,
) -> None:
    """psycopg parses the ``%(name)s`` placeholders of a statement longer than 4,096
    characters on every execution (its cache's bound); the final write of a tasklet partition
    with the claim of the next one (over 4 KB with its refusal) runs prebuilt, sent with the
    server's own placeholders, which the driver passes on as they are."""
    from dbcluster.prebuilt import Prebuilt

    provider = backend.provider
    store = _store(backend.engine, provider)
    guard = store.end_partition_statement("COMPLETED")
    statement = provider.fold_guard(guard, UPDATE_STEP, None, claim_next=True)
    built = Prebuilt.build(statement, backend.engine.dialect)
    assert built is not None and built.raw is not None
    raw_sql = built.raw[1]
    assert "%(" not in raw_sql and "$1" in raw_sql
    assert "FOR KEY SHARE SKIP LOCKED" in raw_sql


def test_a_slot_runs_the_partitions_it_claimed_one_after_another(
    backend: Backend, make_cluster: Any
) -> None:
    """One slot, eight partitions: after the first claim, each final write claims the next,
    so the poller claims only at the start (where the final write is one statement; elsewhere
    the poller claims each); every partition completes once."""
    # Grouped commits off: a groupable step's partitions do not hand their slot on.
    settings = FAST_SETTINGS.with_overrides(concurrency_limit=1, commit_group_size=1)
    registry = build_registry(per_node=8)
    master = make_cluster(settings, work=False, registry=registry)
    worker = make_cluster(settings, registry=registry)
    claims = result_sizes(worker.node, "claim")
    execution = master.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        rows = conn.execute(
            select(partitions.c.status, partitions.c.attempt).where(
                partitions.c.job_execution_id == execution.id
            )
        ).all()
        written = conn.execute(
            select(ledger.c.partition_name).where(ledger.c.job_execution_id == execution.id)
        ).all()
    assert len(rows) == 8 and {(r.status, r.attempt) for r in rows} == {("COMPLETED", 1)}
    assert len(written) == 8 and len({r.partition_name for r in written}) == 8
    if worker.repository.folds_guards:
        assert sum(claims) <= 2, f"the poller claimed {claims}: the slot did not hand itself on"
    else:  # the final write is statements of its own: each partition is claimed by the poller
        assert sum(claims) == 8, claims


def test_a_final_write_whose_commit_acknowledgement_is_lost_runs_what_it_claimed(
    backend: Backend, make_cluster: Any
) -> None:
    """The COMMIT that ended a partition and claimed the next landed, but the node did not hear
    so: it judges the commit from the step's version, and the slot still runs the partition that
    commit claimed (left CLAIMED and unrun, it would hold the job up until the node leaves)."""
    # Grouped commits off: a groupable step's partitions do not hand their slot on.
    settings = FAST_SETTINGS.with_overrides(concurrency_limit=1, commit_group_size=1)
    registry = build_registry(per_node=6)
    master = make_cluster(settings, work=False, registry=registry)
    worker = make_cluster(settings, registry=registry)
    lost = lose_commit_acks(
        worker.node.work_engine, times=2, when=lambda sql: any("dbc_nn" in s for s in sql)
    )
    run = in_thread(lambda: master.launch("ledger", {"run": 5}))
    run["thread"].join(60)
    assert not run["thread"].is_alive(), "the job did not end"
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert lost.count == (2 if worker.repository.folds_guards else 0)
    with backend.engine.connect() as conn:
        written = conn.execute(
            select(ledger.c.partition_name).where(ledger.c.job_execution_id == execution.id)
        ).all()
    assert len(written) == 6 and len({r.partition_name for r in written}) == 6


def _open_final_write(engine: Any, store: Any, sid: int, attempt: int, following: int) -> Any:
    """Partition ``sid``'s final write claiming ``following``, run but not committed: the
    transaction (its connection) is returned open."""
    repository, se, fence, guard = _ending(engine, store, sid, attempt, following)
    conn = engine.connect()
    conn.begin()
    repository.update_step_execution(se, conn, guard=guard)
    assert store.claimed_next(fence.next_claim) is not None
    return conn


def _waiting_on_a_lock(engine: Any) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            ).scalar_one()
        )


@FOLDS
@pytest.mark.parametrize("how", ["removed", "leaving"])
def test_a_node_removed_or_leaving_meanwhile_fences_what_the_final_write_claimed(
    backend: Backend, how: str
) -> None:
    """The final write claimed the next partition and has not committed when the node is
    removed (a sweep) or leaves (deregisters): the removal waits for that COMMIT and fences the
    partition it claimed as well (its next attempt), so a removed node commits nothing more for
    it. (Marking the node REMOVING does not wait for the final write's lock on the node's row:
    without the removal's own lock of the row, its fencing UPDATE missed that partition.)"""
    store, (first, second), attempt = _setup(backend)
    engine = backend.engine
    if how == "removed":
        with engine.begin() as conn:
            conn.execute(
                nodes.update()
                .where(nodes.c.node_id == NODE)
                .values(status="UNREACHABLE", last_heartbeat=datetime(2000, 1, 1))
            )
    writer = _open_final_write(engine, store, first, attempt, second)
    try:
        if how == "removed":
            remover = in_thread(lambda: store.sweep(1000, 2000))
        else:
            remover = in_thread(lambda: store.deregister(NODE))
        wait_for(lambda: _waiting_on_a_lock(engine), what="the removal to wait on a lock")
        writer.commit()
    finally:
        writer.close()
    remover["thread"].join(30)
    assert not remover["thread"].is_alive()
    with engine.connect() as conn:
        assert conn.execute(select(nodes).where(nodes.c.node_id == NODE)).first() is None
    status, node, second_attempt, _ = _state(engine, second)
    assert second_attempt == 2, (
        f"the partition the final write claimed is {status} at attempt {second_attempt} on "
        f"{node}: the removal did not fence it"
    )
