"""The command line's conventions (docs/cli.md): durations with units, a warning for a
misspelled variable, log levels and JSON log lines, times in UTC with a Z in every JSON output,
and a warning for a dashboard open to the network."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import pytest
from cli_helpers import APP, cli, cli_env, run_cli, stop_process, wait_for
from sqlalchemy import func, select

from dbcluster.cli.options import DURATION_MS, DURATION_S
from dbcluster.cluster import ClusterSettings
from dbcluster.cluster import settings as settings_module
from dbcluster.errors import ConfigurationError
from dbcluster.schema import nodes
from dbcluster.testing.backends import Backend


@pytest.mark.parametrize(
    ("raw", "ms"),
    [("3000", 3000), ("500ms", 500), ("30s", 30_000), ("1.5s", 1500), ("2m", 120_000),
     ("1h", 3_600_000), ("30d", 2_592_000_000), (" 45 S ", 45_000)],
)  # fmt: skip
def test_a_duration_variable_takes_units_and_a_bare_number_is_milliseconds(
    raw: str, ms: int
) -> None:
    env = {"DBCLUSTER_DRAIN_TIMEOUT": raw, "DBCLUSTER_PRUNE_AFTER": raw}
    settings = ClusterSettings.from_env(env)
    assert settings.drain_timeout == ms and settings.prune_after == ms


def test_every_millisecond_setting_takes_a_duration() -> None:
    env = {
        "DBCLUSTER_HEARTBEAT_INTERVAL": "1s",
        "DBCLUSTER_TASK_POLLING_INTERVAL": "250ms",
        "DBCLUSTER_UNREACHABLE_THRESHOLD": "12s",
        "DBCLUSTER_CLEANUP_THRESHOLD": "1m",
        "DBCLUSTER_SWEEP_INTERVAL": "5s",
        "DBCLUSTER_MASTER_CHECK_INTERVAL": "500ms",
        "DBCLUSTER_ORPHAN_CHECK_INTERVAL": "1s",
        "DBCLUSTER_STRANDED_MASTER_SCAN_INTERVAL": "10s",
        "DBCLUSTER_DRAIN_TIMEOUT": "2m",
        "DBCLUSTER_NO_NODE_TIMEOUT": "90s",
        "DBCLUSTER_IDLE_TRANSACTION_TIMEOUT": "8s",
        "DBCLUSTER_WORK_STEALING_DELAY": "5s",
        "DBCLUSTER_PRUNE_INTERVAL": "1h",
        "DBCLUSTER_CONCURRENCY_LIMIT": "4",
        "DBCLUSTER_PREFETCH_MULTIPLIER": "2",
    }
    s = ClusterSettings.from_env(env)
    assert (s.heartbeat_interval, s.task_polling_interval, s.unreachable_threshold) == (
        1000,
        250,
        12_000,
    )
    assert (s.cleanup_threshold, s.sweep_interval, s.master_check_interval) == (60_000, 5000, 500)
    assert (s.orphan_check_interval, s.stranded_master_scan_interval) == (1000, 10_000)
    assert (s.drain_timeout, s.no_node_timeout, s.idle_transaction_timeout) == (
        120_000,
        90_000,
        8000,
    )
    assert (s.work_stealing_delay, s.prune_interval) == (5000, 3_600_000)
    assert (s.concurrency_limit, s.prefetch_multiplier) == (4, 2)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DBCLUSTER_DRAIN_TIMEOUT": "soon"}, "invalid DBCLUSTER_DRAIN_TIMEOUT 'soon'"),
        ({"DBCLUSTER_DRAIN_TIMEOUT": "30x"}, "e.g. 500ms, 30s, 2m, 1h, 30d"),
        ({"DBCLUSTER_DRAIN_TIMEOUT": "-5s"}, "must not be negative"),
        ({"DBCLUSTER_CONCURRENCY_LIMIT": "4s"}, "DBCLUSTER_CONCURRENCY_LIMIT must be a whole"),
    ],
)
def test_a_bad_duration_names_its_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ClusterSettings.from_env(env)


def test_duration_options_keep_their_bare_unit() -> None:
    assert DURATION_MS.convert("3000", None, None) == 3000
    assert DURATION_MS.convert("3s", None, None) == 3000
    assert DURATION_S.convert("30", None, None) == 30.0  # seconds, as these options took
    assert DURATION_S.convert("500ms", None, None) == 0.5
    assert DURATION_S.convert("2m", None, None) == 120.0
    with pytest.raises(click.BadParameter, match="use a number and a unit"):
        DURATION_S.convert("soon", None, None)


def test_the_duration_options_of_the_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_cli("init", "--url", url).returncode == 0
    # stop --timeout and submit --timeout take durations; a bad one is one usage line.
    for args in (
        ["stop", "1", "--wait", "--timeout", "soon"],
        ["submit", "--app", APP, "reconcile-receipts", "--wait", "--timeout", "soon"],
        ["web", "--refresh", "soon"],
    ):
        proc = run_cli(*args, "--url", url)
        assert proc.returncode == 2 and "Invalid value for '--" in proc.stderr, proc.stderr
        assert "use a number and a unit" in proc.stderr and "Traceback" not in proc.stderr
    # A variable read at the worker's start: a bad one stops it with one line, exit 2.
    proc = run_cli("worker", "--url", url, "--app", APP, DBCLUSTER_DRAIN_TIMEOUT="2 minutes")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: invalid DBCLUSTER_DRAIN_TIMEOUT '2 minutes': use a number and a unit, e.g. "
        "500ms, 30s, 2m, 1h, 30d (a bare number is milliseconds)"
    ]


def test_a_misspelled_variable_is_named_once_with_the_nearest_name(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_cli("init", "--url", url).returncode == 0
    proc = run_cli(
        "status",
        "--url",
        url,
        "--json",
        DBCLUSTER_HEARTBEAT_INTERVALL="1000",
        DBCLUSTER_NOTHING_LIKE_IT="1",
        DBCLUSTER_WEB_TOKEN="x",  # known: no warning
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "warning: unknown environment variable DBCLUSTER_HEARTBEAT_INTERVALL is ignored (did "
        "you mean DBCLUSTER_HEARTBEAT_INTERVAL?)",
        "warning: unknown environment variable DBCLUSTER_NOTHING_LIKE_IT is ignored",
    ]
    json.loads(proc.stdout)  # the output itself is untouched


def test_settings_from_the_environment_warn_once_in_code(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(settings_module, "_warned", set())
    env = {"DBCLUSTER_CLEANUP_TRESHOLD": "60000"}
    with caplog.at_level("WARNING", logger="dbcluster.settings"):
        ClusterSettings.from_env(env)
        ClusterSettings.from_env(env)
    assert [r.getMessage() for r in caplog.records] == [
        "unknown environment variable DBCLUSTER_CLEANUP_TRESHOLD is ignored (did you mean "
        "DBCLUSTER_CLEANUP_THRESHOLD?)"
    ]


def _z_time(text: str) -> datetime:
    assert text.endswith("Z") and "+" not in text, text
    return datetime.fromisoformat(text[:-1])


@pytest.mark.backends("sqlite")
def test_a_worker_logs_json_lines_with_utc_times(
    backend: Backend, processes: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cli("worker", "--app", APP, "--node-prefix", "jsonlog", "--log-format", "json"),
            env=cli_env(DBCLUSTER_URL=backend.url, DBCLUSTER_HEARTBEAT_INTERVALL="1"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    processes.append(proc)

    def joined() -> bool:
        with backend.engine.connect() as conn:
            found = conn.execute(
                select(func.count()).where(nodes.c.node_id.like("jsonlog-%"))
            ).scalar_one()
        return found == 1 and "running; SIGTERM" in log.read_text()

    wait_for(joined, 30, "the worker to join")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON
    for line in lines:
        assert set(line) >= {"time", "level", "logger", "message"}, line
        _z_time(line["time"])
    messages = [(line["level"], line["message"]) for line in lines]
    assert messages[0] == (
        "WARNING",
        "unknown environment variable DBCLUSTER_HEARTBEAT_INTERVALL is ignored (did you mean "
        "DBCLUSTER_HEARTBEAT_INTERVAL?)",
    )
    assert any(level == "INFO" and "joined the cluster" in m for level, m in messages)
    assert any(level == "INFO" and "left the cluster" in m for level, m in messages)


@pytest.mark.backends("sqlite")
def test_log_level_warning_leaves_out_info(backend: Backend, tmp_path: Path) -> None:
    proc = run_cli(
        "launch", "--url", backend.url, "--app", APP, "no-such-job", "--log-level", "warning",
        "--log-format", "json",
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = [json.loads(text) for text in proc.stderr.splitlines()]
    assert line["level"] == "ERROR" and "no job named 'no-such-job'" in line["message"]
    _z_time(line["time"])


def test_json_outputs_give_times_in_utc_with_a_z(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_cli("init", "--url", url).returncode == 0
    status = run_cli("status", "--url", url, "--json")
    _z_time(json.loads(status.stdout)["db_now"])
    launched = run_cli(
        "launch", "--url", url, "--app", "dbcluster.testing.scheduled:unscheduled", "counter",
        "--next", "--json", "-q",
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-2000:]
    outcome = json.loads(launched.stdout)
    for master in outcome["masters"]:
        _z_time(master["since"])
    (row,) = json.loads(run_cli("jobs", "--url", url, "--json").stdout)
    for key in ("create_time", "start_time", "end_time"):
        if row.get(key) is not None:
            _z_time(row[key])
    detail = json.loads(
        run_cli("job", str(outcome["job_execution_id"]), "--url", url, "--json").stdout
    )
    _z_time(detail["start_time"])
    ticks = json.loads(run_cli("schedules", "--cron", "0 2 * * *", "--json", "--count", "2").stdout)
    assert len(ticks["next"]) == 2
    for tick in ticks["next"]:
        assert _z_time(tick).hour == 2


@pytest.mark.parametrize(("host", "token", "warned"), [
    ("0.0.0.0", None, True),
    ("0.0.0.0", "t0ken", False),
    ("127.0.0.1", None, False),
])  # fmt: skip
def test_a_dashboard_open_to_the_network_without_a_token_warns(
    host: str, token: str | None, warned: bool, tmp_path: Path
) -> None:
    pytest.importorskip("uvicorn", reason="the web extra is not installed")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_cli("init", "--url", url).returncode == 0
    extra = {"DBCLUSTER_WEB_TOKEN": token} if token else {}
    log = tmp_path / "web.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cli("web", "--url", url, "--host", host, "--port", "0"),
            env=cli_env(**extra),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        wait_for(lambda: "dashboard on http://" in log.read_text(), 30, "the dashboard")
    finally:
        stop_process(proc)
    text = log.read_text()
    warning = f"warning: the dashboard listens on {host} without --token"
    assert (warning in text) is warned, text
    if token:
        assert "the token is needed to read and to act" in text and token not in text


def test_the_announced_dashboard_address_takes_connections_at_once(tmp_path: Path) -> None:
    """The address ``dbcluster web`` prints is listening when printed: a client that connects at
    once waits for the server instead of being refused while it starts (a browser test opened
    the page right after the line and got ERR_CONNECTION_REFUSED on a loaded host)."""
    import re
    import socket

    pytest.importorskip("uvicorn", reason="the web extra is not installed")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_cli("init", "--url", url).returncode == 0
    log = tmp_path / "web.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cli("web", "--url", url, "--host", "127.0.0.1", "--port", "0"),
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        found = wait_for(
            lambda: re.search(r"dashboard on http://127\.0\.0\.1:(\d+)/", log.read_text()),
            30,
            "the dashboard's address",
            interval=0.001,
        )
        with socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=30):
            pass
    finally:
        stop_process(proc)
