"""Commands ride out a database outage (issue 34): a command that connects tries again while the
database is away, one warning line when the outage begins (later tries are DEBUG records), one
info line when it ends, no traceback, and exits 3 ("database unavailable") after
``--connect-timeout``; one issued while the server is away carries on once it
is back. The server "coming back" is a loopback port that refuses connections until the test
opens it (tcp_proxy.py): no sleeps, no restart of a shared server."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cli_helpers import APP, cli, cli_env, run_cli, stop_process, wait_for
from sqlalchemy.engine import make_url
from tcp_proxy import ComingBack

from dbcluster.testing.backends import Backend

SECRET = "s3cret"
LEDGER_APP = "dbcluster.testing.app:chaos_registry"
#: A warning line: printed (a command that does not log), or a WARNING record (a worker).
WARNING = re.compile(
    r"^(warning: |\S+ WARNING dbcluster\.cli: )database unavailable \((?P<what>[^)]+)\): "
)
#: The line that says the database answered again (printed, or an INFO record).
BACK = re.compile(
    r"^(info: |\S+ INFO dbcluster\.cli: )database available again \((?P<what>[^)]+)\): "
    r".* \(after [0-9.]+ s, (?P<tries>\d+) tries\)$"
)


@pytest.fixture
def down() -> Iterator[ComingBack]:
    """A port where the database is away (refused) until the test brings it back."""
    with ComingBack() as port:
        yield port


def _lines(stderr: str) -> tuple[list[str], list[str], list[str]]:
    """The warning lines, the "available again" lines and the other lines."""
    warnings, back, other = [], [], []
    for line in stderr.strip().splitlines():
        if WARNING.match(line):
            warnings.append(line)
        elif BACK.match(line):
            back.append(line)
        else:
            other.append(line)
    return warnings, back, other


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["launch", "--app", APP, "reconcile-receipts", "run=1"],
        ["launch", "--detach", "--app", APP, "reconcile-receipts", "run=1"],
        ["worker", "--app", APP],
        ["submit", "--app", APP, "reconcile-receipts"],
        ["restart", "--app", APP, "1"],
        ["stop", "1"],
        ["init"],
        ["migrate"],
    ],
)
def test_a_command_against_a_server_that_stays_down_exits_3_after_its_connect_timeout(
    command: list[str], down: ComingBack
) -> None:
    url = f"postgresql+psycopg://dbc:{SECRET}@127.0.0.1:{down.port}/nowhere"
    began = time.monotonic()
    proc = run_cli(*command, "--url", url, "--connect-timeout", "1.5s", timeout=60)
    took = time.monotonic() - began
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert took >= 1.5
    assert "Traceback" not in proc.stderr and SECRET not in proc.stderr + proc.stdout
    warnings, back, other = _lines(proc.stderr)
    # One warning for the whole wait (not one per try); then the one error line, which counts
    # the tries.
    assert len(warnings) == 1 and not back, proc.stderr
    assert len(other) == 1, proc.stderr
    assert other[0].startswith(
        f"error: cannot connect to postgresql+psycopg://dbc:***@127.0.0.1:{down.port}/nowhere"
    )
    tried = re.search(r"\(tried (\d+) times in 1\.5 s; see --connect-timeout\)", other[0])
    assert tried and int(tried.group(1)) > 1, other[0]
    assert proc.stdout == ""


def test_the_connect_timeout_comes_from_the_environment_too(down: ComingBack) -> None:
    url = f"postgresql+psycopg://dbc@127.0.0.1:{down.port}/nowhere"
    began = time.monotonic()
    proc = run_cli("status", "--url", url, timeout=60, DBCLUSTER_CONNECT_TIMEOUT="1")
    assert proc.returncode == 3 and time.monotonic() - began >= 1, proc.stderr
    assert "(tried" in proc.stderr and "unknown" not in proc.stderr  # a known variable


def test_a_bad_connect_timeout_is_a_usage_error() -> None:
    proc = run_cli("status", "--url", "sqlite://", "--connect-timeout", "soon")
    assert proc.returncode == 2 and "--connect-timeout" in proc.stderr, proc.stderr


def test_json_logs_make_each_try_a_json_warning(down: ComingBack) -> None:
    url = f"postgresql+psycopg://dbc@127.0.0.1:{down.port}/nowhere"
    proc = run_cli(
        "worker", "--app", APP, "--url", url, "--connect-timeout", "1", "--log-format", "json"
    )
    records = [json.loads(line) for line in proc.stderr.strip().splitlines()]
    assert proc.returncode == 3
    assert [r["level"] for r in records] == ["WARNING", "ERROR"], records
    assert records[0]["message"].startswith("database unavailable (connect): ")
    assert "cannot connect" in records[-1]["message"]


class Reader:
    """A process's stderr lines, read as they come (the test waits on them, with a deadline)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stderr is not None
        stream = proc.stderr
        self._thread = threading.Thread(
            target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True
        )
        self._thread.start()

    def text(self) -> str:
        self._thread.join(timeout=30)
        return "".join(self.lines)


