"""The provider contract's guarded transitions (claims, bulk creation, fencing, transfers,
stranded masters), against a live database. Collected through ``test_provider``, which imports
them, so that ``from dbcluster.testing.suite.test_provider import *`` brings every test."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.exc import DBAPIError

from dbcluster import schema
from dbcluster.batch.repository import JobRepository
from dbcluster.dialects.base import QueryProvider
from dbcluster.schema import job_coordination, nodes, partitions
from dbcluster.testing.suite.provider_helpers import (
    _job,
    _lost_race,
    _naive,
    _now,
    _partition,
    _place,
    _provider,
    _register,
    _rowcount,
    _store,
)

__all__ = [
    "test_claim_changes_one_row_only_under_its_guard",
    "test_a_placed_guard_takes_a_pending_partition_only_under_its_node_and_attempt",
    "test_concurrent_claims_exactly_one_wins",
    "test_batched_claims_split_the_partitions_between_concurrent_claimers",
    "test_bulk_creation_writes_what_row_by_row_writes",
    "test_bulk_creation_refuses_what_row_by_row_refuses",
    "test_a_claim_in_one_statement_gives_what_four_give",
    "test_a_claim_passes_over_a_partition_another_transaction_holds",
    "test_a_poll_offers_own_partitions_and_those_it_may_steal",
    "test_a_node_leaving_fences_what_it_still_has_claimed",
    "test_reassignment_fences_the_previous_attempt",
    "test_a_held_partition_serializes_its_transfer",
    "test_orphans_and_stranded_masters_do_not_need_the_dead_node_row",
    "test_concurrent_stranded_master_claims_exactly_one_wins",
]


# --- guarded transitions --------------------------------------------------------------------------


def test_claim_changes_one_row_only_under_its_guard(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _, (sid, other) = _place(engine, provider, "suite-n1")
    assert _rowcount(engine, provider.claim_partition(sid, "suite-n2", 1)) == 0, "wrong node"
    assert _rowcount(engine, provider.claim_partition(sid, "suite-n1", 2)) == 0, "wrong attempt"
    assert _rowcount(engine, provider.claim_partition(sid, "suite-n1", 1)) == 1
    assert _rowcount(engine, provider.claim_partition(sid, "suite-n1", 1)) == 0, "claimed twice"
    assert _partition(engine, other).status == "PENDING", "a claim changed another partition"
    assert _rowcount(engine, provider.finish_partition(sid, "suite-n2", 1, "COMPLETED")) == 0
    assert _rowcount(engine, provider.finish_partition(sid, "suite-n1", 1, "COMPLETED")) == 1
    assert _rowcount(engine, provider.finish_partition(sid, "suite-n1", 1, "FAILED")) == 0, (
        "a finished partition was finished again"
    )
    assert _partition(engine, sid).status == "COMPLETED"


def test_a_placed_guard_takes_a_pending_partition_only_under_its_node_and_attempt(
    dbc_backend: Any,
) -> None:
    """A partition run before it was claimed (``placed=True``, cluster/placed.py): its hold
    takes it from PENDING (CLAIMED after), then holds it CLAIMED, and its end finishes it; under
    another node or attempt, or once the node is no longer registered, nothing changes; a plain
    guard still wants CLAIMED."""
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-n1", "suite-n2")
    _, (sid, other) = _place(engine, provider, "suite-n1", count=2)
    assert _rowcount(engine, provider.hold_partition(sid, "suite-n1", 1)) == 0, "not CLAIMED"
    assert _rowcount(engine, provider.hold_partition(sid, "suite-n2", 1, placed=True)) == 0
    assert _rowcount(engine, provider.hold_partition(sid, "suite-n1", 2, placed=True)) == 0
    assert _rowcount(engine, provider.hold_partition(sid, "suite-n1", 1, placed=True)) == 1
    assert _partition(engine, sid).status == "CLAIMED"
    assert _rowcount(engine, provider.hold_partition(sid, "suite-n1", 1, placed=True)) == 1
    done = provider.finish_partition(sid, "suite-n1", 1, "COMPLETED", placed=True)
    assert _rowcount(engine, done) == 1
    assert _rowcount(engine, provider.hold_partition(sid, "suite-n1", 1, placed=True)) == 0
    assert _partition(engine, sid).status == "COMPLETED"
    # From PENDING straight to its end, or back for another try under the next attempt.
    failed = provider.finish_partition(other, "suite-n1", 1, "FAILED", placed=True)
    assert _rowcount(engine, provider.retry_partition(other, "suite-n2", 1, placed=True)) == 0
    assert _rowcount(engine, provider.retry_partition(other, "suite-n1", 1, placed=True)) == 1
    assert _rowcount(engine, failed) == 0, "the retried partition's old attempt finished it"
    row = _partition(engine, other)
    assert (row.status, row.attempt) == ("PENDING", 2)
    # A removed node's PENDING partitions keep their attempt: its guard needs its own row.
    _, (gone,) = _place(engine, provider, "suite-n2", count=1)
    with engine.begin() as conn:
        assert conn.execute(provider.deregister_node("suite-n2")).rowcount == 1
    assert _rowcount(engine, provider.hold_partition(gone, "suite-n2", 1, placed=True)) == 0
    assert _rowcount(engine, provider.claim_partition(gone, "suite-n2", 1, placed=True)) == 0
    assert _rowcount(engine, provider.claim_partition(gone, "suite-n2", 1)) == 1, (
        "a plain claim reads no node row (the store locks it first)"
    )


def test_concurrent_claims_exactly_one_wins(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _, ids = _place(engine, provider, "suite-n1", count=4)
    contenders = 4
    for sid in ids:
        barrier = threading.Barrier(contenders)
        won: list[int] = []
        errors: list[BaseException] = []

        def claim(
            sid: int = sid,
            barrier: threading.Barrier = barrier,
            won: list[int] = won,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait(5)
                with engine.begin() as conn:
                    won.append(conn.execute(provider.claim_partition(sid, "suite-n1", 1)).rowcount)
            except Exception as exc:  # noqa: BLE001 - a lock conflict counts as a lost race
                if not _lost_race(provider, exc):
                    errors.append(exc)

        threads = [threading.Thread(target=claim) for _ in range(contenders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert sum(won) == 1, f"{sum(won)} concurrent claims of one partition succeeded"


def test_batched_claims_split_the_partitions_between_concurrent_claimers(
    dbc_backend: Any,
) -> None:
    """Four nodes claim the same eight PENDING partitions at once, each in one transaction: every
    partition is won by exactly one of them, and its step execution is STARTED exactly once, in
    the claim's transaction."""

    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    claimers = [f"suite-c{i}" for i in range(4)]
    _register(engine, provider, *claimers)
    _, ids = _place(engine, provider, claimers[0], count=8)
    store = _store(engine, provider, retries=20, backoff_s=0.01)
    barrier = threading.Barrier(len(claimers))
    won: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    started_at = datetime.now(UTC).replace(tzinfo=None)

    def claim(node_id: str) -> None:
        try:
            barrier.wait(5)
            claimed = store.claim(node_id, 0, ids, started_at)
            won[node_id] = [c.partition.step_execution_id for c in claimed]
            for c in claimed:
                assert c.row["status"] == "STARTED" and int(c.row["version"]) == 1, dict(c.row)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(node_id,)) for node_id in claimers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    claimed = [sid for got in won.values() for sid in got]
    assert sorted(claimed) == sorted(ids), f"claims overlap or missed partitions: {won}"
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                partitions.c.assigned_node,
                partitions.c.status,
                schema.step_execution.c.status,
                schema.step_execution.c.version,
            )
            .join(
                schema.step_execution,
                schema.step_execution.c.step_execution_id == partitions.c.step_execution_id,
            )
            .where(partitions.c.step_execution_id.in_(ids))
        ).all()
    assert all(r[1] == "CLAIMED" and r[2] == "STARTED" and r[3] == 1 for r in rows), rows
    owners = {sid: node for node, got in won.items() for sid in got}
    assert {r[0] for r in rows} == set(owners.values())


