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
from dbcluster.bench.wire import CountingProxy, RoundTrips, SqliteTrace, protocol_for_url
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import nodes
from dbcluster.testing.backends import _isolate
from dbcluster.testing.waiting import wait_for

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

    return {
        f"DBCLUSTER_{f.name.upper()}": str(getattr(settings, f.name))
        for f in fields(settings)
        if getattr(settings, f.name) is not None
    }


@dataclass
class Worker:
    index: int
    process: subprocess.Popen[bytes]
    counts_path: Path
    #: The worker's stderr (its log), read back when it fails to come up.
    log_path: Path | None = None

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def counts(self) -> dict[str, int]:
        return counting.read(self.counts_path)

    def round_trips(self) -> dict[str, int]:
        """The SQLite round trips the worker traced (empty unless it traces)."""
        found: dict[str, int] = counting.read_file(self.counts_path).get("round_trips", {})
        return found


@dataclass
class WorkerPool:
    url: str
    settings: ClusterSettings
    folder: Path
    workers: list[Worker] = field(default_factory=list)
    #: Extra environment of the worker processes (a counting pass's tracing switch).
    env: dict[str, str] = field(default_factory=dict)
    #: Whether the workers count SQLAlchemy's statement events (off in a timed pass).
    count_statements: bool = True

    def start(self, count: int, concurrency: int | None = None) -> list[Worker]:
        started = []
        for _ in range(count):
            index = len(self.workers)
            path = self.folder / f"worker-{index}.json"
            env = {
                **os.environ,
                **settings_env(self.settings),
                **self.env,
                "DBCLUSTER_BENCH_COUNTS": str(path),
                "DBCLUSTER_BENCH_STATEMENTS": "1" if self.count_statements else "0",
            }
            if concurrency is not None:
                env["DBCLUSTER_CONCURRENCY_LIMIT"] = str(concurrency)
            log_path = self.folder / f"worker-{index}.log"
            with log_path.open("wb") as log_file:
                process = self._spawn(index, env, log_file)
            worker = Worker(index, process, path, log_path)
            self.workers.append(worker)
            started.append(worker)
        return started

    def _spawn(self, index: int, env: dict[str, str], log_file: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
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
            stderr=log_file,
        )

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.process.poll() is None]

    def wait_registered(self, engine: Engine, count: int, timeout: float = 60) -> None:
        """Until ``count`` workers have registered; a worker that exits first, or the timeout,
        fails at once with the workers' last log lines."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                rows = conn.execute(select(nodes.c.node_id).where(nodes.c.capacity > 0)).all()
            if len(rows) >= count:
                return
            exited = [w for w in self.workers if w.process.poll() is not None]
            if exited:
                raise RuntimeError(
                    "bench worker exited before it registered:\n" + self._tails(exited)
                )
            time.sleep(0.05)
        raise TimeoutError(
            f"{count} workers did not register within {timeout}s "
            f"({len(rows)} did):\n" + self._tails(self.workers)
        )

    @staticmethod
    def _tails(workers: list[Worker]) -> str:
        return "\n".join(
            f"--- worker {w.index} (exit {w.process.poll()}):\n{w.log_tail() or '(no output)'}"
            for w in workers
        )

    def counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for worker in self.workers:
            for key, value in worker.counts().items():
                total[key] = total.get(key, 0) + value
        return total

    def round_trips(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for worker in self.workers:
            for key, value in worker.round_trips().items():
                total[key] = total.get(key, 0) + value
        return total

    def settle(self, timeout: float = 10) -> None:
        """Wait until every live worker has written its counts after this call (they write
        every 0.2 s), so that what they did before it is in their files."""
        now = time.time()

        def fresh() -> bool:
            return all(counting.read_file(w.counts_path).get("at", 0) > now for w in self.alive())

        wait_for(fresh, timeout, "the workers' counts", poll=0.02)

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
def worker_pool(
    url: str,
    settings: ClusterSettings,
    env: dict[str, str] | None = None,
    *,
    count_statements: bool = True,
) -> Iterator[WorkerPool]:
    with tempfile.TemporaryDirectory(prefix="dbcluster-bench-w-") as folder:
        pool = WorkerPool(
            url, settings, Path(folder), env=dict(env or {}), count_statements=count_statements
        )
        try:
            yield pool
        finally:
            pool.stop()


# --- counting passes ----------------------------------------------------------------------------


@dataclass
class Tap:
    """Where a counting pass connects, and the round trips it counted, for the bench process
    (the master, the baseline) and the worker processes apart.

    Through the wire proxies on PostgreSQL, MySQL and MariaDB; through SQLite's statement trace
    on SQLite (in this process, and in each worker, which writes it to its counts file)."""

    #: URL for the bench process's engines in the counting pass.
    url: str
    #: URL for the worker processes.
    worker_url: str
    #: Extra environment for the worker processes.
    worker_env: dict[str, str]
    #: The bench process's round trips.
    local: RoundTrips
    #: The workers' round trips when a proxy counts them; None when they trace (SQLite).
    remote: RoundTrips | None
    #: What counted, for the report.
    source: str

    def worker_round_trips(self, pool: WorkerPool) -> dict[str, int]:
        """The workers' round trips so far (settle the pool first when they trace)."""
        if self.remote is not None:
            return self.remote.snapshot()
        return pool.round_trips()


@contextmanager
def counting_tap(url: str) -> Iterator[Tap | None]:
    """A :class:`Tap` on the database behind ``url``, or None where no counter can see the
    round trips (a server without a wire parser here)."""
    protocol = protocol_for_url(url)
    if protocol is not None:
        with CountingProxy.for_url(url) as local, CountingProxy.for_url(url) as remote:
            yield Tap(
                url=local.url_for(url),
                worker_url=remote.url_for(url),
                worker_env={},
                local=local.counts,
                remote=remote.counts,
                source=(
                    f"a counting pass through a {protocol} wire-protocol proxy, same sizes, "
                    "in this run; timings come from the direct pass"
                ),
            )
        return
    if url.startswith("sqlite"):
        trace = SqliteTrace().install()
        try:
            yield Tap(
                url=url,
                worker_url=url,
                worker_env={"DBCLUSTER_BENCH_TRACE": "1"},
                local=trace.counts,
                remote=None,
                source=(
                    "a counting pass with sqlite3's statement trace on every connection, same "
                    "sizes, in this run; timings come from the direct pass"
                ),
            )
        finally:
            trace.remove()
        return
    yield None
