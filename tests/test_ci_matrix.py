"""The backend matrix workflow and ci/matrix.sh cover the same servers (actionlint, run by
.ci/run, checks the workflow itself)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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