class _FourStatements:
    """A provider as it is, except that it has no one-statement claim (a claim is then a
    transaction of five statements)."""

    def __init__(self, provider: QueryProvider) -> None:
        self._provider = provider

    def claim_and_start(self, *args: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)


class _NoArrays:
    """A provider as it is, except that it inserts many rows by executemany."""

    def __init__(self, provider: QueryProvider) -> None:
        self._provider = provider

    def insert_from_arrays(self, *args: Any) -> None:
        return None

    def insert_partitions_from_arrays(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)


def test_bulk_creation_writes_what_row_by_row_writes(dbc_backend: Any) -> None:
    """Where the provider inserts many rows from arrays (:meth:`QueryProvider.insert_from_arrays`),
    a placement's step executions, contexts and partition rows are what an executemany writes:
    each step execution under the id it was returned with, NULLs and booleans kept."""
    from dbcluster.batch.context import ExecutionContext

    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    paths = {"executemany": _NoArrays(provider)}
    if provider.insert_from_arrays(partitions, ["partition_name"]) is not None:
        paths["arrays"] = provider
    seen: dict[str, Any] = {}
    long_text = "x" * (schema.SHORT_CONTEXT_LENGTH + 10)
    for name, chosen in paths.items():
        repository = JobRepository(engine)
        if name == "executemany":
            repository.combined.bulk_inserts = None
        job_id, _, master_id = _job(engine, 0)
        execution = repository.get_job_execution(job_id)
        assert execution is not None
        contexts = [ExecutionContext({"i": i}) for i in range(3)]
        contexts[2].put("long", long_text)
        created = repository.create_step_executions(
            execution, [(f"suite.worker:b{i}", ctx) for i, ctx in enumerate(contexts)]
        )
        ids = [se.id for se in created]
        for se, i in zip(created, range(3), strict=True):
            loaded = repository.get_step_execution(se.id)
            assert loaded is not None and loaded.step_name == f"suite.worker:b{i}"
            assert loaded.execution_context.get("i") == i
        assert repository.get_step_execution(ids[2]).execution_context.get("long") == long_text
        store = _store(engine, chosen)
        rows = [
            {
                "step_execution_id": sid,
                "job_execution_id": job_id,
                "master_step_execution_id": master_id,
                "partition_name": f"b{i}",
                "assigned_node": "suite-bulk" if i else None,
                "transferable": bool(i % 2),
                "max_attempts": i + 1,
                "trace_context": f"00-{i}" if i == 2 else None,
            }
            for i, sid in enumerate(ids)
        ]
        with engine.begin() as conn:
            store.insert_partitions(conn, rows)
        stored = [_partition(engine, sid) for sid in ids]
        seen[name] = [
            (
                r.partition_name,
                r.assigned_node,
                r.transferable,
                r.max_attempts,
                r.trace_context,
                r.status,
                r.attempt,
            )
            for r in stored
        ]
        assert all(r.created_time is not None and r.last_updated is not None for r in stored)
    assert seen["executemany"] == [
        ("b0", None, False, 1, None, "PENDING", 1),
        ("b1", "suite-bulk", True, 2, None, "PENDING", 1),
        ("b2", "suite-bulk", False, 3, "00-2", "PENDING", 1),
    ]
    assert len(set(map(repr, seen.values()))) == 1, seen


