"""Every example runs on a cluster as its docstring says: from the repository root, ``dbcluster
init``, two ``dbcluster worker --app examples.NAME:registry`` (the installed command, so the
current directory is what makes ``examples`` importable) and ``dbcluster launch``, on SQLite and
PostgreSQL. Workers are real processes, ended by pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli_env, dbcluster_script, start_in, stop_process, wait_until_running
from sqlalchemy import Engine, MetaData, func, inspect, select

from dbcluster.batch import JobRepository
from dbcluster.dialects import make_engine
from dbcluster.testing.backends import Backend

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))


@dataclass
class Run:
    """What one launch left: its JSON outcome and the workers' logs."""

    outcome: dict[str, Any]
    logs: list[str]


@pytest.fixture
def run_example(
    backend: Backend, tmp_path: Path, processes: list[subprocess.Popen[Any]]
) -> Iterator[Any]:
    """``run_example(name, job, *params, env=...)``: init, two workers, launch, stop."""
    dbcluster = dbcluster_script()

    def run(name: str, job: str, *params: str, env: dict[str, str] | None = None) -> Run:
        environment = cli_env(DBCLUSTER_URL=backend.url, **(env or {}))
        app = f"examples.{name}:registry"
        init = subprocess.run(
            [dbcluster, "init"], cwd=ROOT, env=environment, capture_output=True, text=True
        )
        assert init.returncode == 0, init.stderr
        workers = []
        for n in (1, 2):
            log = tmp_path / f"{name}-worker-{n}.log"
            proc = start_in([dbcluster, "worker", "--app", app], ROOT, environment, log)
            processes.append(proc)
            workers.append((proc, log))
        for proc, log in workers:
            wait_until_running(proc, log)
        launch = subprocess.run(
            [dbcluster, "launch", "--app", app, job, *params, "--json"],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        logs = []
        for proc, log in workers:
            stop_process(proc)
            logs.append(log.read_text(errors="replace"))
            assert proc.returncode == 0, logs[-1][-3000:]
        assert launch.returncode == 0, launch.stderr[-3000:] + "\n".join(logs)[-3000:]
        return Run(json.loads(launch.stdout), logs)

    yield run


def _partition_contexts(engine: Engine, execution_id: int) -> list[dict[str, Any]]:
    repository = JobRepository(engine)
    execution = repository.get_job_execution(execution_id)
    assert execution is not None
    return [
        dict(s.execution_context)
        for s in repository.get_step_executions(execution)
        if ":" in s.step_name
    ]


def _drop(engine: Engine, *names: str) -> None:
    present = set(inspect(engine).get_table_names())
    metadata = MetaData()
    metadata.reflect(engine, only=[n for n in names if n in present])
    metadata.drop_all(engine)


def test_every_example_has_a_module_level_registry_and_a_test_here() -> None:
    tested = {"hello", "sum_by_range", "nightly_flow", "shop"}
    assert set(EXAMPLES) == tested, "an example without a cluster test here"
    for name in EXAMPLES:
        assert "\nregistry = JobRegistry()" in (ROOT / "examples" / f"{name}.py").read_text()


@pytest.mark.backends("sqlite", "postgresql")
def test_hello_counts_the_primes_on_two_workers(backend: Backend, run_example: Any) -> None:
    run = run_example("hello", "count_primes")
    assert run.outcome["status"] == "COMPLETED"
    assert run.outcome["partitions"] == {"COMPLETED": 8}
    contexts = _partition_contexts(backend.engine, run.outcome["job_execution_id"])
    assert sum(c["primes"] for c in contexts) == 17_984


@pytest.mark.backends("sqlite", "postgresql")
def test_sum_by_range_loads_and_sums_on_two_workers(backend: Backend, run_example: Any) -> None:
    try:
        run = run_example("sum_by_range", "sum-by-range", "rows(int)=20000")
        assert run.outcome["status"] == "COMPLETED"
        assert run.outcome["partitions"] == {"COMPLETED": 8}
        contexts = _partition_contexts(backend.engine, run.outcome["job_execution_id"])
        assert sum(c["sum"] for c in contexts) == 20_000 * 20_001 // 2
    finally:
        _drop(backend.engine, "numbers")


@pytest.mark.backends("sqlite", "postgresql")
def test_nightly_flow_takes_the_big_day_on_two_workers(
    backend: Backend, run_example: Any, tmp_path: Path
) -> None:
    export = tmp_path / "orders.jsonl"
    try:
        run = run_example(
            "nightly_flow", "nightly-orders", "orders(int)=2000", f"export={export}", "--next"
        )
        assert run.outcome["status"] == "COMPLETED"
        assert run.outcome["partitions"] == {"COMPLETED": 4}
        assert len(export.read_text().splitlines()) == 2000
        metadata = MetaData()
        metadata.reflect(backend.engine, only=["nightly_orders", "nightly_totals"])
        orders, totals = metadata.tables["nightly_orders"], metadata.tables["nightly_totals"]
        with backend.engine.connect() as conn:
            got = dict(conn.execute(select(totals.c.region, totals.c.total)).all())
            want = dict(
                conn.execute(
                    select(orders.c.region, func.sum(orders.c.amount)).group_by(orders.c.region)
                ).all()
            )
        assert got == {region: int(total) for region, total in want.items()} and got
    finally:
        _drop(backend.engine, "nightly_totals", "nightly_subtotals", "nightly_orders")


@pytest.fixture
def shop_url(backend: Backend, tmp_path: Path, open_test_backend: Any) -> Iterator[str]:
    """The shop's database, never the job repository's: a SQLite file beside a server's
    repository; PostgreSQL beside a SQLite repository (or a second SQLite file without one)."""
    if backend.name != "sqlite":
        yield f"sqlite:///{tmp_path / 'shop.db'}"
        return
    if not os.environ.get("DBCLUSTER_TEST_POSTGRESQL_URL"):
        yield f"sqlite:///{tmp_path / 'shop.db'}"
        return
    url = open_test_backend("postgresql").url
    yield url
    engine = make_engine(url)
    try:
        _drop(engine, "shop_products")
    finally:
        engine.dispose()


@pytest.mark.backends("sqlite", "postgresql")
def test_shop_keeps_its_data_in_another_database_through_a_resource(
    backend: Backend, run_example: Any, shop_url: str
) -> None:
    """The business data lives in a database the job repository is not in; each worker makes
    the resource once, when a step first asks for it, and closes it when it stops."""
    env = {**cli_env(), "SHOP_DATABASE_URL": shop_url}
    created = subprocess.run(
        [sys.executable, "examples/shop.py", "3000"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stderr

    # --no-work: the launching master runs no partition, so the workers must.
    run = run_example(
        "shop", "reprice", "percent(int)=110", "--no-work", env={"SHOP_DATABASE_URL": shop_url}
    )

    assert run.outcome["status"] == "COMPLETED"
    shop = make_engine(shop_url)
    try:
        metadata = MetaData()
        metadata.reflect(shop, only=["shop_products"])
        products = metadata.tables["shop_products"]
        with shop.connect() as conn:
            rows = conn.execute(select(products.c.base_cents, products.c.price_cents)).all()
    finally:
        shop.dispose()
    assert len(rows) == 3000
    assert all(price == base * 110 // 100 for base, price in rows)
    assert "shop_products" not in inspect(backend.engine).get_table_names()
    opened = [log.count("opened the shop database") for log in run.logs]
    assert all(n <= 1 for n in opened) and sum(opened) >= 1, opened  # once per process
    for log, n in zip(run.logs, opened, strict=True):
        assert log.count("closed the shop database") == n  # closed when the worker stopped
        if n:
            assert log.index("opened the shop database") < log.index("closed the shop database")


def test_shop_schedules_its_nightly_reprice_in_its_registry() -> None:
    """The schedule deploy/kubernetes/scheduler.yaml's accepting nodes fire (no CronJob)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBCLUSTER_")}
    listed = subprocess.run(
        [dbcluster_script(), "schedules", "--app", "examples.shop:registry", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    (schedule,) = json.loads(listed.stdout)
    assert schedule["job"] == "reprice" and schedule["cron"] == "0 3 * * *"
    assert schedule["timezone"] == "Europe/Paris"