def _through(port: ComingBack, backend: Backend) -> str:
    return (
        make_url(backend.url)
        .set(host="127.0.0.1", port=port.port)
        .render_as_string(hide_password=False)
    )


def _start(*args: str, **env: str) -> tuple[subprocess.Popen[str], Reader]:
    proc = subprocess.Popen(
        cli(*args),
        env=cli_env(**env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, Reader(proc)


def _stdout(proc: subprocess.Popen[str], timeout: float) -> str:
    """The process's stdout once it has ended (its stderr is the Reader's alone: communicate()
    would read some of its lines too)."""
    assert proc.stdout is not None
    proc.wait(timeout=timeout)
    return proc.stdout.read()


def _warned(reader: Reader, proc: subprocess.Popen[Any]) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"exited {proc.returncode} before the server came back: {reader.text()}")
    return any(WARNING.match(line) for line in reader.lines)


@pytest.mark.backends("postgresql", "mariadb")
def test_status_issued_while_the_server_is_away_answers_once_it_is_back(
    backend: Backend, down: ComingBack
) -> None:
    proc, reader = _start("status", "--json", "--url", _through(down, backend))
    try:
        wait_for(lambda: _warned(reader, proc), 60, "the first warning")
        real = make_url(backend.url)
        down.come_back(real.host or "127.0.0.1", int(real.port or 0))
        out = _stdout(proc, 60)
    finally:
        stop_process(proc)
    stderr = reader.text()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    warnings, back, other = _lines(stderr)
    # The outage: one warning as it began, one line as it ended, nothing else.
    assert len(warnings) == 1 and len(back) == 1 and not other, stderr
    assert "nodes" in json.loads(out)


@pytest.mark.backends("postgresql", "mariadb")
def test_a_detached_launch_issued_while_the_server_is_away_reports_a_committed_execution(
    backend: Backend, ledger_engine: Any, down: ComingBack
) -> None:
    from dbcluster.batch.repository import JobRepository

    url = _through(down, backend)
    proc, reader = _start(
        "launch", "--detach", "--json", "--url", url, "--app", LEDGER_APP, "ledger", "n(int)=2"
    )
    child = None
    try:
        wait_for(lambda: _warned(reader, proc), 60, "the first warning")
        real = make_url(backend.url)
        down.come_back(real.host or "127.0.0.1", int(real.port or 0))
        out = _stdout(proc, 120)
        stderr = reader.text()
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr
        outcome = json.loads(out)
        child = int(outcome["pid"])
        repository = JobRepository(backend.engine)
        # Reported only once it exists: the row is there as the command returns.
        execution = repository.get_job_execution(int(outcome["job_execution_id"]))
        assert execution is not None and execution.job_name == "ledger"

        def ended() -> bool:
            found = repository.get_job_execution(int(outcome["job_execution_id"]))
            return found is not None and not found.status.is_running

        wait_for(ended, 120, "the detached job to end", interval=0.2)
        found = repository.get_job_execution(int(outcome["job_execution_id"]))
        assert found is not None and found.status.value == "COMPLETED"
    finally:
        stop_process(proc)
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.backends("postgresql")
def test_an_admin_shutdown_during_the_schema_check_is_waited_out(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The error a restart gives a session in flight, raw from the driver (as a pool event
    lets it through) or wrapped: a warning and another try, not a traceback with exit 1."""
    import psycopg
    from sqlalchemy.exc import OperationalError

    from dbcluster import migrations
    from dbcluster.cli import main

    real = migrations.require_current_schema
    shutdowns = [
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        OperationalError(
            "SELECT", {}, psycopg.errors.CannotConnectNow("the database system is shutting down")
        ),
    ]

    def restarting(engine: Any) -> None:
        if shutdowns:
            raise shutdowns.pop(0)
        real(engine)

    monkeypatch.setattr(migrations, "require_current_schema", restarting)
    caplog.set_level(logging.DEBUG, logger="dbcluster.cli")
    with pytest.raises(SystemExit) as exited:
        main(["status", "--json", "--url", backend.url])
    assert exited.value.code == 0
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "dbcluster.cli"]
    # One warning as the outage began, the next try a DEBUG record, one INFO as it ended.
    assert [level for level, _ in said] == ["WARNING", "DEBUG", "INFO"], said
    assert "administrator command" in said[0][1] and "shutting down" in said[1][1]
    assert said[2][1].startswith("database available again (connect): ")


@pytest.mark.backends("postgresql")
def test_an_outage_after_the_database_answered_again_is_warned_again(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A command's waits share its connect timeout, not its one warning: the database away
    while the command connects, back, then away again for its next work, is two outages, each
    said as it begins and as it ends (the second was a DEBUG record, then an INFO line saying
    the database was available again that no warning had said was away)."""
    import psycopg

    from dbcluster import migrations, monitor
    from dbcluster.cli import main

    def away_once(real: Any, message: str) -> Any:
        shutdowns = [psycopg.errors.AdminShutdown(message)]

        def restarting(*args: Any) -> Any:
            if shutdowns:
                raise shutdowns.pop(0)
            return real(*args)

        return restarting

    monkeypatch.setattr(
        migrations,
        "require_current_schema",
        away_once(migrations.require_current_schema, "first restart"),
    )
    monkeypatch.setattr(
        monitor, "cluster_status", away_once(monitor.cluster_status, "second restart")
    )
    caplog.set_level(logging.DEBUG, logger="dbcluster.cli")
    with pytest.raises(SystemExit) as exited:
        main(["status", "--json", "--url", backend.url])
    assert exited.value.code == 0
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "dbcluster.cli"]
    assert [level for level, _ in said] == ["WARNING", "INFO", "WARNING", "INFO"], said
    assert "first restart" in said[0][1] and "second restart" in said[2][1], said
    assert said[3][1].startswith("database available again (status): "), said
    assert said[3][1].endswith(", 2 tries)"), said  # its own tries, not the command's


@pytest.mark.backends("postgresql")
def test_an_outage_after_the_first_work_exits_3_in_one_line(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past what a command waits out (here its whole timeout is spent), a raw driver error of
    an outage still ends it with exit 3 and one line."""
    import psycopg

    from dbcluster import monitor
    from dbcluster.cli import main

    def shutdown(*_args: Any) -> None:
        raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")

    monkeypatch.setattr(monitor, "cluster_status", shutdown)
    with pytest.raises(SystemExit) as exited:
        main(["status", "--url", backend.url, "--connect-timeout", "0"])
    err = capsys.readouterr().err
    assert exited.value.code == 3, err
    assert len(err.strip().splitlines()) == 1 and "administrator command" in err, err


@pytest.mark.backends("postgresql")
def test_usage_errors_are_not_waited_out(backend: Backend) -> None:
    """An unknown job, an unknown execution, a wrong database name: exit at once, no warning
    (the default timeout is 60 s)."""
    began = time.monotonic()
    for args, status in (
        (["launch", "--app", APP, "no-such-job", "--url", backend.url], 2),
        (["stop", "999999", "--url", backend.url], 2),
        (
            [
                "status",
                "--url",
                make_url(backend.url)
                .set(database="no_such_db_i34")
                .render_as_string(hide_password=False),
            ],
            3,
        ),
    ):
        proc = run_cli(*args, timeout=50)
        assert proc.returncode == status, (args, proc.stderr)
        assert "warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert time.monotonic() - began < 45


def test_a_node_whose_join_meets_an_outage_leaves_and_is_made_again(tmp_path: Any) -> None:
    """The database went away between a command's connect and its node's joining: the half-made
    node leaves (stopped, its watchers detached) and a new one joins once the database answers."""
    from sqlalchemy.exc import OperationalError

    from dbcluster.cli.node import join
    from dbcluster.dialects import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'join.db'}")
    made: list[Any] = []
    stopped: list[Any] = []
    detached: list[Any] = []

    class HalfMade:
        def start(self) -> None:
            if len(made) == 1:
                raise OperationalError(
                    "register", {}, Exception("lost"), connection_invalidated=True
                )

        def stop(self) -> None:
            stopped.append(self)

    def make() -> Any:
        made.append(HalfMade())
        return made[-1]

    try:
        cluster, detach = join(engine, make, lambda c: lambda: detached.append(c))
    finally:
        engine.dispose()
    assert len(made) == 2 and cluster is made[1]
    assert stopped == [made[0]] and detached == [made[0]]
    detach()
    assert detached == [made[0], made[1]]
