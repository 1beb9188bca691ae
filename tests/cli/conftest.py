"""Fixtures for driving the ``dbcluster`` command as a subprocess."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import APP, cli, cli_env, stop_process, wait_for
from sqlalchemy import Engine, func, select

from dbcluster.demo import demo_metadata, load_receipts
from dbcluster.schema import nodes
from dbcluster.testing.backends import Backend


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[Any]]]:
    """Processes a test starts; each is stopped by pid at the end, whatever happened."""
    started: list[subprocess.Popen[Any]] = []
    yield started
    for proc in started:
        stop_process(proc)


@pytest.fixture
def demo_engine(backend: Backend) -> Iterator[Engine]:
    """The backend with the demo's receipts table (6,000 receipts) and no results table."""
    engine = backend.engine
    demo_metadata.drop_all(engine)
    demo_metadata.tables["dbc_demo_receipts"].create(engine)
    load_receipts(engine, 6000)
    yield engine
    demo_metadata.drop_all(engine)


@pytest.fixture
def start_worker(
    backend: Backend, processes: list[subprocess.Popen[Any]], tmp_path: Path
) -> Callable[[str], tuple[subprocess.Popen[Any], Path]]:
    """Start ``dbcluster worker`` with the demo app; returns it and its log file once it has
    joined the cluster."""

    def start(prefix: str) -> tuple[subprocess.Popen[Any], Path]:
        log = tmp_path / f"{prefix}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cli("worker", "--app", APP, "--node-prefix", prefix),
                env=cli_env(DBCLUSTER_URL=backend.url),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        processes.append(proc)

        def joined() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"worker exited {proc.returncode}: {log.read_text()[-2000:]}")
            with backend.engine.connect() as conn:
                n = conn.execute(
                    select(func.count()).where(nodes.c.node_id.like(f"{prefix}-%"))
                ).scalar_one()
            return n >= 1

        wait_for(joined, 30, f"worker {prefix} to join")
        return proc, log

    return start
