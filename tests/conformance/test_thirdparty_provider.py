"""Third-party providers registered through the ``dbcluster.dialects`` entry point are picked up
from their URL and pass the conformance suite, run with the documented command.

Two worked examples (``tests/thirdparty/``): ``sqlitex``, SQLite under another URL scheme, and
``filedb``, the one to copy: a dialect named for its database, a port-less URL, its own column
type, install hint and scratch databases (docs/PROVIDERS.md). A third, ``ddlapart``, stands in for
a database whose new table takes no DML until its DDL has committed (Firebird): ``init`` and the
suite must never write a row in a transaction of DDL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "thirdparty"


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


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a Python in which both examples are installed."""
    site = tmp_path_factory.mktemp("site")
    for example in ("sqlitex", "filedb", "ddlapart"):
        install(EXAMPLES / example, site)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }


def run(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, cwd=cwd
    )


def run_suite(env: dict[str, str], url: str, cwd: Path) -> str:
    suite = run(
        env,
        *("-m", "pytest", "-p", "dbcluster.testing.plugin"),
        *("--pyargs", "dbcluster.testing.suite", "--dbcluster-url", url),
        *("-p", "no:cacheprovider", "-q", "-rs"),
        cwd=cwd,
    )
    assert suite.returncode == 0, suite.stdout[-5000:] + suite.stderr[-2000:]
    assert " passed" in suite.stdout and " failed" not in suite.stdout, suite.stdout[-3000:]
    return suite.stdout


def provider_module(env: dict[str, str], url: str) -> str:
    found = run(
        env,
        "-c",
        "import sys; from dbcluster.dialects import provider_for_url; "
        "print(type(provider_for_url(sys.argv[1])).__module__)",
        url,
    )
    return found.stdout.strip() or found.stderr


def test_an_entry_point_provider_is_found_from_its_url_and_passes_the_suite(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = f"sqlitex:///{tmp_path}/suite.db"
    assert provider_module(env, url) == "sqlitex_provider"
    run_suite(env, url, tmp_path)


def test_the_worked_example_is_one_provider_by_url_and_by_name_with_its_own_types(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = f"filedb:///{tmp_path}/jobs.db"
    assert provider_module(env, url) == "dbcluster_filedb"
    by_url = run(env, "-m", "dbcluster.cli", "ddl", "--url", url)
    by_name = run(env, "-m", "dbcluster.cli", "ddl", "--dialect", "filedb")
    sqlite = run(env, "-m", "dbcluster.cli", "ddl", "--dialect", "sqlite")
    assert by_url.returncode == by_name.returncode == sqlite.returncode == 0, by_url.stderr
    assert by_url.stdout == by_name.stdout
    assert by_url.stdout.count("serialized_context CLOB") == 2, by_url.stdout
    assert "CLOB" not in sqlite.stdout and "serialized_context TEXT" in sqlite.stdout
    assert not (tmp_path / "jobs.db").exists(), "ddl connected to the database"
    listed = run(env, "-m", "dbcluster.cli", "ddl", "--help")
    assert "filedb" in listed.stdout and "sqlitex" in listed.stdout, listed.stdout


def test_the_worked_example_names_its_own_driver(env: dict[str, str], tmp_path: Path) -> None:
    result = run(env, "-m", "dbcluster.cli", "init", "--url", f"filedb+apsw:///{tmp_path}/x.db")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "FileDB has no 'apsw' driver" in result.stderr, result.stderr
    assert "dbcluster[" not in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_worked_example_passes_the_suite_in_a_scratch_file_of_its_own(
    env: dict[str, str], tmp_path: Path
) -> None:
    given = tmp_path / "given.db"
    output = run_suite(env, f"filedb:///{given}", tmp_path)
    assert " skipped" not in output, output[-3000:]
    assert not given.exists(), "the suite worked in the given database, not a scratch one"
    assert not list(tmp_path.glob("dbc_*")), "the scratch database was left behind"


def test_a_database_whose_new_tables_take_dml_only_once_committed_refuses_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The stand-in is strict: in one transaction, a row for a table it has just created is
    refused (what ``metadata.create_all`` asks, its version row riding in the DDL's transaction)."""
    script = (
        "import sys\n"
        "from sqlalchemy import text\n"
        "from dbcluster import schema\n"
        "from dbcluster.dialects import make_engine\n"
        "engine = make_engine(sys.argv[1])\n"
        "try:\n"
        "    schema.metadata.create_all(engine)\n"
        "except Exception as exc:\n"
        "    print('refused:', exc)\n"
        "with engine.begin() as conn:\n"
        "    conn.execute(text('CREATE TABLE later (x INTEGER)'))\n"
        "with engine.begin() as conn:\n"
        "    conn.execute(text('INSERT INTO later VALUES (1)'))\n"
        "print('committed first: accepted')\n"
    )
    found = run(env, "-c", script, f"ddlapart:///{tmp_path}/strict.db")
    assert found.returncode == 0, found.stderr[-3000:]
    assert "refused: " in found.stdout and "Table unknown BATCH_SCHEMA_VERSION" in found.stdout
    assert "committed first: accepted" in found.stdout


def test_init_writes_no_row_in_a_transaction_of_ddl_and_the_suite_passes(
    env: dict[str, str], tmp_path: Path
) -> None:
    """``dbcluster init`` creates the tables, then records the version in a transaction of its
    own (twice: the second run finds everything there); the suite, whose set-up makes the
    tables the same way, passes on such a database."""
    url = f"ddlapart:///{tmp_path}/init.db"
    assert provider_module(env, url) == "dbcluster_ddlapart"
    for _ in range(2):
        init = run(env, "-m", "dbcluster.cli", "init", "--url", url)
        assert init.returncode == 0, init.stdout + init.stderr
        assert "Traceback" not in init.stderr, init.stderr
    version = run(
        env,
        "-c",
        "import sys; from dbcluster import migrations; from dbcluster.dialects import "
        "make_engine; migrations.require_current_schema(make_engine(sys.argv[1])); print('ok')",
        url,
    )
    assert version.stdout.strip() == "ok", version.stdout + version.stderr
    run_suite(env, f"ddlapart:///{tmp_path}/suite.db", tmp_path)
