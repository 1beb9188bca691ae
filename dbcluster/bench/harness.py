"""Scratch databases and worker processes for the benchmarks. Everything started is stopped,
and every scratch database dropped, when the context exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from dbcluster import schema
from dbcluster.bench import counting
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import nodes
from dbcluster.testing.backends import _isolate

APP = "dbcluster.bench.app:registry"


@contextmanager
def scratch_database(url: str | None) -> Iterator[str]:
    """A database of the benchmark's own on the server behind ``url`` (a temporary SQLite file
    when ``url`` is None or SQLite), with the dbcluster tables; dropped afterwards."""
    cleanup: list[Any] = []
    folder: tempfile.TemporaryDirectory[str] | None = None
    if url is None or url.startswith("sqlite"):
        folder = tempfile.TemporaryDirectory(prefix="dbcluster-bench-")
        scratch = f"sqlite:///{folder.name}/bench.db"
    else:
        scratch = _isolate(url, cleanup)
    engine = make_engine(scratch)
    try:
        schema.metadata.drop_all(engine)
        schema.metadata.create_all(engine)
        engine.dispose()
        yield scratch
    finally:
        engine.dispose()
        for action in reversed(cleanup):
            action()
        if folder is not None:
            folder.cleanup()


def settings_env(settings: ClusterSettings) -> dict[str, str]:
    from dataclasses import fields

    return {f"DBCLUSTER_{f.name.upper()}": str(getattr(settings, f.name)) for f in fields(settings)}


@dataclass
class Worker:
    index: int
    process: subprocess.Popen[bytes]
    counts_path: Path

    def counts(self) -> dict[str, int]:
        return counting.read(self.counts_path)


@dataclass
class WorkerPool:
    url: str
    settings: ClusterSettings
    folder: Path
    workers: list[Worker] = field(default_factory=list)

    def start(self, count: int, concurrency: int | None = None) -> list[Worker]:
        started = []
        for _ in range(count):
            index = len(self.workers)
            path = self.folder / f"worker-{index}.json"
            env = {**os.environ, **settings_env(self.settings), "DBCLUSTER_BENCH_COUNTS": str(path)}
            if concurrency is not None:
                env["DBCLUSTER_CONCURRENCY_LIMIT"] = str(concurrency)
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dbcluster.cli",
                    "worker",
                    "--url",
                    self.url,
                    "--app",
                    APP,
                    "--node-prefix",
                    f"bench{index}",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            worker = Worker(index, process, path)
            self.workers.append(worker)
            started.append(worker)
        return started

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.process.poll() is None]

    def wait_registered(self, engine: Engine, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                rows = conn.execute(select(nodes.c.node_id).where(nodes.c.capacity > 0)).all()
            if len(rows) >= count:
                return
            time.sleep(0.05)
        raise TimeoutError(f"{count} workers did not register within {timeout}s")

    def counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for worker in self.workers:
            for key, value in worker.counts().items():
                total[key] = total.get(key, 0) + value
        return total

    def stop(self, timeout: float = 20) -> None:
        for worker in self.alive():
            worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                worker.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


@contextmanager
def worker_pool(url: str, settings: ClusterSettings) -> Iterator[WorkerPool]:
    with tempfile.TemporaryDirectory(prefix="dbcluster-bench-w-") as folder:
        pool = WorkerPool(url, settings, Path(folder))
        try:
            yield pool
        finally:
            pool.stop()