def test_bulk_creation_refuses_what_row_by_row_refuses(dbc_backend: Any) -> None:
    """A partition name longer than its column fails a placement from arrays as it fails an
    executemany (where the database enforces lengths), instead of being cut to fit."""
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    too_long = "p" * (partitions.c.partition_name.type.length + 20)  # type: ignore[attr-defined]
    outcomes = {}
    for name, chosen in {"executemany": _NoArrays(provider), "arrays": provider}.items():
        job_id, ids, master_id = _job(engine, 2)
        rows = [
            {
                "step_execution_id": sid,
                "job_execution_id": job_id,
                "master_step_execution_id": master_id,
                "partition_name": f"{too_long}{i}",
                "assigned_node": "suite-long",
                "transferable": True,
                "max_attempts": 1,
                "trace_context": None,
            }
            for i, sid in enumerate(ids)
        ]
        try:
            with engine.begin() as conn:
                _store(engine, chosen).insert_partitions(conn, rows)
        except DBAPIError as error:
            outcomes[name] = f"refused ({type(error).__name__})"
        else:
            stored = {_partition(engine, sid).partition_name for sid in ids}
            outcomes[name] = (
                "stored whole"
                if stored == {r["partition_name"] for r in rows}
                else (f"stored cut: {sorted(len(n) for n in stored)}")
            )
    assert outcomes["arrays"] == outcomes["executemany"], outcomes


