"""Master takeover with real processes: SIGKILL a job's master inside a partitioned step, and
inside a chunk step it runs itself; SIGSTOP one past the cleanup threshold, then SIGCONT it.
Each job completes in the same execution with no restart, and the lost master commits nothing."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from dbcluster.dialects import get_provider
from dbcluster.schema import job_execution, job_masters, partitions
from dbcluster.testing.app import items_written, ledger, ledger_metadata, runs
from dbcluster.testing.backends import Backend
from dbcluster.testing.harness import Harness, wait_until
from dbcluster.testing.invariants import commit_in_order

pytestmark = pytest.mark.backends("sqlite", "postgresql", "mariadb")


@pytest.fixture
def harness(backend: Backend, tmp_path: Path) -> Any:
    ledger_metadata.drop_all(backend.engine)
    ledger_metadata.create_all(backend.engine)
    with Harness(backend.url, tmp_path / "nodes") as harness:
        yield harness
    ledger_metadata.drop_all(backend.engine)


def _db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        value = conn.execute(get_provider(engine).select_now()).scalar_one()
    return value.replace(tzinfo=None)


def _execution(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(job_execution)).first()


def _takeover(engine: Engine, job_execution_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(job_masters).where(
                job_masters.c.job_execution_id == job_execution_id,
                job_masters.c.reason == "takeover",
            )
        ).first()


def _start_workers(harness: Harness, engine: Engine, count: int) -> list[Any]:
    workers = [harness.start_worker(f"w{i}") for i in range(count)]
    wait_until(
        lambda: all(harness.node_ids(engine, w) for w in workers), 60, f"{count} workers to join"
    )
    return workers


def _killed_at(engine: Engine, harness: Harness, master: Any) -> datetime:
    """The database clock at the SIGKILL: read just before it, plus the time to the kill (a read
    after it can wait seconds on a loaded machine, which would make the takeover look early)."""
    before = _db_now(engine)
    mark = time.monotonic()
    harness.kill(master)
    return before + timedelta(seconds=time.monotonic() - mark)


def _floor_s(harness: Harness) -> float:
    return (harness.ms("cleanup_threshold") + harness.ms("stranded_master_scan_interval")) / 1000


def test_a_killed_master_s_partitioned_job_completes_in_the_same_execution(
    backend: Backend, harness: Harness
) -> None:
    engine = backend.engine
    _start_workers(harness, engine, 3)
    master = harness.start_launcher(
        "m0", "ledger", {"run": "kill-1", "delay_ms(int)": 4000, "tick_ms(int)": 100}
    )
    wait_until(lambda: _running_partitions(engine) >= 6, 60, "the partitions to start")
    execution = _execution(engine)
    killed_at = _killed_at(engine, harness, master)
    wait_until(
        lambda: _status(engine, execution.job_execution_id) != "STARTED", 90, "the job to end"
    )
    assert _status(engine, execution.job_execution_id) == "COMPLETED"
    with engine.connect() as conn:
        executions = conn.execute(select(job_execution)).all()
        parts = conn.execute(select(partitions)).all()
        effects = Counter(r.partition_name for r in conn.execute(select(ledger)))
    assert len(executions) == 1, "the job was restarted instead of taken over"
    assert {p.attempt for p in parts} == {1}, "a partition running elsewhere was run again"
    assert len(effects) == len(parts) and set(effects.values()) == {1}
    takeover = _takeover(engine, execution.job_execution_id)
    took_s = (takeover.since.replace(tzinfo=None) - killed_at).total_seconds()
    assert abs(took_s - _floor_s(harness)) <= 1.0, (
        f"the new master's first write came {took_s:.2f} s after the kill; "
        f"cleanup threshold + stranded-master scan = {_floor_s(harness):.2f} s"
    )


def test_a_killed_master_s_own_chunk_step_resumes_after_its_last_commit(
    backend: Backend, harness: Harness
) -> None:
    engine = backend.engine
    _start_workers(harness, engine, 2)
    master = harness.start_launcher("m0", "ledger-chunks", {"run": "kill-2", "item_ms(int)": 8})
    wait_until(lambda: _items(engine) >= 200, 60, "a few chunks to commit")
    execution = _execution(engine)
    killed_at = _killed_at(engine, harness, master)
    wait_until(
        lambda: _status(engine, execution.job_execution_id) != "STARTED", 120, "the job to end"
    )
    assert _status(engine, execution.job_execution_id) == "COMPLETED"
    with engine.connect() as conn:
        written = Counter(r.item for r in conn.execute(select(items_written.c.item)))
        executions = conn.execute(select(job_execution)).all()
    assert len(executions) == 1
    assert set(written) == set(range(1000)) and set(written.values()) == {1}, (
        "a chunk committed before the kill was written again, or an item was lost"
    )
    takeover = _takeover(engine, execution.job_execution_id)
    took_s = (takeover.since.replace(tzinfo=None) - killed_at).total_seconds()
    assert abs(took_s - _floor_s(harness)) <= 1.0, f"took {took_s:.2f} s"


def test_a_master_stopped_past_the_cleanup_threshold_commits_nothing_when_it_wakes(
    backend: Backend, harness: Harness
) -> None:
    engine = backend.engine
    _start_workers(harness, engine, 2)
    master = harness.start_launcher(
        "m0", "ledger-steps", {"run": "stop-1", "delay_ms(int)": 3000, "tick_ms(int)": 100}
    )
    wait_until(lambda: _running_partitions(engine) >= 4, 60, "the partitions to start")
    execution = _execution(engine)
    harness.pause(master)
    wait_until(
        lambda: _status(engine, execution.job_execution_id) == "COMPLETED",
        120,
        "another node to take the job over and finish it",
    )
    harness.resume(master)
    master.popen.wait(timeout=60)
    assert master.popen.returncode == 0, master.log_tail()
    outcome = json.loads(master.stdout().strip().splitlines()[-1])
    assert outcome["status"] == "COMPLETED"
    assert [m["reason"] for m in outcome["masters"]] == ["launched", "takeover"]
    assert "mastership of execution" in master.log_tail(20000)
    from dbcluster.testing.app import commits, master_effects

    with engine.connect() as conn:
        late = [r for r in conn.execute(select(commits)) if not commit_in_order(r)]
        effects = conn.execute(select(master_effects)).all()
        first_run = conn.execute(select(runs)).all()
    assert not late, f"a write committed after its owner moved: {late[:3]}"
    assert len(effects) == 1 and effects[0].epoch == 2, effects
    assert first_run, "the job ran"


def _running_partitions(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(runs.c.id)).all())


def _items(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(items_written)).scalar_one())


def _status(engine: Engine, job_execution_id: int) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                select(job_execution.c.status).where(
                    job_execution.c.job_execution_id == job_execution_id
                )
            ).scalar_one()
        )
