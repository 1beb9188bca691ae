"""The README's first job, as a new user runs it: its code block saved as ``myjobs.py`` in an
empty folder, then its commands run from that folder (``dbcluster init``, two ``dbcluster
worker --app myjobs:registry``, ``dbcluster launch``) with the installed ``dbcluster`` command,
on a fresh database. The blocks are read from README.md by their markers, so the README cannot
drift from the API or the commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import (
    dbcluster_script,
    fresh_database,
    start_in,
    stop_process,
    wait_until_running,
)

from dbcluster.batch import BatchStatus, JobRepository
from dbcluster.dialects import make_engine

README = Path(__file__).resolve().parents[2] / "README.md"
PRIMES_BELOW_200_000 = 17_984


def fenced_block(marker: str) -> str:
    """The fenced block right after ``<!-- marker -->`` in README.md."""
    found = re.search(
        rf"<!-- {re.escape(marker)} -->\s*```[a-z]*\n(.*?)^```", README.read_text(), re.S | re.M
    )
    assert found, f"README.md has no fenced block after <!-- {marker} -->"
    return found.group(1)


def readme_commands() -> dict[str, list[str]]:
    """The README's ``dbcluster`` commands of the first job, by subcommand (comments dropped),
    and the URL its ``export DBCLUSTER_URL=`` line sets."""
    commands: dict[str, list[str]] = {}
    for line in fenced_block("first-job: commands").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            commands["export"] = words[1:]
        elif words[:1] == ["dbcluster"]:
            commands[words[1]] = words[1:]
    return commands


def test_the_readme_first_job_is_under_30_lines_and_its_commands_are_complete() -> None:
    code = fenced_block("first-job: myjobs.py")
    assert len(code.strip().splitlines()) < 30
    commands = readme_commands()
    assert set(commands) == {"export", "init", "worker", "launch"}, commands
    assert commands["export"][0].startswith("DBCLUSTER_URL=sqlite:///")
    assert commands["worker"] == ["worker", "--app", "myjobs:registry"]
    assert commands["launch"][:3] == ["launch", "--app", "myjobs:registry"]


def _primes_counted(url: str, execution_id: int) -> int:
    engine = make_engine(url)
    try:
        repository = JobRepository(engine)
        execution = repository.get_job_execution(execution_id)
        assert execution is not None and execution.status is BatchStatus.COMPLETED
        steps = repository.get_step_executions(execution)
        return sum(int(s.execution_context.get("primes", 0)) for s in steps if ":" in s.step_name)
    finally:
        engine.dispose()


@pytest.mark.backends("sqlite", "postgresql")
def test_the_readme_first_job_runs_on_two_workers_from_its_folder(
    backend: Any, tmp_path: Path, processes: list[subprocess.Popen[Any]]
) -> None:
    folder = tmp_path / "first-job"
    folder.mkdir()
    (folder / "myjobs.py").write_text(fenced_block("first-job: myjobs.py"))
    commands = readme_commands()
    dbcluster = dbcluster_script()
    with fresh_database(backend, folder) as url:
        if backend.name == "sqlite":  # the README's own URL, relative to the folder
            url = commands["export"][0].split("=", 1)[1]
        # A new user's environment: the README's one variable, every setting at its default.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DBCLUSTER_")}
        env["DBCLUSTER_URL"] = url

        init = subprocess.run(
            [dbcluster, *commands["init"]], cwd=folder, env=env, capture_output=True, text=True
        )
        assert init.returncode == 0, init.stderr
        assert "created" in init.stdout
        workers = []
        for n in (1, 2):
            log = tmp_path / f"worker-{n}.log"
            proc = start_in([dbcluster, *commands["worker"]], folder, env, log)
            processes.append(proc)
            workers.append((proc, log))
        for proc, log in workers:
            wait_until_running(proc, log)

        launch = subprocess.run(
            [dbcluster, *commands["launch"], "--json"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert launch.returncode == 0, launch.stderr[-3000:]
        outcome = json.loads(launch.stdout)
        assert outcome["status"] == "COMPLETED", outcome
        assert outcome["partitions"] == {"COMPLETED": 8}, outcome

        for proc, log in workers:  # SIGTERM by pid: a graceful stop
            stop_process(proc)
            assert proc.returncode == 0, log.read_text()[-3000:]
        if backend.name == "sqlite":
            url = f"sqlite:///{folder / 'jobs.db'}"
        assert _primes_counted(url, outcome["job_execution_id"]) == PRIMES_BELOW_200_000
