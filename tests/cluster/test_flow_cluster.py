"""Flows on a cluster: the worked example's flow (a decider, a split, a partitioned step) on two
nodes, and a master lost between the split and the last step, whose job a survivor finishes on
the branch the execution had taken."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from dbcluster import points
from dbcluster.batch import BatchStatus
from dbcluster.batch.flow import PATH_KEY
from dbcluster.schema import partitions
from dbcluster.testing.app import FAST_SETTINGS
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import freeze, record_events
from dbcluster.testing.waiting import in_thread, wait_for

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "nightly_flow", ROOT / "examples" / "nightly_flow.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("nightly_flow", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def nightly(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ModuleType, Any]]:
    """The example's module-level registry, its ``data`` resource on this backend (the example
    keeps its tables in the repository's database, ``DBCLUSTER_URL``)."""
    example = _example()
    monkeypatch.setenv("DBCLUSTER_URL", backend.url)
    example.metadata.drop_all(backend.engine)
    example.metadata.create_all(backend.engine)
    yield example, example.registry
    example.registry.resources.close()
    example.metadata.drop_all(backend.engine)


def _params(tmp_path: Path, run_id: int) -> dict[str, Any]:
    return {"orders": 3000, "run.id": run_id, "export": str(tmp_path / "orders.jsonl")}


def _totals_match(example: ModuleType, engine: Engine) -> bool:
    with engine.connect() as conn:
        got = dict(conn.execute(select(example.totals.c.region, example.totals.c.total)).all())
        want = conn.execute(
            select(example.orders.c.region, func.sum(example.orders.c.amount)).group_by(
                example.orders.c.region
            )
        ).all()
    return got == {r: int(t) for r, t in want}


def test_the_example_flow_runs_on_two_nodes(
    backend: Backend, tmp_path: Path, nightly: tuple[ModuleType, Any], make_cluster: Any
) -> None:
    example, registry = nightly
    master = make_cluster(SETTINGS, registry=registry)
    make_cluster(SETTINGS, registry=registry)
    execution = master.launch("nightly-orders", _params(tmp_path, 1))
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        nodes = conn.execute(
            select(func.count(partitions.c.assigned_node.distinct())).where(
                partitions.c.job_execution_id == execution.id
            )
        ).scalar_one()
    assert nodes == 2, "the split's partitioned step spread over both nodes"
    assert _totals_match(example, backend.engine)


def test_a_survivor_finishes_a_flow_on_the_branch_its_lost_master_took(
    backend: Backend, tmp_path: Path, nightly: tuple[ModuleType, Any], make_cluster: Any
) -> None:
    example, registry = nightly
    master = make_cluster(SETTINGS, registry=registry, work=False)
    survivor = make_cluster(SETTINGS, registry=registry)
    recorder = record_events(survivor.node)
    volume = registry.get_job("nightly-orders").flow._states["volume"]
    with points.parked(
        "master.between_steps", lambda next_step, **_: next_step == "report"
    ) as park:
        run = in_thread(lambda: master.launch("nightly-orders", _params(tmp_path, 2)))
        job_execution = park.wait(timeout=60)[0]["job_execution"]
        # Were the decision taken again, the survivor would go the other way.
        chose = volume.fn
        volume.fn = lambda *_: "SMALL"
        try:
            with freeze(master.node):
                wait_for(lambda: recorder.named("took_over"), timeout=30, what="the takeover")
                wait_for(
                    lambda: not survivor.repository.get_job_execution(job_execution.id).is_running,
                    timeout=30,
                    what="the job to end under its new master",
                )
                park.release()
        finally:
            volume.fn = chose
    run["thread"].join(30)
    assert not run["thread"].is_alive()
    ended = survivor.repository.get_job_execution(job_execution.id)
    assert ended.status is BatchStatus.COMPLETED, ended.exit_status
    steps = [se.step_name for se in survivor.repository.get_step_executions(ended)]
    assert "total-all" not in steps and steps.count("report") == 1
    assert steps.count("totals") == 1 and steps.count("export") == 1, steps
    path = ended.execution_context[PATH_KEY]["nightly"]["states"]
    assert [(name, code) for name, code, *_ in path] == [
        ("prepare", "COMPLETED"),
        ("load", "COMPLETED"),
        ("volume", "BIG"),
        ("big-day", "COMPLETED"),
        ("report", "COMPLETED"),
    ]
    assert _totals_match(example, backend.engine)
