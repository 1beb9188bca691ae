"""``dbcluster stop`` and Ctrl-C on ``dbcluster launch`` (subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli, cli_env, run_cli, wait_for
from sqlalchemy import select

from dbcluster.batch.parameters import as_job_parameters
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import job_execution, nodes, partitions
from dbcluster.testing.backends import Backend

TEST_APP = "dbcluster.testing.app:registry"


def _one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.backends("sqlite")
def test_stop_of_an_unknown_or_finished_execution_is_one_line_and_exit_2(
    backend: Backend,
) -> None:
    _one_line_error(
        run_cli("stop", "--url", backend.url, "987654"), "no job execution with id 987654"
    )
    repository = JobRepository(backend.engine)
    params = as_job_parameters({"run": "finished"})
    execution = repository.create_job_execution(
        repository.create_job_instance("ledger", params), params
    )
    execution.status = BatchStatus.COMPLETED
    repository.update_job_execution(execution)
    _one_line_error(
        run_cli("stop", "--url", backend.url, str(execution.id)),
        f"execution {execution.id}",
        "already ended COMPLETED",
    )


@pytest.mark.backends("sqlite", "postgresql")
def test_ctrl_c_on_a_launch_stops_the_job_on_every_node(
    backend: Backend, ledger_engine: Any, processes: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    log = tmp_path / "launch.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cli(
                "launch",
                "--app",
                TEST_APP,
                "ledger",
                "run=ctrl-c",
                "delay_ms(int)=60000",
                "tick_ms(int)=50",
                "--on-interrupt",
                "stop",
            ),  # fmt: skip
            env=cli_env(DBCLUSTER_URL=backend.url),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    processes.append(proc)

    def claimed() -> int:
        if proc.poll() is not None:
            pytest.fail(f"launch exited {proc.returncode}: {log.read_text()[-2000:]}")
        with backend.engine.connect() as conn:
            rows = conn.execute(select(partitions.c.status)).all()
        return Counter(r[0] for r in rows)["CLAIMED"]

    wait_for(claimed, 30, "the launch's partitions to run")
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    text = log.read_text()
    assert proc.returncode == 1, text[-3000:]  # not COMPLETED
    assert "stopping execution" in text
    with backend.engine.connect() as conn:
        statuses = conn.execute(select(job_execution.c.status)).all()
        left = conn.execute(select(partitions.c.status)).all()
    assert [s[0] for s in statuses] == ["STOPPED"], text[-3000:]
    assert not {"PENDING", "CLAIMED"} & {r[0] for r in left}, left


@pytest.mark.backends("sqlite", "postgresql", "mariadb")
def test_dbcluster_stop_ends_partitions_on_three_worker_processes_and_restart_completes(
    backend: Backend, ledger_engine: Any, processes: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    """Three `dbcluster worker` processes run the partitions, a `launch --no-work` process is
    the master; `dbcluster stop` from a fourth process stops them all, nothing is left in
    flight, and `dbcluster restart` completes the job with every partition's effect once."""
    from dbcluster.testing.app import expected_total, ledger

    env = cli_env(DBCLUSTER_URL=backend.url)

    def start(name: str, *args: str) -> subprocess.Popen[Any]:
        with open(tmp_path / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(
                cli(*args), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        processes.append(proc)
        return proc

    for i in range(3):
        start(f"w{i}", "worker", "--app", TEST_APP, "--node-prefix", f"sw{i}")

    def joined() -> bool:
        with backend.engine.connect() as conn:
            ids = [r[0] for r in conn.execute(select(nodes.c.node_id))]
        return {i.split("-")[0] for i in ids} >= {"sw0", "sw1", "sw2"}

    # The master sizes the split to the nodes alive when it places the partitions.
    wait_for(joined, 60, "the three workers to join", interval=0.1)
    master = start(
        "master", "launch", "--app", TEST_APP, "--no-work", "ledger", "run=cli-stop",
        "delay_ms(int)=10000", "tick_ms(int)=50",
    )  # fmt: skip

    def running_on() -> set[str]:
        if master.poll() is not None:
            pytest.fail(f"launch exited {master.returncode}: {_log(tmp_path, 'master')}")
        with backend.engine.connect() as conn:
            rows = conn.execute(
                select(partitions.c.assigned_node).where(partitions.c.status == "CLAIMED")
            ).all()
        nodes = {r[0].split("-")[0] for r in rows}
        return nodes if nodes >= {"sw0", "sw1", "sw2"} else set()

    wait_for(running_on, 60, "partitions to run on the three worker processes", interval=0.1)
    with backend.engine.connect() as conn:
        execution_id = conn.execute(select(job_execution.c.job_execution_id)).scalar_one()
    stopped = run_cli("stop", "--url", backend.url, str(execution_id), "--wait", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert '"status": "STOPPED"' in stopped.stdout, stopped.stdout
    assert master.wait(timeout=30) == 1, _log(tmp_path, "master")
    with backend.engine.connect() as conn:
        left = Counter(r[0] for r in conn.execute(select(partitions.c.status)))
        effects = conn.execute(select(ledger.c.partition_name)).all()
    assert not left["PENDING"] and not left["CLAIMED"], left
    assert not effects  # every partition was stopped before its effect (10 s of ticks)
    restarted = run_cli(
        "restart", "--url", backend.url, "--app", TEST_APP, "--no-work", "-q", str(execution_id),
        timeout=120,
    )  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    with backend.engine.connect() as conn:
        rows = conn.execute(select(ledger.c.partition_name, ledger.c.total)).all()
    assert Counter(r[0] for r in rows).most_common(1)[0][1] == 1, rows
    assert sum(r[1] for r in rows) == expected_total(), rows


def _log(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]


@pytest.mark.backends("sqlite")
def test_ctrl_c_with_detach_leaves_the_job_to_the_cluster(
    backend: Backend, ledger_engine: Any, processes: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    env = cli_env(DBCLUSTER_URL=backend.url)
    with open(tmp_path / "w.log", "wb") as out:
        processes.append(
            subprocess.Popen(
                cli("worker", "--app", TEST_APP, "--node-prefix", "dw"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )  # fmt: skip
        )
    with open(tmp_path / "master.log", "wb") as out:
        master = subprocess.Popen(
            cli(
                "launch", "--app", TEST_APP, "--no-work", "ledger", "run=detach",
                "delay_ms(int)=2000", "tick_ms(int)=50", "--on-interrupt", "detach",
            ),
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    processes.append(master)

    def claimed() -> int:
        if master.poll() is not None:
            pytest.fail(f"launch exited {master.returncode}: {_log(tmp_path, 'master')}")
        with backend.engine.connect() as conn:
            rows = conn.execute(select(partitions.c.status)).all()
        return Counter(r[0] for r in rows)["CLAIMED"]

    wait_for(claimed, 60, "the partitions to run", interval=0.1)
    os.kill(master.pid, signal.SIGINT)
    assert master.wait(timeout=30) == 130, _log(tmp_path, "master")
    assert "detached: execution" in _log(tmp_path, "master")

    def ended() -> str | None:
        with backend.engine.connect() as conn:
            status = conn.execute(select(job_execution.c.status)).scalar_one()
        return None if status in ("STARTING", "STARTED") else status

    # The worker takes the job over and finishes it.
    assert wait_for(ended, 60, "the job to end under a new master", interval=0.2) == "COMPLETED"
