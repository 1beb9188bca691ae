"""Helpers of the HA tests: ``ci/ha.sh`` for the tests' own topology, scratch databases, and
inner pytest runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HA_SCRIPT = ROOT / "ci" / "ha.sh"
#: The tests' own topology: a name and ports apart from the script's defaults (each may be set in
#: the environment, so that two checkouts can run the HA tests side by side).
HA_ENV = {
    name: os.environ.get(name, default)
    for name, default in {
        "HA_NAME": "dbchat",
        "HA_PG_PORT": "25532",
        "HA_GALERA_PORT": "23406",
        "HA_GALERA_GCOMM": "24660",
        "HA_PGB_PORT": "26532",
        "HA_TIMEOUT": "120",
    }.items()
}
_EXPORT = re.compile(r"^export (\w+)='(.*)'$")


def ha_env() -> dict[str, str]:
    return {**os.environ, **HA_ENV}


def ha(*args: str, timeout: float = 300) -> str:
    """Run ``ci/ha.sh ARGS`` for the tests' topology; its stdout (failing the test with its
    stderr if it fails)."""
    done = subprocess.run(
        ["bash", str(HA_SCRIPT), *args],
        env=ha_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"ci/ha.sh {' '.join(args)} failed:\n{done.stderr[-3000:]}", pytrace=False)
    return done.stdout


def ha_command(*args: str) -> str:
    """A command line for chaos's --db-* options that runs ci/ha.sh on the tests' topology."""
    settings = " ".join(f"{k}={v}" for k, v in HA_ENV.items())
    return f"env {settings} bash {HA_SCRIPT} {' '.join(args)}"


def parse_urls(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in map(_EXPORT.match, text.splitlines()) if m}


def with_database(url: str, name: str) -> str:
    """``url`` (one server, or a libpq multi-host URL) pointed at database ``name``."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


def scratch_database(url: str, prefix: str) -> str:
    """A new empty database on the server(s) of ``url``; its URL."""
    from sqlalchemy import text

    from dbcluster.dialects import make_engine

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = make_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    finally:
        admin.dispose()
    return with_database(url, name)


def run_pytest(args: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """An inner pytest run (one process, no cache); its exit code and output."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def passed_count(output: str) -> int:
    found = re.search(r"(\d+) passed", output)
    return int(found.group(1)) if found else 0


#: The cluster tests that matter under a new topology: claims, fencing, takeover, stop,
#: schedules (each in-process cluster test against one backend URL).
CLUSTER_TESTS = [
    "tests/cluster/test_claim_recovery.py",
    "tests/cluster/test_fencing.py",
    "tests/cluster/test_takeover.py",
    "tests/cluster/test_stop.py",
    "tests/cluster/test_schedule_processes.py",
]
CLASSIC = [str(k) for k in range(1, 7)]


def inner_env(**urls: str) -> dict[str, str]:
    """The environment of an inner pytest run: only the given backend URLs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBCLUSTER_TEST_")}
    env.update(urls)
    env["DBCLUSTER_TEST_CONTAINERS"] = "0"
    env["DBCLUSTER_TEST_TIME_SCALE"] = os.environ.get("DBCLUSTER_TEST_TIME_SCALE", "4")
    return env


def violated(summary: dict, keys: list[str]) -> dict[str, list]:
    """The violations of the named invariants in a chaos summary (empty: all held)."""
    invariants = summary["invariants"]
    return {k: invariants[k]["violations"] for k in keys if not invariants[k]["held"]}


#: Node thresholds above a database outage of these topologies, measured on this loaded 2-core
#: machine (a switchover 1-4 s, a restart 4-8 s; a killed Galera node until it is Synced again
#: 16-20 s): an outage shorter than these must cost no job anything (issue 34).
OUTLAST_PG = {"DBCLUSTER_UNREACHABLE_THRESHOLD": "10000", "DBCLUSTER_CLEANUP_THRESHOLD": "20000"}
OUTLAST_GALERA = {
    "DBCLUSTER_UNREACHABLE_THRESHOLD": "30000",
    "DBCLUSTER_CLEANUP_THRESHOLD": "60000",
}


def failed_executions(summary: dict) -> dict[str, list[str]]:
    """Jobs whose executions are not exactly one COMPLETED (a job failed and was restarted)."""
    return {k: v for k, v in summary["executions_by_job"].items() if v != ["COMPLETED"]}


def assert_cluster_tests_pass(backend: str, url: str, time_scale: str | None = None) -> None:
    """:data:`CLUSTER_TESTS` on ``backend`` (its ``DBCLUSTER_TEST_<NAME>_URL`` set to ``url``),
    in an inner pytest run that must pass and pass something; ``time_scale`` overrides the
    thresholds' scale of that run."""
    env = inner_env(**{f"DBCLUSTER_TEST_{backend.upper()}_URL": url})
    if time_scale is not None:
        env["DBCLUSTER_TEST_TIME_SCALE"] = time_scale
    code, out = run_pytest([*CLUSTER_TESTS, "-k", backend], env, timeout=1800)
    assert code == 0, out[-6000:]
    assert passed_count(out) > 0, out[-2000:]


def assert_suite_passes(url: str) -> None:
    """The shipped conformance suite (``dbcluster.testing.suite``) against ``url``."""
    code, out = run_pytest(
        ["--pyargs", "dbcluster.testing.suite", "--dbcluster-url", url], inner_env(), 1200
    )
    assert code == 0, out[-6000:]
    assert passed_count(out) > 0, out[-2000:]


def chaos_run(
    urls: str | list[str],
    seed: int,
    kinds: tuple[str, ...],
    faults: int,
    workdir: Path,
    control: Any,
    env: dict[str, str] | None = None,
) -> dict:
    """A short chaos run (3 workers, 4 jobs) with these fault kinds; its summary."""
    from dbcluster.testing.chaos import run_chaos

    return run_chaos(
        urls,
        nodes=3,
        jobs=4,
        faults=faults,
        seed=seed,
        kinds=kinds,
        db_control=control,
        workdir=workdir,
        settle_timeout=240,
        env=env,
    )
