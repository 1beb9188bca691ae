"""``dbcluster submit`` (with a worker that accepts launches) and ``dbcluster schedules``, and the
one-line errors of both."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli, cli_env, run_cli, wait_for
from sqlalchemy import select

from dbcluster.cli import main
from dbcluster.schema import nodes
from dbcluster.testing.backends import Backend

APP = "dbcluster.testing.scheduled:unscheduled"
SCHEDULED = "dbcluster.testing.scheduled:registry"


@pytest.mark.backends("sqlite")
def test_submit_waits_for_the_job_an_accepting_worker_runs(
    backend: Backend, processes: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            cli("worker", "--app", APP, "--node-prefix", "acc", "--accept-launches"),
            env=cli_env(DBCLUSTER_URL=backend.url),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    processes.append(worker)

    def joined() -> bool:
        with backend.engine.connect() as conn:
            return (
                conn.execute(select(nodes).where(nodes.c.node_id.like("acc-%"))).first() is not None
            )

    wait_for(joined, 30, "the worker to join")
    done = run_cli(
        "submit",
        "--url",
        backend.url,
        "--app",
        APP,
        "counter",
        "--next",
        "--wait",
        "--json",
        "--timeout",
        "30",
    )
    assert done.returncode == 0, done.stderr + log.read_text()[-2000:]
    outcome = json.loads(done.stdout)
    assert outcome["status"] == "COMPLETED" and outcome["request_id"] >= 1
    # Without --app the accepting node judges the request: this one fails there, with its reason.
    failed = run_cli("submit", "--url", backend.url, "tick", "--next", "--wait", "--timeout", "30")
    assert failed.returncode == 1, failed.stderr
    assert "has no incrementer" in failed.stderr
    listed = run_cli("schedules", "--app", SCHEDULED, "--url", backend.url, "--json")
    assert listed.returncode == 0, listed.stderr
    (every,) = json.loads(listed.stdout)
    assert (every["name"], every["cron"], every["misfire"]) == (
        "every-second",
        "* * * * * *",
        "latest",
    )


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("submit", "nosuch"), "no job named 'nosuch' is registered"),
        (("submit", "tick", "oops"), "bad job parameter 'oops'"),
        (("submit", "tick", "--next"), "job 'tick' has no incrementer"),
        (("schedules", "--cron", "0 25 * * *"), "cron hour field: 25 is out of range 0-23"),
        (("schedules", "--cron", "0 2 * * *", "--timezone", "Mars/Base"), "unknown time zone"),
        (("schedules", "--cron", "* * * *"), "has 4 fields"),
    ],
)
def test_bad_input_prints_one_line_and_exits_2(
    backend: Backend, args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ("--url", backend.url, "--app", APP) if args[0] == "submit" else ()
    with pytest.raises(SystemExit) as exited:
        main([args[0], *extra, *args[1:]])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, stderr
    assert message in stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 or lines[0].startswith("Usage:"), stderr
