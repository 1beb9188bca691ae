"""A command issued while the database is away (issue 34: "commands ride out a database
outage"): a launch during a 5-second PostgreSQL restart, and one against a server that stays
down."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from ha_topology import HA_SCRIPT, ha, ha_env, parse_urls, scratch_database

from dbcluster.testing.harness import wait_until

pytestmark = pytest.mark.ha

APP = "dbcluster.testing.app:chaos_registry"


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180):
    return subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _startup_seconds() -> float:
    """How long ``dbcluster launch`` takes here to reach its first connect: the time it takes to
    fail against a port where nothing listens, trying once (``DBCLUSTER_CONNECT_TIMEOUT=0``)."""
    url = f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/test"
    began = time.monotonic()
    _cli(
        "launch", "--detach", "--url", url, "--app", APP, "ledger", "n(int)=1",
        env={"DBCLUSTER_CONNECT_TIMEOUT": "0"},
    )  # fmt: skip
    return time.monotonic() - began


def _ledger_tables(url: str) -> None:
    """The test application's tables (its jobs write a ledger)."""
    from dbcluster.dialects import make_engine
    from dbcluster.testing.app import ledger_metadata

    engine = make_engine(url)
    try:
        ledger_metadata.create_all(engine)
    finally:
        engine.dispose()


def _execution_status(url: str, execution_id: int) -> str | None:
    from dbcluster.batch.repository import JobRepository
    from dbcluster.dialects import make_engine

    engine = make_engine(url)
    try:
        execution = JobRepository(engine).get_job_execution(execution_id)
        return None if execution is None else execution.status.value
    finally:
        engine.dispose()


def test_a_launch_issued_during_a_restart_succeeds_once_the_server_is_back(
    pg_pair: dict[str, str],
) -> None:
    primary = parse_urls(ha("pg", "urls"))["HA_PG_PRIMARY_URL"]  # after any switchover
    url = scratch_database(primary, "halaunch")
    assert _cli("init", "--url", url).returncode == 0
    _ledger_tables(url)
    # The launch must meet the outage: a Python command needs seconds to start on a loaded
    # machine, so the server stays away that long, then 5 s more.
    down = 5 + _startup_seconds()
    restart = subprocess.Popen(
        ["bash", str(HA_SCRIPT), "pg", "restart", f"{down:.1f}"],
        env=ha_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid = None
    try:
        assert restart.stderr is not None
        # The script says when the primary has stopped: the launch goes out while it is down.
        for line in restart.stderr:
            if "stopped (fast)" in line:
                break
        else:
            pytest.fail("ci/ha.sh pg restart ended without stopping the primary")
        launch = _cli(
            "launch", "--detach", "--json", "--url", url, "--app", APP,
            "ledger", "n(int)=1", "delay_ms(int)=100",
        )  # fmt: skip
    finally:
        restart.communicate(timeout=180)
    assert restart.returncode == 0
    assert launch.returncode == 0, launch.stderr[-2000:]
    assert "Traceback" not in launch.stderr
    # It met the outage and waited it out: one warning as the wait began (one info line as it
    # ended; the tries between are DEBUG records).
    assert "warning: database unavailable" in launch.stderr, launch.stderr[-2000:]
    outcome = json.loads(launch.stdout)
    pid = int(outcome["pid"])
    try:
        wait_until(
            lambda: _execution_status(url, int(outcome["job_execution_id"])) == "COMPLETED",
            180,
            "the launched job to complete",
            interval=0.5,
        )
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_launch_against_a_server_that_stays_down_exits_3_after_the_connect_timeout() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/test"
    began = time.monotonic()
    launch = _cli(
        "launch", "--detach", "--url", url, "--app", APP, "ledger", "n(int)=1",
        env={"DBCLUSTER_CONNECT_TIMEOUT": "3"},
    )  # fmt: skip
    took = time.monotonic() - began
    assert launch.returncode == 3, launch.stderr[-2000:]
    assert took >= 3
    assert "Traceback" not in launch.stderr
