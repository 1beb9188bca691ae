"""Real operating-system processes: three `dbcluster worker`s and a `dbcluster launch`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from sqlalchemy import select

from dbcluster.schema import nodes
from dbcluster.testing.app import expected_total, ledger, ledger_metadata
from dbcluster.testing.backends import Backend

FAST_ENV = {
    "DBCLUSTER_HEARTBEAT_INTERVAL": "200",
    "DBCLUSTER_TASK_POLLING_INTERVAL": "100",
    "DBCLUSTER_UNREACHABLE_THRESHOLD": "2000",
    "DBCLUSTER_CLEANUP_THRESHOLD": "4000",
    "DBCLUSTER_SWEEP_INTERVAL": "200",
    "DBCLUSTER_MASTER_CHECK_INTERVAL": "100",
    "DBCLUSTER_ORPHAN_CHECK_INTERVAL": "200",
    "DBCLUSTER_STRANDED_MASTER_SCAN_INTERVAL": "500",
}
APP = "dbcluster.testing.app:wide_registry"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dbcluster.cli", *args]


@pytest.mark.backends("sqlite", "postgresql", "mariadb")
def test_three_worker_processes_and_a_launcher_run_24_partitions_once(backend: Backend) -> None:
    ledger_metadata.drop_all(backend.engine)
    ledger_metadata.create_all(backend.engine)
    env = {**os.environ, **FAST_ENV}
    workers = [
        subprocess.Popen(
            cli("worker", "--url", backend.url, "--app", APP, "--node-prefix", f"w{i}"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with backend.engine.connect() as conn:
                if len(conn.execute(select(nodes.c.node_id)).all()) == 3:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the three workers did not join")
        launched = subprocess.run(
            cli(
                "launch",
                "--url",
                backend.url,
                "--app",
                APP,
                "ledger",
                "run=1",
                "delay_ms(int)=100",
                "--no-work",
                "--json",
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert launched.returncode == 0, launched.stderr[-2000:]
        outcome = json.loads(launched.stdout.strip().splitlines()[-1])
        assert outcome["status"] == "COMPLETED"
        with backend.engine.connect() as conn:
            rows = conn.execute(
                select(ledger).where(ledger.c.job_execution_id == outcome["job_execution_id"])
            ).all()
        counts = Counter(r.partition_name for r in rows)
        assert len(counts) == 24 and set(counts.values()) == {1}
        assert sum(r.total for r in rows) == expected_total()
        assert len({r.node_id for r in rows}) == 3
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        ledger_metadata.drop_all(backend.engine)
    assert all(p.returncode == 0 for p in workers), [p.stderr.read()[-1000:] for p in workers]
    with backend.engine.connect() as conn:
        assert conn.execute(select(nodes)).all() == [], "a stopped worker stayed registered"
