"""Helpers for driving the ``dbcluster`` command as a subprocess (imported by the tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

APP = "dbcluster.demo:registry"

#: Short thresholds for worker and launch subprocesses.
FAST_ENV = {
    "DBCLUSTER_HEARTBEAT_INTERVAL": "200",
    "DBCLUSTER_TASK_POLLING_INTERVAL": "100",
    "DBCLUSTER_UNREACHABLE_THRESHOLD": "2000",
    "DBCLUSTER_CLEANUP_THRESHOLD": "4000",
    "DBCLUSTER_SWEEP_INTERVAL": "200",
    "DBCLUSTER_MASTER_CHECK_INTERVAL": "100",
    "DBCLUSTER_ORPHAN_CHECK_INTERVAL": "200",
    "DBCLUSTER_STRANDED_MASTER_SCAN_INTERVAL": "500",
    "DBCLUSTER_DRAIN_TIMEOUT": "3000",
}


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBCLUSTER_")}
    # Keep the backend URLs the fixtures read; drop anything that would steer the command.
    env.update({k: v for k, v in os.environ.items() if k.startswith("DBCLUSTER_TEST_")})
    env.update(FAST_ENV)
    env.update(extra)
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dbcluster.cli", *args]


def run_cli(*args: str, timeout: float = 60, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli(*args), capture_output=True, text=True, timeout=timeout, env=cli_env(**extra_env)
    )


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL, by pid."""
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class PidProcess:
    """A process this test did not start itself (a detached master), handled by pid like a
    :class:`subprocess.Popen` in :func:`stop_process`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else 3600)
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        return 0


def dbcluster_script() -> str:
    """The installed ``dbcluster`` command, as a user runs it. A console script puts its own
    folder on ``sys.path``, not the current directory (``python -m`` would): what ``--app``
    finds from there is what a user's shell finds."""
    script = Path(sys.executable).with_name("dbcluster")
    if not script.exists():
        pytest.fail(f"no dbcluster command beside {sys.executable}: install the project")
    return str(script)


def start_in(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``args`` in ``cwd`` with its output in ``log`` (the caller ends it by pid)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )


def wait_until_running(proc: subprocess.Popen[Any], log: Path, timeout: float = 60) -> None:
    """Wait until a ``dbcluster worker`` says it runs (it joined the cluster)."""

    def running() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"worker exited {proc.returncode}: {log.read_text()[-3000:]}")
        return "running; SIGTERM" in log.read_text(errors="replace")

    wait_for(running, timeout, f"the worker logging to {log.name} to join")


@contextmanager
def fresh_database(backend: Any, folder: Path) -> Iterator[str]:
    """The URL of an empty database on the backend's server (a new SQLite file in ``folder``
    for SQLite), dropped afterwards: what a new user's ``dbcluster init`` starts from."""
    if backend.name == "sqlite":
        yield f"sqlite:///{folder / 'jobs.db'}"
        return
    from dbcluster.dialects import get_provider, make_engine

    admin = make_engine(backend.url, isolation_level="AUTOCOMMIT")
    provider = get_provider(admin)
    scratch = provider.create_scratch_database(admin, f"dbc_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    try:
        yield scratch.render_as_string(hide_password=False)
    finally:
        try:
            provider.drop_scratch_database(admin, scratch)
        finally:
            admin.dispose()
