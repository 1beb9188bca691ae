"""A third-party provider registered through the ``dbcluster.dialects`` entry point is picked up
from its URL and passes the conformance suite, run with the documented command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "thirdparty"


def install(package: Path, site: Path) -> Path:
    """Install the package into ``site`` as an installer would (its modules plus a
    ``.dist-info`` with the entry points its pyproject declares), without build tools or a
    network, so that ``importlib.metadata`` finds its entry points on ``sys.path``."""
    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    for module in project.get("entry-points", {}).get("dbcluster.dialects", {}).values():
        top = module.split(":")[0].split(".")[0]
        shutil.copytree(package / top, site / top)
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project.get("entry-points", {})
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) + "\n"
            for group, points in groups.items()
        )
    )
    return site


def test_an_entry_point_provider_is_found_from_its_url_and_passes_the_suite(tmp_path: Path) -> None:
    site = install(PACKAGE, tmp_path / "site")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    url = f"sqlitex:///{tmp_path}/suite.db"
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from dbcluster.dialects import provider_for_url; "
            "print(type(provider_for_url(sys.argv[1])).__module__)",
            url,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert found.stdout.strip() == "sqlitex_provider", found.stdout + found.stderr
    suite = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--pyargs",
            "dbcluster.testing.suite",
            "--dbcluster-url",
            url,
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert suite.returncode == 0, suite.stdout[-5000:] + suite.stderr[-2000:]
    assert " passed" in suite.stdout and " failed" not in suite.stdout, suite.stdout[-3000:]