def test_a_claim_in_one_statement_gives_what_four_give(dbc_backend: Any) -> None:
    """Where the provider claims in one statement (:meth:`QueryProvider.claim_and_start`), the
    claim writes and returns exactly what the five statements of the other path do, and a node
    no longer registered claims nothing on either path."""
    from dbcluster.cluster.store import NodeRemovedError

    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    stores = {"five": _store(engine, _FourStatements(provider))}  # type: ignore[arg-type]
    if provider.claim_and_start(1, [1], None, 0) is not None:
        stores["one"] = _store(engine, provider)
    _register(engine, provider, "suite-me")
    started_at = datetime(2026, 1, 2, 3, 4, 5, 678000)
    seen = {}
    for name, store in stores.items():
        _, ids = _place(engine, provider, "suite-me", count=2)
        claimed = store.claim("suite-me", 1, [*ids, ids[0]], started_at)
        assert [c.partition.step_execution_id for c in claimed] == ids
        assert [c.partition.partition_name for c in claimed] == ["p0", "p1"]
        assert {c.partition.worker_step_name for c in claimed} == {"suite.worker"}
        rows = [dict(c.row) for c in claimed]
        for row in rows:
            assert (row["status"], row["exit_code"], int(row["version"])) == (
                "STARTED",
                "EXECUTING",
                1,
            ), row
            assert _naive(row["start_time"]) == started_at, row
        seen[name] = {k for row in rows for k in row} - {"dbc_node"}
        assert store.claim("suite-me", 1, ids, started_at) == [], "claimed twice"
        with engine.connect() as conn:
            stored = conn.execute(
                select(schema.step_execution.c.status, schema.step_execution.c.version).where(
                    schema.step_execution.c.step_execution_id.in_(ids)
                )
            ).all()
        assert sorted(tuple(r) for r in stored) == [("STARTED", 1), ("STARTED", 1)]
        assert {_partition(engine, sid).status for sid in ids} == {"CLAIMED"}
        _, unclaimed = _place(engine, provider, "suite-me", count=1)
        with pytest.raises(NodeRemovedError):
            store.claim("suite-unregistered", 0, unclaimed, started_at)
        assert _partition(engine, unclaimed[0]).status == "PENDING"
    assert len({frozenset(keys) for keys in seen.values()}) == 1, seen


def test_a_claim_passes_over_a_partition_another_transaction_holds(dbc_backend: Any) -> None:
    """A partition row another transaction holds (its master failing it) is skipped without
    waiting where the database can skip locked rows, else claimed only as that transaction
    leaves it (here: not at all); its step execution is never started."""

    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-me")
    _, (held, free) = _place(engine, provider, "suite-me", count=2)
    store = _store(engine, provider)
    result: dict[str, Any] = {}
    started_at = datetime.now(UTC).replace(tzinfo=None)
    thread = threading.Thread(
        target=lambda: result.update(won=store.claim("suite-me", 0, [held, free], started_at)),
        daemon=True,
    )
    with engine.begin() as holder:
        failed = holder.execute(
            update(partitions).where(partitions.c.step_execution_id == held).values(status="FAILED")
        )
        assert failed.rowcount == 1
        thread.start()
        if provider.skip_locked():
            thread.join(5)
            assert not thread.is_alive(), "the claim waited for a row another transaction holds"
    thread.join(30)
    assert [c.partition.step_execution_id for c in result["won"]] == [free]
    with engine.connect() as conn:
        status = conn.execute(
            select(schema.step_execution.c.status).where(
                schema.step_execution.c.step_execution_id == held
            )
        ).scalar_one()
    assert status != "STARTED" and _partition(engine, held).status == "FAILED"


