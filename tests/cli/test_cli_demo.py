"""``dbcluster demo``: a worker is killed mid-run, its partitions move, the total is right."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from cli_helpers import cli, cli_env

from dbcluster.demo import demo_metadata
from dbcluster.testing.backends import Backend


def run_demo(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = subprocess.run(
        cli("demo", *args), capture_output=True, text=True, timeout=120, env=cli_env(**env)
    )
    return proc, time.monotonic() - began


def check_output(proc: subprocess.CompletedProcess[str]) -> None:
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert re.search(r"SIGKILL worker demo-w1 \(pid \d+", out), out
    assert re.search(
        r"reassigned receipts-\d+-\d+ from demo-w1-\w+ to demo-w\d-\w+ \(attempt 2", out
    )
    moves = re.findall(r"reassigned \S+ from (\S+) to (\S+) ", out)
    assert all(a != b for a, b in moves), f"a partition 'moved' to the node it was on: {out}"
    cluster = re.search(r"cluster total: +(\$[\d,.]+) from ([\d,]+) receipts", out)
    single = re.search(r"single-process total: +(\$[\d,.]+) from ([\d,]+) receipts", out)
    assert cluster and single, out
    assert cluster.groups() == single.groups()
    assert "COMPLETED" in out and "OK" in out
    assert "Traceback" not in proc.stderr


def test_demo_on_a_fresh_sqlite_file() -> None:
    proc, took = run_demo()
    check_output(proc)
    assert took < 60


def test_the_demo_does_not_take_the_callers_deployment_settings() -> None:
    """A caller whose shell carries a deployment's settings (a quieter log level, JSON logs, a
    slot count) runs the same demo: its workers neither inherit them nor depend on them. With
    ``DBCLUSTER_LOG_LEVEL=warning`` it used to wait 60 s for workers that had joined (it reads
    their INFO lines), then fail."""
    proc, _ = run_demo(
        DBCLUSTER_LOG_LEVEL="warning",
        DBCLUSTER_LOG_FORMAT="json",
        DBCLUSTER_CONCURRENCY_LIMIT="1",
    )
    check_output(proc)


@pytest.mark.backends("postgresql")
def test_demo_on_a_given_url(backend: Backend) -> None:
    try:
        proc, _ = run_demo("--url", backend.url, "--nodes", "2")
        check_output(proc)
        assert "a SQLite file" not in proc.stdout
    finally:
        demo_metadata.drop_all(backend.engine)
