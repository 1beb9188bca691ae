"""``dbcluster prune`` on a SQLite file: what it prints, and one line and exit 2 for bad input."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from cli_helpers import APP, run_cli
from sqlalchemy import func, select

from dbcluster import schema
from dbcluster.dialects import make_engine
from dbcluster.testing.history import add_execution


@pytest.fixture
def history_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    engine = make_engine(url)
    schema.metadata.create_all(engine)
    add_execution(engine, "nightly", "old", partitions_count=3)
    add_execution(engine, "nightly", "young", ended_ago=timedelta(hours=1))
    engine.dispose()
    return url


def _executions(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(schema.job_execution)).scalar_one()
            )
    finally:
        engine.dispose()


def test_dry_run_then_prune(history_url: str) -> None:
    dry = run_cli("prune", "--url", history_url, "--older-than", "30d", "--dry-run", timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "would delete 1 job execution(s)" in dry.stdout
    assert "batch_partitions" in dry.stdout and "3" in dry.stdout
    assert _executions(history_url) == 2
    done = run_cli("prune", "--url", history_url, "--older-than", "30d", "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["executions"] == 1 and not report["dry_run"]
    assert report["rows"]["batch_partitions"] == 3
    assert report["rows"]["batch_step_execution"] == 4
    assert report["rows"]["batch_job_instance"] == 1
    assert _executions(history_url) == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--older-than", "-5d"], "must not be negative"),
        (["--older-than", "30"], "invalid age '30'"),
        (["--older-than", "30d", "--status", "STARTED"], "invalid --status"),
        (["--older-than", "30d", "--keep-last", "-1"], "--keep-last must be 0 or more"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    history_url: str, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from dbcluster.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["prune", "--url", history_url, *args])
    out, err = capsys.readouterr()
    message = err.strip()
    assert exited.value.code == 2, (out, err)
    assert "Traceback" not in err and len(message.splitlines()) == 1, message
    assert expected in message, message
    assert _executions(history_url) == 2


def test_worker_refuses_a_bad_prune_age(history_url: str) -> None:
    proc = run_cli("worker", "--url", history_url, "--app", APP, "--prune-after", "soon")
    assert proc.returncode == 2 and "invalid age 'soon'" in proc.stderr
    assert "Traceback" not in proc.stderr