def test_a_poll_offers_own_partitions_and_those_it_may_steal(dbc_backend: Any) -> None:
    """A node may claim its own PENDING partitions, at once those of a node silent past the
    unreachable threshold (or gone), those of a live node once they waited the stealing delay,
    and never one handed back to its master (no node)."""
    from dbcluster.cluster.store import CoordinationStore

    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-me", "suite-busy", "suite-silent")
    _, (mine,) = _place(engine, provider, "suite-me", count=1)
    _, (busy,) = _place(engine, provider, "suite-busy", count=1)
    _, (silent,) = _place(engine, provider, "suite-silent", count=1)
    _, (gone,) = _place(engine, provider, "suite-gone", count=1)
    _, (handed,) = _place(engine, provider, "suite-me", count=1)
    now = _naive(_now(engine, provider))
    with engine.begin() as conn:
        conn.execute(
            update(nodes)
            .where(nodes.c.node_id == "suite-silent")
            .values(last_heartbeat=now - timedelta(seconds=5))
        )
        conn.execute(
            update(partitions)
            .where(partitions.c.step_execution_id == handed)
            .values(assigned_node=None)
        )
    store = CoordinationStore(engine, provider)
    ours = {mine, busy, silent, gone, handed}

    def poll(**kwargs: Any) -> set[int]:
        return set(store.poll("suite-me", 50, **kwargs)) & ours

    assert poll() == {mine}, "without stealing a node sees only its own"
    assert poll(steal_after_ms=60_000, unreachable_ms=2000) == {mine, silent, gone}
    with engine.begin() as conn:
        conn.execute(
            update(partitions)
            .where(partitions.c.step_execution_id == busy)
            .values(last_updated=now - timedelta(seconds=5))
        )
    assert poll(steal_after_ms=2000, unreachable_ms=2000) == {mine, busy, silent, gone}
    # What a poll offers, a claim takes (the handed-back one stays with its master).
    started_at = datetime.now(UTC).replace(tzinfo=None)
    claimed = store.claim("suite-me", 0, sorted(ours), started_at)
    assert {c.partition.step_execution_id for c in claimed} == {mine, busy, silent, gone}
    assert _partition(engine, handed).assigned_node is None


