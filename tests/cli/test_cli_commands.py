"""launch, restart, status, jobs and job, driven as subprocesses on every reachable backend."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import APP, PidProcess, cli, cli_env, run_cli, wait_for
from sqlalchemy import Engine, func, select

from dbcluster.demo import receipts, results
from dbcluster.testing.app import TIME_SCALE
from dbcluster.testing.backends import Backend


def expected_total(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.sum(receipts.c.amount_cents))).scalar_one())


def result_total(engine: Engine, execution_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.coalesce(func.sum(results.c.total_cents), 0)).where(
                    results.c.job_execution_id == execution_id
                )
            ).scalar_one()
        )


def one_json_line(stdout: str) -> Any:
    """stdout of a --json command: exactly one line, and it parses."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def test_launch_fails_restart_completes_and_the_views_show_it(
    backend: Backend,
    demo_engine: Engine,
    start_worker: Callable[[str], tuple[subprocess.Popen[Any], Path]],
) -> None:
    url = backend.url
    _, worker_log = start_worker("cw")

    status = run_cli("status", "--url", url, "--json")
    assert status.returncode == 0, status.stderr
    found = one_json_line(status.stdout)
    assert [n["node_id"].split("-")[0] for n in found["nodes"]] == ["cw"]
    assert found["nodes"][0]["heartbeat_age_ms"] < 2000
    assert found["jobs"] == []

    # No results table yet: every partition fails at its final insert, so the job FAILS (exit 1).
    launched = run_cli(
        "launch", "--url", url, "--app", APP, "reconcile-receipts", "run=1", "--json"
    )
    assert launched.returncode == 1, launched.stderr[-3000:]
    failed = one_json_line(launched.stdout)
    assert failed["status"] == "FAILED"
    assert failed["partitions"] == {"FAILED": 8}  # 4 per node: the worker and the launcher
    assert "partitions done" in launched.stderr  # progress went to stderr, not stdout

    results.create(demo_engine)
    restarted = run_cli(
        "restart", "--url", url, "--app", APP, str(failed["job_execution_id"]), "--json"
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    done = one_json_line(restarted.stdout)
    assert done["status"] == "COMPLETED"
    assert done["partitions"] == {"COMPLETED": 8}
    assert sum(done["completed_per_node"].values()) == 8
    assert result_total(demo_engine, done["job_execution_id"]) == expected_total(demo_engine)

    # Restarting a COMPLETED execution is a user error: one line, exit 2.
    again = run_cli("restart", "--url", url, "--app", APP, str(done["job_execution_id"]))
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [again.stderr.strip()]
    assert "COMPLETED" in again.stderr and "nothing to restart" in again.stderr
    assert "Traceback" not in again.stderr

    jobs = run_cli("jobs", "--url", url, "--json")
    assert jobs.returncode == 0, jobs.stderr
    listed = one_json_line(jobs.stdout)
    assert [(j["job_execution_id"], j["status"]) for j in listed] == [
        (done["job_execution_id"], "COMPLETED"),
        (failed["job_execution_id"], "FAILED"),
    ]
    assert listed[0]["partitions"] == {"COMPLETED": 8}
    text = run_cli("jobs", "--url", url)
    assert text.returncode == 0 and "COMPLETED" in text.stdout and "FAILED" in text.stdout

    job = run_cli("job", "--url", url, str(done["job_execution_id"]), "--json")
    assert job.returncode == 0, job.stderr
    detail = one_json_line(job.stdout)
    assert detail["status"] == "COMPLETED" and detail["job"] == "reconcile-receipts"
    assert len(detail["partitions"]) == 8
    assert {p["status"] for p in detail["partitions"]} == {"COMPLETED"}
    assert all(p["node"] and p["attempt"] == 1 for p in detail["partitions"])
    assert [s["name"] for s in detail["steps"]][0] == "reconcile"
    # What each partition kept in its context (its range; the demo's sums where it read
    # receipts), without dbcluster's own keys.
    kept = [s["context"] for s in detail["steps"] if ":" in s["name"]]
    assert len(kept) == 8 and all({"lo", "hi"} <= set(c) for c in kept), kept
    assert any({"count", "sum", "last_id"} <= set(c) for c in kept), kept
    assert not [k for s in detail["steps"] for k in s["context"] if k.startswith("dbcluster.")]
    job_text = run_cli("job", "--url", url, str(failed["job_execution_id"]))
    assert job_text.returncode == 0
    assert "Partitions (8)" in job_text.stdout and "receipts-1-7501" in job_text.stdout
    assert "Step executions (9)" in job_text.stdout
    assert "context" in job_text.stdout and "lo=1" in job_text.stdout

    status_text = run_cli("status", "--url", url)
    assert status_text.returncode == 0 and "cw-" in status_text.stdout

    # The worker logged its claims and completions at INFO with node and partition ids.
    log = worker_log.read_text()
    assert "INFO dbcluster.node: node cw-" in log
    # A claim of several names them all in one line ("claimed 3 partitions: receipts-...").
    assert re.search(r"claimed (partition|\d+ partitions:) receipts-", log)
    assert "completed partition receipts-" in log
    # A failure says why, in the same line (the exception its step execution recorded).
    assert re.search(
        r"WARNING dbcluster.node: node cw-\S+ failed partition receipts-\S+ \(\d+\): \S*Error", log
    )
    assert "no reason recorded" not in log


@pytest.mark.backends("sqlite", "postgresql")
def test_detached_launch_returns_at_once_and_status_shows_it_in_flight(
    backend: Backend,
    demo_engine: Engine,
    start_worker: Callable[[str], tuple[subprocess.Popen[Any], Path]],
    processes: list[subprocess.Popen[Any]],
    tmp_path: Path,
) -> None:
    results.create(demo_engine)
    start_worker("dw")
    log_file = tmp_path / "master.log"
    launched = run_cli(
        "launch",
        "--url",
        backend.url,
        "--app",
        APP,
        "reconcile-receipts",
        "run=detached",
        # Slow enough (about 10 s, times the suite's time scale) that the job is still running
        # when `status` reads it, even when a loaded machine takes seconds to start the two
        # commands (at 600 ms and a scale of 2 it finished first once, under a load of 89).
        f"pace_ms(int)={int(600 * TIME_SCALE)}",
        "--no-work",
        "--detach",
        "--log-file",
        str(log_file),
        "--json",
    )
    assert launched.returncode == 0, launched.stderr
    out = one_json_line(launched.stdout)
    execution_id = out["job_execution_id"]
    assert out["log_file"] == str(log_file)

    # The background master is ours to clean up, by pid.
    master = PidProcess(out["pid"])
    processes.append(master)  # type: ignore[arg-type]

    status = run_cli("status", "--url", backend.url, "--json")
    assert status.returncode == 0, status.stderr
    in_flight = one_json_line(status.stdout)["jobs"]
    assert [j["job_execution_id"] for j in in_flight] == [execution_id]
    assert in_flight[0]["status"] == "STARTED"
    assert in_flight[0]["master"] and not in_flight[0]["master"].startswith("dw-")
    assert in_flight[0]["partitions_total"] == 4  # one worker node: 4 partitions

    def finished() -> dict[str, Any] | None:
        job = run_cli("job", "--url", backend.url, str(execution_id), "--json")
        detail = one_json_line(job.stdout)
        return detail if detail["status"] not in ("STARTING", "STARTED") else None

    detail = wait_for(finished, 60 * TIME_SCALE, "the detached job to finish", interval=0.2)
    assert detail["status"] == "COMPLETED", log_file.read_text()[-3000:]
    assert result_total(demo_engine, execution_id) == expected_total(demo_engine)
    wait_for(lambda: master.poll() is not None, 20, "the detached master to exit")
    log = log_file.read_text()
    assert "partitions done" in log  # its progress and summary went to its log
    assert f"execution {execution_id}: COMPLETED" in log


@pytest.mark.backends("sqlite")
def test_live_progress_on_a_terminal_never_reaches_stdout(
    backend: Backend,
    demo_engine: Engine,
) -> None:
    """With stderr on a terminal the rich progress bar is live; --json stdout stays one line."""
    results.create(demo_engine)
    master_fd, slave_fd = pty.openpty()
    seen: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            cli(
                "launch",
                "--url",
                backend.url,
                "--app",
                APP,
                "reconcile-receipts",
                "run=tty",
                "pace_ms(int)=100",
                "--json",
            ),
            stdout=subprocess.PIPE,
            stderr=slave_fd,
            text=True,
            timeout=60,
            env=cli_env(TERM="xterm", COLUMNS="120"),
        )
    finally:
        os.close(slave_fd)
        reader.join(timeout=5)
        os.close(master_fd)
    assert proc.returncode == 0
    outcome = one_json_line(proc.stdout)
    assert outcome["status"] == "COMPLETED"
    terminal = b"".join(seen).decode(errors="replace")
    assert "reconcile" in terminal and "4/4" in terminal  # the bar, on the terminal
