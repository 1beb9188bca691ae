"""The query provider contract, statement by statement, against a live database."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, column, insert, inspect, select, update
from sqlalchemy import table as table_clause
from sqlalchemy.exc import DBAPIError

from dbcluster import schema
from dbcluster.dialects.base import QueryProvider
from dbcluster.schema import nodes
from dbcluster.states import NODE_ACTIVE, NODE_UNREACHABLE

# The guarded transitions are written in claims.py and collected here, with the rest.
from dbcluster.testing.suite import claims, writes
from dbcluster.testing.suite.claims import *  # noqa: F403
from dbcluster.testing.suite.provider_helpers import (
    _naive,
    _now,
    _partition,
    _place,
    _provider,
    _register,
    _rowcount,
)
from dbcluster.testing.suite.writes import *  # noqa: F403

__all__ = [
    "test_clock_is_utc_with_millisecond_precision",
    "test_clock_advances_inside_one_transaction",
    "test_older_than_is_subsecond_precise",
    "test_older_than_turns_true_once_the_threshold_has_passed",
    "test_registration_survives_a_reregister_and_heartbeat_reports_a_removed_node",
    "test_sweeps_mark_then_remove_silent_nodes",
    "test_removing_a_node_fences_what_it_claimed",
    "test_ddl_covers_every_table_and_init_is_idempotent",
    "test_transient_classifier_calls_permanent_errors_permanent",
    *claims.__all__,
    *writes.__all__,
]


# --- the clock ------------------------------------------------------------------------------------


def test_clock_is_utc_with_millisecond_precision(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    readings = []
    for _ in range(5):
        readings.append(_naive(_now(engine, provider)))
        time.sleep(0.013)
    host = datetime.now(UTC).replace(tzinfo=None)
    assert all(isinstance(r, datetime) for r in readings)
    # UTC: within a few minutes of this host's UTC clock (a local-time clock is hours off).
    assert abs((host - readings[-1]).total_seconds()) < 300, (host, readings[-1])
    # At least millisecond precision: readings 13 ms apart differ, and not in whole seconds.
    assert len(set(readings)) == len(readings), readings
    assert any(r.microsecond % 1_000_000 for r in readings), readings
    steps = [(b - a).total_seconds() for a, b in zip(readings, readings[1:], strict=False)]
    assert all(0.005 < s < 5 for s in steps), steps


def test_clock_advances_inside_one_transaction(dbc_backend: Any) -> None:
    """Heartbeats and staleness read the statement's clock, not the transaction's start."""
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    with engine.begin() as conn:
        first = _naive(conn.execute(provider.select_now()).scalar_one())
        time.sleep(0.06)
        second = _naive(conn.execute(provider.select_now()).scalar_one())
    assert (second - first).total_seconds() >= 0.04, (first, second)


# --- staleness ------------------------------------------------------------------------------------


def test_older_than_is_subsecond_precise(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-fresh", "suite-stale")
    for _ in range(5):  # repeat if the machine stalled between reading the clock and the query
        t0 = time.monotonic()
        now = _naive(_now(engine, provider))
        with engine.begin() as conn:
            conn.execute(
                update(nodes)
                .where(nodes.c.node_id == "suite-fresh")
                .values(last_heartbeat=now - timedelta(milliseconds=100))
            )
            conn.execute(
                update(nodes)
                .where(nodes.c.node_id == "suite-stale")
                .values(last_heartbeat=now - timedelta(milliseconds=600))
            )
        with engine.connect() as conn:
            stale = {
                r[0]
                for r in conn.execute(
                    select(nodes.c.node_id).where(provider.older_than(nodes.c.last_heartbeat, 350))
                )
            }
        if time.monotonic() - t0 < 0.2:
            break
    else:
        pytest.skip("the machine is too slow to judge 250 ms windows")
    assert stale == {"suite-stale"}, f"older_than(350 ms) picked {stale}: not millisecond-precise"


def test_older_than_turns_true_once_the_threshold_has_passed(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    t0 = time.monotonic()
    _register(engine, provider, "suite-node")
    stmt = select(nodes.c.node_id).where(
        nodes.c.node_id == "suite-node", provider.older_than(nodes.c.last_heartbeat, 200)
    )
    while True:
        with engine.connect() as conn:
            flipped = conn.execute(stmt).first() is not None
        elapsed = time.monotonic() - t0
        if flipped:
            break
        assert elapsed < 5, "older_than(200 ms) never turned true"
        time.sleep(0.01)
    assert elapsed >= 0.19, f"older_than(200 ms) was true after {elapsed * 1000:.0f} ms"
    # A 1-second-precise expression would only flip after a whole second.
    assert elapsed < 0.95, f"older_than(200 ms) took {elapsed * 1000:.0f} ms to turn true"


# --- the node registry ----------------------------------------------------------------------------


def test_registration_survives_a_reregister_and_heartbeat_reports_a_removed_node(
    dbc_backend: Any,
) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-a")
    with engine.begin() as conn:
        conn.execute(
            update(nodes).where(nodes.c.node_id == "suite-a").values(status=NODE_UNREACHABLE)
        )
    _register(engine, provider, "suite-a")  # re-register: refreshed, not an error
    with engine.connect() as conn:
        rows = conn.execute(select(nodes.c.node_id, nodes.c.status)).all()
    assert [tuple(r) for r in rows] == [("suite-a", NODE_ACTIVE)]
    assert _rowcount(engine, provider.heartbeat("suite-a", 3)) == 1
    assert _rowcount(engine, provider.deregister_node("suite-a")) == 1
    assert _rowcount(engine, provider.heartbeat("suite-a", 3)) == 0, (
        "a heartbeat must change no row once the node was removed (it then fences itself)"
    )


def _remove(engine: Engine, provider: QueryProvider, threshold_ms: int) -> int:
    """A sweeper's removal transaction: lock the silent UNREACHABLE nodes, fence what they
    claimed, delete them. Returns how many nodes it removed."""
    with engine.begin() as conn:
        if not conn.execute(provider.mark_removing(threshold_ms)).rowcount:
            return 0
        conn.execute(provider.fence_partitions_of_removing())
        return conn.execute(provider.delete_removing()).rowcount


def test_sweeps_mark_then_remove_silent_nodes(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-live", "suite-silent")
    now = _naive(_now(engine, provider))
    with engine.begin() as conn:
        conn.execute(
            update(nodes)
            .where(nodes.c.node_id == "suite-silent")
            .values(last_heartbeat=now - timedelta(seconds=5))
        )
    assert _remove(engine, provider, 2000) == 0, "only UNREACHABLE nodes are removed"
    assert _rowcount(engine, provider.mark_unreachable(2000)) == 1
    assert _remove(engine, provider, 10000) == 0
    assert _remove(engine, provider, 2000) == 1
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(select(nodes.c.node_id))] == ["suite-live"]


def test_removing_a_node_fences_what_it_claimed(dbc_backend: Any) -> None:
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-dead", "suite-other")
    _, (claimed, unclaimed) = _place(engine, provider, "suite-dead")
    _, (elsewhere, _b) = _place(engine, provider, "suite-other")
    assert _rowcount(engine, provider.claim_partition(claimed, "suite-dead", 1)) == 1
    assert _rowcount(engine, provider.claim_partition(elsewhere, "suite-other", 1)) == 1
    now = _naive(_now(engine, provider))
    with engine.begin() as conn:
        conn.execute(
            update(nodes)
            .where(nodes.c.node_id == "suite-dead")
            .values(status=NODE_UNREACHABLE, last_heartbeat=now - timedelta(seconds=5))
        )
    assert _remove(engine, provider, 2000) == 1
    row = _partition(engine, claimed)
    assert (row.assigned_node, row.attempt, row.status) == ("suite-dead", 2, "CLAIMED"), (
        "removing a node must move what it claimed to the next attempt in the same transaction"
    )
    assert _rowcount(engine, provider.hold_partition(claimed, "suite-dead", 1)) == 0
    row = _partition(engine, unclaimed)
    assert (row.attempt, row.status) == (1, "PENDING"), "an unclaimed partition keeps its attempt"
    row = _partition(engine, elsewhere)
    assert (row.assigned_node, row.attempt) == ("suite-other", 1), "another node's claim moved"


# --- DDL and init ---------------------------------------------------------------------------------


def test_ddl_covers_every_table_and_init_is_idempotent(dbc_backend: Any) -> None:
    """``dbcluster init`` from several processes at once: the provider's DDL, then the version
    row in a transaction of its own (no DML shares a transaction with DDL)."""
    from dbcluster import migrations

    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    script = provider.ddl_script().lower()
    for table in schema.ALL_TABLES:
        assert table.name.lower() in script, f"the DDL does not create {table.name}"
    schema.metadata.drop_all(engine)
    errors: list[BaseException] = []

    def init() -> None:
        try:
            provider.create_schema(engine)
            migrations.record_if_unrecorded(engine)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=init) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, f"concurrent init failed: {errors}"
    names = set(inspect(engine).get_table_names())
    assert {t.name for t in schema.ALL_TABLES} <= names
    assert provider.create_tables(engine) == []
    with engine.connect() as conn:
        recorded = conn.execute(select(schema.schema_version.c.version_num)).scalars().all()
    assert recorded == [schema.SCHEMA_VERSION], "init did not record the schema's version once"


# --- transient errors -----------------------------------------------------------------------------


def test_transient_classifier_calls_permanent_errors_permanent(dbc_backend: Any) -> None:
    """``is_transient`` decides what the cluster repeats and what this suite takes for a lost
    race; an error that repeating cannot cure must not be called transient, or the cluster
    retries it forever and a broken statement passes here as a lost race."""
    engine, provider = dbc_backend.engine, _provider(dbc_backend)
    _register(engine, provider, "suite-dup")
    permanent: list[BaseException] = [RuntimeError("not a database error")]
    with pytest.raises(DBAPIError) as duplicate:
        with engine.begin() as conn:
            conn.execute(
                insert(nodes).values(
                    node_id="suite-dup",
                    host="suite-host",
                    status=NODE_ACTIVE,
                    created_time=provider.now(),
                    last_heartbeat=provider.now(),
                    current_load=0,
                    capacity=0,
                )
            )
    permanent.append(duplicate.value)
    with pytest.raises(DBAPIError) as absent:
        with engine.connect() as conn:
            conn.execute(select(table_clause("dbc_suite_no_such_table", column("x"))))
    permanent.append(absent.value)
    called_transient = [
        f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
        for e in permanent
        if provider.is_transient(e)
    ]
    assert not called_transient, (
        f"is_transient calls permanent errors transient: {called_transient}"
    )
