"""``dbcluster submit`` (with a worker that accepts launches) and ``dbcluster schedules``, and the
one-line errors of both."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli, cli_env, run_cli, wait_for
from sqlalchemy import select

from dbcluster.cli import main
from dbcluster.schema import launch_requests, nodes
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
    # What only the accepting node can judge fails there, with its reason: an instance that
    # already completed.
    tick = ("submit", "--url", backend.url, "--app", APP, "tick", "run=1", "--wait")
    assert run_cli(*tick, "--timeout", "30s").returncode == 0
    failed = run_cli(*tick, "--timeout", "30s")
    assert failed.returncode == 1, failed.stderr
    assert "already completed" in failed.stderr
    listed = run_cli("schedules", "--app", SCHEDULED, "--url", backend.url, "--json")
    assert listed.returncode == 0, listed.stderr
    (every,) = json.loads(listed.stdout)
    assert (every["name"], every["cron"], every["misfire"]) == (
        "every-second",
        "* * * * * *",
        "latest",
    )


@pytest.mark.backends("sqlite")
def test_submit_of_an_unknown_job_exits_2_naming_the_known_jobs(backend: Backend) -> None:
    # The application comes from DBCLUSTER_APP, as it does for the workers.
    proc = run_cli("submit", "nosuchjob", DBCLUSTER_URL=backend.url, DBCLUSTER_APP=APP)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: no job named 'nosuchjob' is registered (known: counter, ")
    assert line.endswith(", tick)") and ", ledger, " in line
    # Without an application to check it against, submit says what it needs (and writes no
    # request that no node would ever claim).
    bare = run_cli("submit", "nosuchjob", DBCLUSTER_URL=backend.url)
    assert bare.returncode == 2 and "give --app module:attribute" in bare.stderr
    assert "Traceback" not in bare.stderr
    with backend.engine.connect() as conn:
        assert conn.execute(select(launch_requests)).first() is None


@pytest.mark.backends("sqlite")
def test_submit_wait_gives_up_after_its_timeout_and_says_why(backend: Backend) -> None:
    """No node accepts launches here: the request stays PENDING. --wait says so and gives up at
    --timeout (its default is an hour, not for ever), exit 1."""
    proc = run_cli(
        "submit", "--url", backend.url, "--app", APP, "tick", "run=2", "--wait", "--timeout",
        "1500ms", "--json",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "launch request 1 submitted; waiting"
    # After the time it waited (1.5 s, or more on a loaded host).
    assert re.search(r"is still PENDING after [\d.]+s: no node has claimed it", lines[1]), lines
    assert "`dbcluster worker --accept-launches` whose app has job 'tick'" in lines[1]
    assert lines[2] == (
        "launch request 1: gave up waiting after 1.5s (the request is still PENDING; "
        "--timeout waits longer)"
    )
    assert json.loads(proc.stdout) == {
        "request_id": 1,
        "job_execution_id": None,
        "status": "PENDING",
        "timed_out": True,
    }
    from dbcluster.cli.submit import submit

    timeout = next(p for p in submit.params if p.name == "timeout")
    assert timeout.default == "1h" and timeout.type.convert("1h", None, None) == 3600.0


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("submit", "nosuch"), "no job named 'nosuch' is registered (known: counter, ledger"),
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
