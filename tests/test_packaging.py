"""What a release ships: the sdist and the wheel, built as a user's pip would build them, carry
the license text and py.typed, the version is one number everywhere, the pytest plugin is
opt-in, and the extras give a provider author only what the shipped suite needs."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import dbcluster

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("build", reason="the dev extra (python -m build) is not installed")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("dbcluster-*.tar.gz")
    (wheel,) = out.glob("dbcluster-*.whl")
    return sdist, wheel


def test_the_sdist_and_the_wheel_carry_the_license_and_py_typed(built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    version = dbcluster.__version__
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text  # the full text, not a pointer to it
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        assert f"dbcluster-{version}/LICENSE" in names
        assert f"dbcluster-{version}/dbcluster/py.typed" in names
        shipped = tar.extractfile(f"dbcluster-{version}/LICENSE")
        assert shipped is not None and shipped.read().decode() == license_text
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        info = f"dbcluster-{version}.dist-info"
        assert "dbcluster/py.typed" in names
        assert whl.read(f"{info}/licenses/LICENSE").decode() == license_text
        metadata = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    assert metadata["Version"] == version == PYPROJECT["project"]["version"] == "0.2.0"
    assert metadata["License-Expression"] == "Apache-2.0"
    # The pytest plugin is opt-in: no pytest11 entry point loads it into every pytest.
    assert "pytest11" not in entry_points and "dbcluster = dbcluster.cli:main" in entry_points
    # chaos and bench join the CLI through its entry points, not an import (docs/cli.md).
    assert "[dbcluster.commands]" in entry_points
    assert "chaos = dbcluster.testing.chaos_command:chaos" in entry_points
    assert "bench = dbcluster.bench.command:bench" in entry_points
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"conformance", "test", "dev"} <= extras


def test_a_provider_author_installs_only_what_the_suite_needs() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["conformance"] == ["pytest>=8"]
    heavy = ("testcontainers", "ruff", "selenium")
    for name in ("conformance", "test"):
        assert not [d for d in extras[name] if d.startswith(heavy)], name
    assert {d.split(">")[0] for d in extras["dev"]} >= {"dbcluster[test]", *heavy}
    assert "pytest11" not in PYPROJECT["project"].get("entry-points", {})
    # CI installs what its steps use.
    ci = (ROOT / ".ci" / "run").read_text()
    assert '-e ".[dev,metrics,otel,web]"' in ci


def test_the_suite_runs_with_the_plugin_named_and_only_then(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'suite.db'}"
    suite = ["--pyargs", "dbcluster.testing.suite", "--dbcluster-url", url]
    quick = ["-p", "no:cacheprovider", "-q", "-k", "ddl_covers_every_table", "-n", "0"]
    with_plugin = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "dbcluster.testing.plugin", *quick, *suite],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert with_plugin.returncode == 0, with_plugin.stdout[-3000:] + with_plugin.stderr[-2000:]
    assert "1 passed" in with_plugin.stdout
    without = subprocess.run(
        [sys.executable, "-m", "pytest", *quick, *suite],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert without.returncode != 0 and "unrecognized arguments: --dbcluster-url" in without.stderr


def test_the_installed_wheel_runs_its_commands_and_those_of_its_entry_points(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    """The wheel installed on its own (its dependencies are this environment's): the
    ``dbcluster`` script answers, and chaos and bench, found through the wheel's entry points."""
    _, wheel = built
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBCLUSTER_")}
    env["PYTHONPATH"] = str(target)  # ahead of this checkout's editable install
    where = subprocess.run(
        [sys.executable, "-c", "import dbcluster.cli; print(dbcluster.cli.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert where.stdout.startswith(str(target)), where.stdout + where.stderr
    for args, expected in (
        ([], "Commands:"),
        (["chaos"], "Usage: dbcluster chaos"),
        (["bench"], "Usage: dbcluster bench"),
    ):
        shown = subprocess.run(
            [sys.executable, str(target / "bin" / "dbcluster"), *args, "--help"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        assert shown.returncode == 0 and expected in shown.stdout, shown.stdout + shown.stderr
        assert "Cannot be loaded" not in shown.stdout, shown.stdout
