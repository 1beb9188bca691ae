"""Errors a user can make: one clear line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import pytest
from cli_helpers import APP, cli, cli_env, run_cli

from dbcluster.batch import JobRepository
from dbcluster.dialects import make_engine
from dbcluster.schema import metadata

UNREACHABLE = "postgresql+psycopg://dbc:s3cret@127.0.0.1:9/nowhere"


@pytest.fixture(scope="module")
def ready_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite database with the dbcluster tables and no jobs."""
    url = f"sqlite:///{tmp_path_factory.mktemp('cli-errors') / 'ready.db'}"
    engine = make_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    return url


def assert_user_error(args: list[str], *expected: str, status: int = 2) -> str:
    proc = run_cli(*args, timeout=30)
    message = proc.stderr.strip()
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(message.splitlines()) == 1, message
    assert proc.stdout == ""
    for text in expected:
        assert text in message, message
    return message


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["launch", "--app", APP, "reconcile-receipts", "run=1", "--json"],
        ["worker", "--app", APP],
        ["submit", "--app", APP, "reconcile-receipts"],
        ["stop", "1"],
        ["migrate"],
        ["web"],
    ],
)
def test_unreachable_database_exits_3(command: list[str]) -> None:
    """Exit status 3 is "the database is unavailable" (2 is a usage error), one line (with
    --connect-timeout 0 it tries once; tests/cli/test_cli_outage.py waits)."""
    message = assert_user_error(
        [*command, "--url", UNREACHABLE, "--connect-timeout", "0"], "cannot connect to", status=3
    )
    assert "s3cret" not in message and "dbc:***@127.0.0.1:9" in message


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["jobs"],
        ["job", "1", "--json"],
        ["launch", "--app", APP, "reconcile-receipts", "run=1"],
        ["restart", "--app", APP, "1"],
        ["worker", "--app", APP],
    ],
)
def test_tables_missing_says_to_run_init(command: list[str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert_user_error([*command, "--url", url], "no dbcluster tables", "dbcluster init")


@pytest.mark.parametrize(
    ("command", "app", "expected"),
    [
        ("launch", "no_such_module_xyz:registry", "cannot import module 'no_such_module_xyz'"),
        ("restart", "dbcluster.demo:no_such_registry", "has no attribute 'no_such_registry'"),
        ("worker", "dbcluster.demo", "must look like 'package.module:attribute'"),
    ],
)
def test_app_not_importable(command: str, app: str, expected: str, ready_url: str) -> None:
    extra = {"launch": ["reconcile-receipts"], "restart": ["1"], "worker": []}[command]
    assert_user_error([command, "--url", ready_url, "--app", app, *extra], expected)


def test_unknown_job(ready_url: str) -> None:
    assert_user_error(
        ["launch", "--url", ready_url, "--app", APP, "no-such-job", "--json"],
        "no job named 'no-such-job'",
        "reconcile-receipts",
    )


@pytest.mark.parametrize(
    ("param", "expected"),
    [
        ("oops", "bad job parameter 'oops'"),
        ("n(int)=twelve", "bad job parameter 'n(int)=twelve': cannot read 'twelve' as int"),
    ],
)
def test_bad_parameter_syntax(param: str, expected: str, ready_url: str) -> None:
    assert_user_error(
        ["launch", "--url", ready_url, "--app", APP, "reconcile-receipts", param], expected
    )


@pytest.mark.parametrize("command", [["job", "999"], ["restart", "--app", APP, "999"]])
def test_unknown_execution(command: list[str], ready_url: str) -> None:
    assert_user_error([*command, "--url", ready_url], "no job execution with id 999")


def test_unsupported_url() -> None:
    assert_user_error(["status", "--url", "informix://u:pw@h/db"], "supported:")


def test_launch_next_increments_the_run_id_and_a_validator_refuses_bad_parameters(
    ready_url: str,
) -> None:
    app = ["--url", ready_url, "--app", "next_app:registry"]
    path = str(Path(__file__).resolve().parent)
    repository = JobRepository(make_engine(ready_url))
    for run_id in (1, 2):
        proc = run_cli("launch", *app, "daily", "region=eu", "--next", "--json", PYTHONPATH=path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        last = repository.get_last_job_instance_execution("daily")
        assert last is not None and dict(last.parameters) == {"region": "eu", "run.id": run_id}
    repository.engine.dispose()
    proc = run_cli("launch", *app, "daily", "--next", "other=1", timeout=30, PYTHONPATH=path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    message = proc.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "'other' is not a parameter of this job" in message, message


def test_a_connection_lost_during_a_command_exits_3_in_one_line(
    ready_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sqlalchemy.exc import OperationalError

    from dbcluster import monitor
    from dbcluster.cli import main

    def lost(engine: object) -> None:
        raise OperationalError(
            "SELECT ...", {}, Exception("server closed the connection unexpectedly\nmore")
        )

    monkeypatch.setattr(monitor, "cluster_status", lost)
    with pytest.raises(SystemExit) as exited:
        main(["status", "--url", ready_url])
    err = capsys.readouterr().err
    assert exited.value.code == 3, err
    assert (
        err.strip()
        == "error: the database is unavailable: server closed the connection unexpectedly"
    )


def test_an_in_process_command_leaves_the_url_out_of_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A command's ``--url`` is ``DBCLUSTER_URL`` for its own resources; called in-process it
    must not stay there (a later command given ``--dialect`` then also saw a URL and refused)."""
    from dbcluster.cli import main

    monkeypatch.delenv("DBCLUSTER_URL", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["init", "--url", f"sqlite:///{tmp_path / 'jobs.db'}"])
    assert exit_.value.code == 0
    assert "DBCLUSTER_URL" not in os.environ


FAILING_APP = """
from dbcluster import ChunkContext, JobRegistry

registry = JobRegistry()


@registry.partitioned_job(ids=range(1, 100), partitions=2, chunk_size=10)
def boom(ids: range, ctx: ChunkContext) -> None:
    if ids[0] > 50:
        raise ValueError(f"bad row {ids[0]}")
"""


def test_a_failed_partition_s_reason_is_in_the_summary_and_in_job(tmp_path: Path) -> None:
    """The job's own reason names the partitions that failed, not why: the launch's summary and
    `dbcluster job` give each failed partition's exception (it was only in `job --json`)."""
    (tmp_path / "failing.py").write_text(FAILING_APP)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = cli_env(DBCLUSTER_URL=url)
    run = functools.partial(subprocess.run, capture_output=True, text=True, env=env, timeout=60)
    assert run(cli("init"), cwd=tmp_path).returncode == 0
    launched = run(cli("launch", "-q", "--app", "failing:registry", "boom"), cwd=tmp_path)
    assert launched.returncode == 1, launched.stderr
    assert "FAILED" in launched.stdout
    assert "failed boom-slice" not in launched.stdout  # partitions by name, not step name
    assert re.search(
        r"failed ids-50-100 on \S+ \(attempt 1\): ValueError: bad row 60", launched.stdout
    ), launched.stdout
    shown = run(cli("job", "1"), cwd=tmp_path, env={**env, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "Failures (1)" in shown.stdout and "ValueError: bad row 60" in shown.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["job", "1"], "Missing option '--url' (or set DBCLUSTER_URL)."),
        (["launch", "--url", "sqlite://", "x"], "Missing option '--app' (or set DBCLUSTER_APP)."),
    ],
)
def test_a_missing_url_or_app_names_its_environment_variable(
    args: list[str], expected: str
) -> None:
    proc = run_cli(*args, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"Error: {expected}", proc.stderr
