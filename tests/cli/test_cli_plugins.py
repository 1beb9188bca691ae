"""Commands added through the ``dbcluster.commands`` entry points (docs/cli.md, "Adding a
command"): dbcluster's own chaos and bench come that way, a third party's command runs like a
built-in one, one that cannot be loaded says why in one line, and the CLI package stays apart:
it imports neither the test harness nor the benchmarks, and nothing in the product imports it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dbcluster"

HELLO = '''
import click

from dbcluster.cli.options import DURATION_S


@click.command()
@click.option("--wait", type=DURATION_S, default="2m")
def hello(wait: float) -> None:
    """Say hello from a plugin."""
    click.echo(f"hello after {wait:g} s")


def not_a_command() -> None:
    pass
'''

ENTRY_POINTS = """[dbcluster.commands]
hello = dbc_hello:hello
gone = dbc_gone_module:command
broken = dbc_broken:command
notcmd = dbc_hello:not_a_command
worker = dbc_hello:hello
"""


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a Python in which the package ``dbc-hello`` is installed: a working
    command, one whose module is gone, one whose module fails to import, one that is not a
    command, and one that takes a built-in command's name."""
    site = tmp_path_factory.mktemp("site")
    (site / "dbc_hello.py").write_text(HELLO)
    (site / "dbc_broken.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    info = site / "dbc_hello-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dbc-hello\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBCLUSTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return env


def dbcluster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_third_party_command_runs_and_is_listed(plugin_env: dict[str, str]) -> None:
    ran = dbcluster(plugin_env, "hello", "--wait", "90s")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hello after 90 s\n"
    listed = dbcluster(plugin_env, "--help")
    assert listed.returncode == 0, listed.stderr
    commands = listed.stdout.split("Commands:")[1]
    assert "hello      Say hello from a plugin." in commands
    for name in ("bench", "chaos", "gone", "broken", "notcmd", "worker"):
        assert f"\n  {name} " in commands, name
    assert "gone       Cannot be loaded: ModuleNotFoundError" in commands
    # A built-in command keeps its name: the plugin's "worker" is not the one that runs.
    worker = dbcluster(plugin_env, "worker", "--help")
    assert worker.returncode == 0 and "Run a node until SIGTERM" in worker.stdout


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("gone", "ModuleNotFoundError: No module named 'dbc_gone_module'"),
        ("broken", "RuntimeError: boom"),
        ("notcmd", "dbc_hello:not_a_command is not a click command"),
    ],
)
@pytest.mark.parametrize("extra", [(), ("--help",), ("--url", "sqlite://", "x")])
def test_a_command_that_cannot_be_loaded_says_why_in_one_line(
    plugin_env: dict[str, str], name: str, reason: str, extra: tuple[str, ...]
) -> None:
    ran = dbcluster(plugin_env, name, *extra)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr and ran.stdout == ""
    assert ran.stderr.splitlines() == [
        f"error: the command {name!r} (dbc_{'hello' if name == 'notcmd' else name}"
        f"{'_module' if name == 'gone' else ''}:"
        f"{'not_a_command' if name == 'notcmd' else 'command'}, registered by package "
        f"dbc-hello in the dbcluster.commands entry points) cannot be loaded: {reason}; "
        "reinstall or uninstall that package"
    ]


def test_chaos_and_bench_come_from_the_entry_points_and_load_only_when_used() -> None:
    code = (
        "import sys\n"
        "from dbcluster.cli import cli, main\n"
        "from dbcluster.cli.plugins import registered\n"
        "assert 'chaos' not in cli.commands and 'bench' not in cli.commands\n"
        "print('@', registered()['chaos'].value, registered()['bench'].value)\n"
        "try:\n"
        "    main(['ddl', '--dialect', 'sqlite'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print('@', sorted(m for m in ('dbcluster.testing.chaos_command',"
        " 'dbcluster.bench.command') if m in sys.modules))\n"
        "try:\n"
        "    main(['chaos', '--help'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print('@', 'dbcluster.testing.chaos_command' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBCLUSTER_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    # Marked lines: the commands print their own output between them.
    said = [line[2:] for line in done.stdout.splitlines() if line.startswith("@ ")]
    assert said == [
        "dbcluster.testing.chaos_command:chaos dbcluster.bench.command:bench",
        "[]",
        "True",
    ]


def test_an_install_without_the_entry_points_says_to_reinstall(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An editable install made before the entry points existed knows no chaos: say why."""
    from dbcluster.cli import main, plugins

    class Stale:
        class entry_points:  # noqa: N801 - stands in for Distribution.entry_points
            @staticmethod
            def select(group: str) -> list[object]:
                return []

    monkeypatch.setattr(plugins, "registered", dict)
    monkeypatch.setattr(plugins, "distribution", lambda name: Stale())
    monkeypatch.delitem(main.__globals__["cli"].commands, "chaos", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["chaos", "--url", "sqlite://"])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "No such command 'chaos'" in err, err
    assert "lists no dbcluster.commands entry points" in err and "reinstall dbcluster" in err
    monkeypatch.undo()
    with pytest.raises(SystemExit) as exited:
        main(["nosuch"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "No such command 'nosuch'." in err
    assert "reinstall" not in err, err


def test_the_old_options_module_is_a_deprecated_alias() -> None:
    sys.modules.pop("dbcluster.cli_options", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import dbcluster.cli_options as old
    from dbcluster.cli import options

    assert old.DURATION_S is options.DURATION_S and old.EXIT_UNAVAILABLE == 3
    assert any(
        issubclass(w.category, DeprecationWarning) and "dbcluster.cli.options" in str(w.message)
        for w in caught
    )


def _imports(path: Path) -> set[str]:
    """The modules a file imports (``from dbcluster.cli import x`` counts as dbcluster.cli.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_cli_is_imported_by_nothing_in_the_product_and_imports_no_test_code() -> None:
    """The CLI sits on top: the engine never imports it back (the circle that was), and it
    reaches chaos and bench only through their entry points. A command that registers through
    them may use the options the commands share (chaos does)."""
    shared = "dbcluster.cli.options"
    back = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        imported = _imports(path)
        if relative.startswith("dbcluster/cli/"):
            wrong = [m for m in imported if m.startswith(("dbcluster.testing", "dbcluster.bench"))]
            assert not wrong, f"{relative} imports {wrong}"
        elif relative != "dbcluster/cli_options.py":  # the deprecated alias
            cli = [
                m
                for m in imported
                if (m == "dbcluster.cli" or m.startswith("dbcluster.cli."))
                and not (m == shared or m.startswith(f"{shared}."))
            ]
            if cli:
                back.append(f"{relative}: {sorted(cli)}")
    assert not back, back
