"""The provider contract, run for real on every reachable backend."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, insert, select, update

from dbcluster.dialects.base import (
    COORD_RECOVERING,
    COORD_STARTED,
    PARTITION_CLAIMED,
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_PENDING,
)
from dbcluster.schema import (
    job_coordination,
    job_execution,
    job_instance,
    nodes,
    partitions,
    step_execution,
)
from dbcluster.testing.backends import Backend


def db_now(backend: Backend) -> datetime:
    with backend.engine.connect() as conn:
        return conn.execute(backend.provider.select_now()).scalar_one()


def make_partitions(engine: Engine, provider, count: int, node: str) -> tuple[int, int, list[int]]:
    """A job execution, its master step and ``count`` PENDING partitions on ``node``."""
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        instance_id = conn.execute(
            insert(job_instance).values(version=0, job_name="j", job_key="k")
        ).inserted_primary_key[0]
        execution_id = conn.execute(
            insert(job_execution).values(
                version=0, job_instance_id=instance_id, create_time=now, status="STARTED"
            )
        ).inserted_primary_key[0]
        ids = []
        for i in range(count + 1):
            ids.append(
                conn.execute(
                    insert(step_execution).values(
                        version=0,
                        step_name=f"w:p{i}",
                        job_execution_id=execution_id,
                        create_time=now,
                        status="STARTING",
                    )
                ).inserted_primary_key[0]
            )
        master, workers = ids[0], ids[1:]
        conn.execute(provider.insert_coordination(execution_id, node, COORD_STARTED, master, "w"))
        conn.execute(
            provider.insert_partitions(),
            [
                {
                    "step_execution_id": sid,
                    "job_execution_id": execution_id,
                    "master_step_execution_id": master,
                    "partition_name": f"p{i}",
                    "assigned_node": node,
                    "transferable": i % 2 == 0,
                }
                for i, sid in enumerate(workers)
            ],
        )
    return execution_id, master, workers


def test_clock_is_utc_with_subsecond_resolution(backend: Backend) -> None:
    first = db_now(backend)
    python_now = datetime.now(UTC).replace(tzinfo=None)
    assert first.tzinfo is None
    assert abs((first - python_now).total_seconds()) < 5, "database clock is not UTC"
    time.sleep(0.02)
    second = db_now(backend)
    assert timedelta(0) < second - first < timedelta(seconds=2)
    readings = {db_now(backend) for _ in range(5)}
    assert any(r.microsecond % 1_000_000 for r in readings), "clock has whole seconds only"


def test_staleness_selects_exactly_the_older_rows(backend: Backend) -> None:
    provider = backend.provider
    now = db_now(backend)
    ages_ms = {"a": 50, "b": 250, "c": 900, "d": 1600, "e": 5000}
    with backend.engine.begin() as conn:
        for node_id, age in ages_ms.items():
            conn.execute(
                insert(nodes).values(
                    node_id=node_id,
                    host="h",
                    status="ACTIVE",
                    created_time=now,
                    last_heartbeat=now - timedelta(milliseconds=age),
                    current_load=0,
                )
            )
    with backend.engine.connect() as conn:
        for threshold, expected in [(500, {"c", "d", "e"}), (1200, {"d", "e"}), (3000, {"e"})]:
            found = set(
                conn.execute(
                    select(nodes.c.node_id).where(
                        provider.older_than(nodes.c.last_heartbeat, threshold)
                    )
                ).scalars()
            )
            assert found == expected, f"older than {threshold} ms"


def test_register_twice_heartbeat_sweeps_and_removal(backend: Backend) -> None:
    provider = backend.provider
    with backend.engine.begin() as conn:
        provider.register_node(conn, "n1", "host-a")
        provider.register_node(conn, "n1", "host-b")
        provider.register_node(conn, "n2", "host-a")
    with backend.engine.begin() as conn:
        rows = conn.execute(select(nodes.c.node_id, nodes.c.host)).all()
        assert sorted(rows) == [("n1", "host-b"), ("n2", "host-a")]
        assert conn.execute(provider.heartbeat("n1", 3)).rowcount == 1
        assert conn.execute(provider.heartbeat("missing", 0)).rowcount == 0
    time.sleep(0.35)
    with backend.engine.begin() as conn:
        conn.execute(provider.heartbeat("n1", 0))
        assert conn.execute(provider.mark_unreachable(300)).rowcount == 1  # only n2
        assert conn.execute(provider.mark_removing(300)).rowcount == 1
        conn.execute(provider.fence_partitions_of_removing())
        assert conn.execute(provider.delete_removing()).rowcount == 1
        assert conn.execute(select(nodes.c.node_id)).scalars().all() == ["n1"]
        assert conn.execute(provider.deregister_node("n1")).rowcount == 1
        assert conn.execute(provider.heartbeat("n1", 0)).rowcount == 0


def test_guarded_partition_transitions(backend: Backend) -> None:
    provider, engine = backend.provider, backend.engine
    with engine.begin() as conn:
        provider.register_node(conn, "n1", "h")
        provider.register_node(conn, "n2", "h")
    _, master, (p0, p1, p2) = make_partitions(engine, provider, 3, "n1")

    def status(pid: int) -> tuple[str, str | None, int]:
        with engine.connect() as conn:
            row = conn.execute(
                select(partitions.c.status, partitions.c.assigned_node, partitions.c.attempt).where(
                    partitions.c.step_execution_id == pid
                )
            ).one()
        return tuple(row)  # type: ignore[return-value]

    def run(stmt) -> int:
        with engine.begin() as conn:
            return conn.execute(stmt).rowcount

    with engine.connect() as conn:
        polled = conn.execute(provider.select_pending_for_node("n1", 10)).all()
    assert [r.step_execution_id for r in polled] == [p0, p1, p2]
    assert polled[0].worker_step_name == "w"

    # Claim: wrong node, wrong attempt -> nothing; right guard -> exactly one; again -> nothing.
    assert run(provider.claim_partition(p0, "n2", 1)) == 0
    assert run(provider.claim_partition(p0, "n1", 2)) == 0
    assert run(provider.claim_partition(p0, "n1", 1)) == 1
    assert run(provider.claim_partition(p0, "n1", 1)) == 0
    assert status(p0) == (PARTITION_CLAIMED, "n1", 1)

    # The fence holds only for the holder of the claim.
    assert run(provider.hold_partition(p0, "n1", 1)) == 1
    assert run(provider.hold_partition(p0, "n2", 1)) == 0
    assert run(provider.hold_partition(p0, "n1", 2)) == 0

    # Reassign moves it to another node (the (node, attempt) pair changes); the old holder's
    # fence and completion then change nothing.
    assert run(provider.reassign_partition(p0, "n1", 1, "n2")) == 1
    assert status(p0) == (PARTITION_PENDING, "n2", 1)
    assert run(provider.hold_partition(p0, "n1", 1)) == 0
    assert run(provider.finish_partition(p0, "n1", 1, PARTITION_COMPLETED)) == 0
    assert run(provider.claim_partition(p0, "n2", 1)) == 1
    assert run(provider.finish_partition(p0, "n2", 1, PARTITION_COMPLETED)) == 1
    # Terminal rows are never resurrected.
    assert run(provider.reassign_partition(p0, "n2", 1, "n1")) == 0
    assert run(provider.finish_partition(p0, "n2", 1, PARTITION_FAILED)) == 0
    assert run(provider.hold_partition(p0, "n2", 1)) == 0
    assert status(p0) == (PARTITION_COMPLETED, "n2", 1)

    # Release hands back an unstarted partition: no node, next attempt.
    assert run(provider.claim_partition(p1, "n1", 1)) == 1
    assert run(provider.release_partition(p1, "n1", 1)) == 1
    assert status(p1) == (PARTITION_PENDING, None, 2)
    assert run(provider.release_partition(p1, "n1", 1)) == 0

    # Orphans: p1 (no node) now; p2 once n1 is gone. Removing n1 fences its claim on p2.
    assert run(provider.claim_partition(p2, "n1", 1)) == 1
    with engine.connect() as conn:
        orphans = conn.execute(provider.select_orphaned_partitions(master)).all()
    assert [o.step_execution_id for o in orphans] == [p1]
    with engine.begin() as conn:
        conn.execute(update(nodes).where(nodes.c.node_id == "n1").values(status="UNREACHABLE"))
    time.sleep(0.05)
    with engine.begin() as conn:
        assert conn.execute(provider.mark_removing(10)).rowcount == 1
        assert conn.execute(provider.fence_partitions_of_removing()).rowcount == 1
        assert conn.execute(provider.delete_removing()).rowcount == 1
    assert status(p2) == (PARTITION_CLAIMED, "n1", 2)
    assert run(provider.hold_partition(p2, "n1", 1)) == 0
    with engine.connect() as conn:
        orphans = conn.execute(provider.select_orphaned_partitions(master)).all()
    assert [o.step_execution_id for o in orphans] == [p1, p2]
    assert run(provider.reassign_partition(p1, None, 2, "n2")) == 1
    assert status(p1) == (PARTITION_PENDING, "n2", 2)
    assert run(provider.fail_orphaned_partition(p2, "n1", 1)) == 0
    assert run(provider.fail_orphaned_partition(p2, "n1", 2)) == 1
    assert status(p2) == (PARTITION_FAILED, "n1", 2)

    with engine.connect() as conn:
        counts = {r[0]: r[1] for r in conn.execute(provider.select_partition_counts(master))}
    assert counts == {PARTITION_COMPLETED: 1, PARTITION_PENDING: 1, PARTITION_FAILED: 1}


def test_stranded_master_is_claimed_exactly_once(backend: Backend) -> None:
    provider, engine = backend.provider, backend.engine
    with engine.begin() as conn:
        provider.register_node(conn, "master", "h")
        provider.register_node(conn, "s1", "h")
    execution_id, _, _ = make_partitions(engine, provider, 1, "master")
    with engine.connect() as conn:
        assert conn.execute(provider.select_stranded_masters()).all() == []
    with engine.begin() as conn:
        conn.execute(provider.deregister_node("master"))
    with engine.connect() as conn:
        stranded = conn.execute(provider.select_stranded_masters()).all()
    assert [(s.job_execution_id, s.master_node, s.status) for s in stranded] == [
        (execution_id, "master", COORD_STARTED)
    ]
    with engine.begin() as conn:
        won = conn.execute(
            provider.claim_stranded_master(execution_id, "master", 1, COORD_STARTED, "s1")
        ).rowcount
        lost = conn.execute(
            provider.claim_stranded_master(execution_id, "master", 1, COORD_STARTED, "s2")
        ).rowcount
    assert (won, lost) == (1, 0)
    with engine.connect() as conn:
        row = conn.execute(
            select(
                job_coordination.c.status,
                job_coordination.c.master_node,
                job_coordination.c.master_epoch,
            )
        ).one()
        assert tuple(row) == (COORD_RECOVERING, "s1", 2)
    # The lost master's fence (its node, epoch 1) holds nothing any more.
    with engine.begin() as conn:
        assert conn.execute(provider.hold_mastership(execution_id, "master", 1)).rowcount == 0
        # The recovering node is alive, so the row is not stranded; it would be if s1 died.
        assert conn.execute(provider.select_stranded_masters()).all() == []


def test_ddl_applies_to_an_empty_database_and_create_is_idempotent(backend: Backend) -> None:
    from sqlalchemy import inspect, text

    from dbcluster import schema
    from dbcluster.testing.backends import drop_tables

    provider, engine = backend.provider, backend.engine
    drop_tables(engine)
    try:
        with engine.begin() as conn:
            for statement in provider.ddl_statements():
                conn.execute(text(statement))
        names = set(inspect(engine).get_table_names())
        assert {t.name for t in schema.ALL_TABLES} <= names
        assert provider.create_tables(engine) == []
    finally:
        drop_tables(engine)
        assert len(provider.create_tables(engine)) == len(schema.ALL_TABLES)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(nodes)).scalar_one() == 0


def test_keys_compare_case_and_accent_sensitively(backend: Backend) -> None:
    """'Job' and 'job', 'café' and 'cafe' are different job names and node ids on every
    database (MySQL 8's and MariaDB's default collations, and SQL Server's, equate them)."""
    provider, engine = backend.provider, backend.engine
    names = ["Job", "job", "café", "cafe", "日本 😀"]
    with engine.begin() as conn:
        conn.execute(
            insert(job_instance), [{"version": 0, "job_name": n, "job_key": "k"} for n in names]
        )
        for node_id in ("Node-1", "node-1", "nöde-1"):
            provider.register_node(conn, node_id, "h")
    with engine.connect() as conn:
        for name in names:
            found = conn.execute(
                select(job_instance.c.job_name).where(job_instance.c.job_name == name)
            ).scalars()
            assert list(found) == [name]
        nodes_found = conn.execute(select(nodes.c.node_id)).scalars().all()
    assert sorted(nodes_found) == sorted(["Node-1", "node-1", "nöde-1"])


def test_array_parameters_carry_every_value_as_bound(backend: Backend) -> None:
    """Rows inserted from array parameters (one per column) read back as bound: text that
    PostgreSQL's array text would have to quote and escape, NULLs, big integers, flags and
    times. On psycopg these lists go in the binary format; a list a user binds on the same
    engine is sent as psycopg sends it by default."""
    from dbcluster.dialects.base import array_parameters

    provider = backend.provider
    columns = [
        "step_name",
        "version",
        "job_execution_id",
        "status",
        "exit_message",
        "create_time",
        "start_time",
    ]
    statement = provider.insert_from_arrays(step_execution, columns)
    if statement is None:
        pytest.skip("no array insert on this database: its rows go as an executemany")
    when = datetime(2026, 12, 2, 11, 0, 0, 123456)
    names = ['a"b', "{x,y}", "back\\slash", "é ünicode", "", "NULL", "trailing "]
    job_execution_id, _, made = make_partitions(backend.engine, provider, 1, "n")
    rows_before = len(made) + 1  # the master step and its partition
    rows = [
        {
            "step_name": name,
            "version": 2**40 + i,
            "job_execution_id": job_execution_id,
            "status": "STARTED",
            "exit_message": None if i % 2 else name,
            "create_time": when,
            "start_time": None if i % 3 == 0 else when,
        }
        for i, name in enumerate(names)
    ]
    with backend.engine.begin() as conn:
        conn.execute(statement, array_parameters(rows, columns))
        found = conn.execute(
            select(*(step_execution.c[c] for c in columns))
            .where(step_execution.c.job_execution_id == job_execution_id)
            .order_by(step_execution.c.step_execution_id)
        ).all()
    assert [dict(zip(columns, row, strict=True)) for row in found[rows_before:]] == rows
    if backend.engine.dialect.driver == "psycopg":
        from psycopg.adapt import PyFormat
        from psycopg.types.array import ListBinaryDumper

        with backend.engine.connect() as conn:
            adapters = conn.connection.dbapi_connection.adapters
            assert not issubclass(adapters.get_dumper(list, PyFormat.AUTO), ListBinaryDumper)
