"""PgBouncer 1.18 (Debian's) in transaction pooling mode, in front of the pair's primary (issue
35): a node's engines through it (``?dbcluster_pooler=transaction``), ``dbcluster demo``, the
cluster tests and a chaos run of worker faults through it, the nodes listening for wake-ups over
a direct connection (``listen_url``)."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest
from ha_topology import (
    CLASSIC,
    ROOT,
    assert_cluster_tests_pass,
    chaos_run,
    scratch_database,
    violated,
    with_database,
)
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from dbcluster.dialects import get_provider, make_engine
from dbcluster.dialects.base import SessionLimits
from dbcluster.errors import ConfigurationError
from dbcluster.testing.waiting import wait_for

pytestmark = pytest.mark.ha


def _dsn(url: str, database: str) -> str:
    parsed = make_url(url)
    return f"host={parsed.host} port={parsed.port} user={parsed.username} dbname={database}"


def test_pgbouncer_pools_by_transaction(pgbouncer: dict[str, str]) -> None:
    url = pgbouncer["HA_PGBOUNCER_URL"]
    with psycopg.connect(_dsn(url, "pgbouncer"), autocommit=True) as admin:
        config = {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}
        version = admin.execute("SHOW VERSION").fetchone()
    assert config["pool_mode"] == "transaction"
    assert version is not None and "1.18" in str(version[0])
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_is_in_recovery()")).scalar_one() is False
    finally:
        engine.dispose()


def test_a_node_engine_connects_through_pgbouncer(pgbouncer: dict[str, str]) -> None:
    """Its session limits go with each transaction and each autocommit statement (PgBouncer
    1.18 refuses them as the startup parameter ``options``), prepared statements are off."""
    url = pgbouncer["HA_PGBOUNCER_URL"]
    limits = SessionLimits(2000, 10000)
    work = make_engine(url, limits=limits)
    single = make_engine(url, limits=limits, autocommit=True, coordination=True, ping=False)
    try:
        assert not get_provider(work).keeps_session
        for _ in range(8):  # past psycopg's prepare threshold (5), were it on
            with work.begin() as conn:
                assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "2s"
                idle = conn.execute(text("SHOW idle_in_transaction_session_timeout"))
                assert idle.scalar_one() == "10s"
            with single.connect() as conn:
                assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "2s"
    finally:
        work.dispose()
        single.dispose()


def test_a_transaction_left_idle_is_ended_by_the_server_through_pgbouncer(
    pg_pair: dict[str, str], pgbouncer: dict[str, str]
) -> None:
    """The idle-in-transaction bound that goes with the transaction holds: a frozen node's
    transaction (and its row locks) ends on the server, not when PgBouncer or the node notice."""
    engine = make_engine(pgbouncer["HA_PGBOUNCER_URL"], limits=SessionLimits(2000, 300))
    direct = make_engine(pg_pair["HA_PG_PRIMARY_URL"])

    def alive(pid: int) -> bool:
        with direct.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid})
            return found.first() is not None

    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()  # in a transaction
            wait_for(lambda: not alive(pid), 15, "the server to end the idle transaction")
            with pytest.raises(DBAPIError):
                conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()
        direct.dispose()


def test_a_notify_through_pgbouncer_wakes_a_listener_on_the_direct_url(
    pg_pair: dict[str, str], pgbouncer: dict[str, str]
) -> None:
    """What ``listen_url`` relies on: a placement's NOTIFY, committed through the pooler,
    reaches a node listening over a direct connection."""
    listening = make_engine(pg_pair["HA_PG_PRIMARY_URL"], autocommit=True)
    pooled = make_engine(pgbouncer["HA_PGBOUNCER_URL"])
    provider = get_provider(listening)
    channel = provider.wake_channel("issue-35")
    listener = provider.open_listener(listening, channel)
    try:
        with pooled.begin() as conn:
            conn.execute(text("SELECT pg_notify(:c, 'placed')"), {"c": channel})
        assert wait_for(lambda: listener.wait(0.5), 10, "the wake-up") == ["placed"]
    finally:
        listener.close()
        listening.dispose()
        pooled.dispose()


def test_without_the_option_the_refusal_names_it(pgbouncer: dict[str, str]) -> None:
    plain = make_url(pgbouncer["HA_PGBOUNCER_URL"]).difference_update_query(["dbcluster_pooler"])
    engine = make_engine(plain, limits=SessionLimits(2000, 10000))
    try:
        with pytest.raises(ConfigurationError, match=r"\?dbcluster_pooler=transaction"):
            engine.connect().close()
    finally:
        engine.dispose()


def test_the_demo_passes_through_pgbouncer(pgbouncer: dict[str, str]) -> None:
    url = scratch_database(pgbouncer["HA_PGBOUNCER_URL"], "hademo")
    done = subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", "demo", "--url", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "OK: the totals match" in done.stdout, done.stdout[-3000:]


def test_the_cluster_tests_pass_through_pgbouncer(pgbouncer: dict[str, str]) -> None:
    """No listener (the nodes poll): claims, fencing, takeover, stop and schedules."""
    assert_cluster_tests_pass("postgresql", pgbouncer["HA_PGBOUNCER_URL"])


@pytest.fixture(scope="module")
def worker_faults_run(
    pg_pair: dict[str, str], pgbouncer: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """Kills, stops, SIGTERMs, cut connections and frozen transactions of workers, every node
    through PgBouncer and listening over a direct connection to the primary (``listen_url``)."""
    url = scratch_database(pgbouncer["HA_PGBOUNCER_URL"], "habouncer")
    direct = with_database(pg_pair["HA_PG_PRIMARY_URL"], str(make_url(url).database))
    kinds = ("kill", "stop", "term", "cut", "freeze-tx")
    tmp = tmp_path_factory.mktemp("bouncer")
    return chaos_run(url, 3, kinds, 5, tmp, None, env={"DBCLUSTER_LISTEN_URL": direct})


def test_worker_faults_through_pgbouncer_keep_every_invariant(worker_faults_run: dict) -> None:
    assert sum(worker_faults_run["faults_by_kind"].values()) >= 3, worker_faults_run[
        "faults_by_kind"
    ]
    assert violated(worker_faults_run, CLASSIC) == {}