def test_a_node_leaving_fences_what_it_still_has_claimed(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-leaving")
    _, (claimed, unclaimed) = _place(engine, provider, "suite-leaving")
    assert _rowcount(engine, provider.claim_partition(claimed, "suite-leaving", 1)) == 1
    with engine.begin() as conn:
        assert conn.execute(provider.touch_node("suite-leaving", 0)).rowcount == 1
        assert conn.execute(provider.fence_claims_of("suite-leaving")).rowcount == 1
        assert conn.execute(provider.deregister_node("suite-leaving")).rowcount == 1
    row = _partition(engine, claimed)
    assert (row.attempt, row.status) == (2, "CLAIMED"), "a leaving node's claim kept its attempt"
    assert _partition(engine, unclaimed).attempt == 1


def test_reassignment_fences_the_previous_attempt(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-old", "suite-new")
    _, (sid, handed) = _place(engine, provider, "suite-old")
    assert _rowcount(engine, provider.claim_partition(sid, "suite-old", 1)) == 1
    assert _rowcount(engine, provider.hold_partition(sid, "suite-old", 1)) == 1, (
        "the fence must hold while the claim stands"
    )
    assert _rowcount(engine, provider.hold_partition(sid, "suite-other", 1)) == 0
    assert _rowcount(engine, provider.reassign_partition(sid, "suite-gone", 1, "suite-new")) == 0
    assert _rowcount(engine, provider.reassign_partition(sid, "suite-old", 1, "suite-new")) == 1
    row = _partition(engine, sid)
    assert (row.assigned_node, row.attempt, row.status) == ("suite-new", 1, "PENDING")
    for stmt in (
        provider.hold_partition(sid, "suite-old", 1),
        provider.finish_partition(sid, "suite-old", 1, "COMPLETED"),
        provider.claim_partition(sid, "suite-old", 1),
        provider.release_partition(sid, "suite-old", 1),
        provider.reassign_partition(sid, "suite-old", 1, "suite-other"),
        provider.fail_orphaned_partition(sid, "suite-old", 1),
    ):
        assert _rowcount(engine, stmt) == 0, (
            f"a late write of the old holder changed the row: {stmt}"
        )
    assert _rowcount(engine, provider.claim_partition(sid, "suite-new", 1)) == 1
    # A partition handed back before it ran: unassigned, next attempt.
    assert _rowcount(engine, provider.claim_partition(handed, "suite-old", 1)) == 1
    assert _rowcount(engine, provider.release_partition(handed, "suite-old", 1)) == 1
    row = _partition(engine, handed)
    assert (row.assigned_node, row.attempt, row.status) == (None, 2, "PENDING")
    assert _rowcount(engine, provider.reassign_partition(handed, None, 2, "suite-new")) == 1
    assert _rowcount(engine, provider.fail_orphaned_partition(handed, "suite-new", 2)) == 1
    assert _partition(engine, handed).status == "FAILED"


def test_a_held_partition_serializes_its_transfer(dbc_backend: Any) -> None:
    """The fence is a lock, not a read: while a worker's transaction holds its partition, a
    transfer waits for that COMMIT (then changes the row), and a worker that holds after a
    transfer committed changes nothing."""
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-w", "suite-x")
    _, (sid, _other) = _place(engine, provider, "suite-w")
    assert _rowcount(engine, provider.claim_partition(sid, "suite-w", 1)) == 1
    moved: list[int] = []
    errors: list[BaseException] = []

    def transfer() -> None:
        try:
            moved.append(
                _rowcount(engine, provider.reassign_partition(sid, "suite-w", 1, "suite-x"))
            )
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with engine.connect() as worker:
        with worker.begin():
            assert worker.execute(provider.hold_partition(sid, "suite-w", 1)).rowcount == 1
            thread = threading.Thread(target=transfer)
            thread.start()
            thread.join(0.5)
            assert thread.is_alive() and not moved, (
                "a transfer committed while a worker's transaction held the partition"
            )
        # The worker committed; the transfer goes through after it.
    thread.join(30)
    assert not errors, errors
    assert moved == [1]
    assert _rowcount(engine, provider.hold_partition(sid, "suite-w", 1)) == 0


def test_orphans_and_stranded_masters_do_not_need_the_dead_node_row(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-master", "suite-worker")
    job_id, ids = _place(engine, provider, "suite-worker")
    with engine.connect() as conn:
        master_id = (
            conn.execute(
                select(partitions.c.master_step_execution_id).where(
                    partitions.c.job_execution_id == job_id
                )
            )
            .scalars()
            .first()
        )
    with engine.begin() as conn:
        conn.execute(
            update(job_coordination)
            .where(job_coordination.c.job_execution_id == job_id)
            .values(master_node="suite-master")
        )

    def orphans() -> set[int]:
        with engine.connect() as conn:
            return {
                r.step_execution_id
                for r in conn.execute(provider.select_orphaned_partitions(master_id))
            }

    def stranded() -> set[int]:
        with engine.connect() as conn:
            return {r.job_execution_id for r in conn.execute(provider.select_stranded_masters())}

    assert orphans() == set() and job_id not in stranded()
    with engine.begin() as conn:  # the worker's row is pruned: its partitions are orphans
        conn.execute(delete(nodes).where(nodes.c.node_id == "suite-worker"))
    assert orphans() == set(ids)
    assert job_id not in stranded()
    with engine.begin() as conn:
        conn.execute(delete(nodes).where(nodes.c.node_id == "suite-master"))
    assert job_id in stranded()


def test_concurrent_stranded_master_claims_exactly_one_wins(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    job_id, _ = _place(engine, provider, "suite-lost-master")
    contenders = 4
    barrier = threading.Barrier(contenders)
    won: list[str] = []
    errors: list[BaseException] = []

    def claim(me: str) -> None:
        try:
            barrier.wait(5)
            with engine.begin() as conn:
                stmt = provider.claim_stranded_master(job_id, "suite-lost-master", 1, "STARTED", me)
                if conn.execute(stmt).rowcount == 1:
                    won.append(me)
        except Exception as exc:  # noqa: BLE001 - a lock conflict counts as a lost race
            if not _lost_race(provider, exc):
                errors.append(exc)

    threads = [threading.Thread(target=claim, args=(f"suite-s{i}",)) for i in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(won) == 1, f"{len(won)} survivors claimed one stranded job: {won}"
    with engine.connect() as conn:
        row = conn.execute(
            select(job_coordination).where(job_coordination.c.job_execution_id == job_id)
        ).one()
    assert (row.status, row.master_node, row.master_epoch) == ("RECOVERING", won[0], 2)
    with engine.begin() as conn:
        held = conn.execute(provider.hold_mastership(job_id, "suite-lost-master", 1)).rowcount
    assert held == 0, "the lost master's fence still holds after a survivor claimed the job"
