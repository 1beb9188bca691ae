"""The process harness: real node processes on one database, and real faults injected into them.

Nodes are ``python -m dbcluster.cli worker`` processes (and ``launch`` processes, which are nodes
too: the master of the job they launch) running the test application with short thresholds from
``DBCLUSTER_*`` environment variables. Faults: ``SIGKILL``, ``SIGSTOP`` for longer than the cleanup
threshold then ``SIGCONT``, ``SIGTERM`` (a graceful stop) and a cut database connection. On a TCP
backend each node talks through its own :class:`TcpProxy`, and a cut closes every connection of
that node and refuses new ones until it is restored. SQLite is not reached over a network: there a
cut is the in-process switch of :mod:`dbcluster.testing.faults` (every statement and connect of
that node fails with the driver's ``OperationalError``).

Every process is started by this harness and ended by its pid (``Popen.send_signal``), never by
name; :meth:`Harness.close` kills whatever is still alive.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from dbcluster.dialects import safe_url
from dbcluster.errors import ConfigurationError

#: Short thresholds for fault runs (milliseconds): a silent node is removed after 3 s.
FAST_ENV: dict[str, str] = {
    "DBCLUSTER_HEARTBEAT_INTERVAL": "200",
    "DBCLUSTER_TASK_POLLING_INTERVAL": "100",
    "DBCLUSTER_UNREACHABLE_THRESHOLD": "1500",
    "DBCLUSTER_CLEANUP_THRESHOLD": "3000",
    "DBCLUSTER_SWEEP_INTERVAL": "200",
    "DBCLUSTER_MASTER_CHECK_INTERVAL": "100",
    "DBCLUSTER_ORPHAN_CHECK_INTERVAL": "200",
    "DBCLUSTER_STRANDED_MASTER_SCAN_INTERVAL": "500",
    # Longer than any test partition: a graceful stop never stops a running partition, so a
    # transferable partition moves only when its node is removed (invariant 3 stays strict).
    "DBCLUSTER_DRAIN_TIMEOUT": "20000",
    "DBCLUSTER_NO_NODE_TIMEOUT": "30000",
    "DBCLUSTER_CONCURRENCY_LIMIT": "10",
}

#: A database without a network (SQLite) serializes every write through one lock shared by all
#: node processes; on a small machine its heartbeats need more slack.
LOCAL_ENV: dict[str, str] = {
    "DBCLUSTER_HEARTBEAT_INTERVAL": "300",
    "DBCLUSTER_UNREACHABLE_THRESHOLD": "3000",
    "DBCLUSTER_CLEANUP_THRESHOLD": "5000",
}

APP = "dbcluster.testing.app:chaos_registry"


def env_ms(env: Mapping[str, str], name: str) -> int:
    return int(env[f"DBCLUSTER_{name.upper()}"])


class TcpProxy:
    """A threaded TCP forwarder on 127.0.0.1 that can be severed and restored."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def sever(self) -> None:
        """Close every connection through the proxy and refuse new ones."""
        self._cut.set()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            self._drop(s)

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.sever()
        self._server.close()
        self._thread.join(timeout=2)


@dataclass
class NodeProcess:
    """One OS process of the harness: a worker, or a launcher (the master of one job)."""

    slot: str
    role: str
    prefix: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    out_path: Path | None = None
    proxy: TcpProxy | None = None
    cut_file: Path | None = None
    fault_dir: Path | None = None
    stopped: bool = False
    cut: bool = False
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            self.popen.send_signal(signum)

    def sever(self) -> None:
        if self.proxy is not None:
            self.proxy.sever()
        elif self.cut_file is not None:
            self.cut_file.touch()
        self.cut = True

    def restore(self) -> None:
        if self.proxy is not None:
            self.proxy.restore()
        elif self.cut_file is not None:
            self.cut_file.unlink(missing_ok=True)
        self.cut = False

    # --- fault points (see dbcluster.testing.faults.install_fault_control) ---------------------

    def arm(self, point: str) -> None:
        """Park the next thread of this process that reaches ``point``."""
        assert self.fault_dir is not None
        (self.fault_dir / f"{point}.parked").unlink(missing_ok=True)
        (self.fault_dir / f"{point}.arm").touch()

    def parked(self, point: str) -> dict[str, Any] | None:
        """What the thread parked at ``point`` holds (None while none is parked there)."""
        import json

        assert self.fault_dir is not None
        path = self.fault_dir / f"{point}.parked"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def disarm(self, point: str) -> None:
        """Release the parked thread (it goes on at once, or at SIGCONT if the process is
        stopped) and arm nothing more."""
        assert self.fault_dir is not None
        (self.fault_dir / f"{point}.arm").unlink(missing_ok=True)

    def stdout(self) -> str:
        if self.out_path is None or not self.out_path.exists():
            return ""
        return self.out_path.read_text(errors="replace")

    def log_tail(self, chars: int = 2000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


class Harness:
    """Starts node processes on ``url`` and injects faults into them."""

    def __init__(
        self,
        url: str,
        workdir: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        app: str = APP,
        node_urls: Sequence[str] | None = None,
    ) -> None:
        from dbcluster.dialects import provider_for_url

        self.url = url
        #: Where the nodes connect: slot ``w<i>``/``m<j>`` to ``node_urls[i % n]`` (the servers
        #: of one cluster, e.g. Galera nodes); by default ``url``.
        self.node_urls = list(node_urls or [url])
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.app = app
        self.provider = provider_for_url(url)
        parsed = make_url(url)
        local = {} if self.provider.network_backend else LOCAL_ENV
        self.env = {**FAST_ENV, **local, **(env or {})}
        #: How a cut is made: a real TCP proxy, or the in-process switch.
        self.cut_method = (
            "tcp-proxy"
            if self.provider.network_backend and parsed.host
            else "in-process switch (no network between node and database)"
        )
        self.processes: list[NodeProcess] = []
        self._counter = 0

    # --- settings seen by the nodes ---------------------------------------------------------------

    def ms(self, name: str) -> int:
        return env_ms(self.env, name)

    # --- processes --------------------------------------------------------------------------------

    def url_for(self, slot: str) -> str:
        """The URL the process in ``slot`` (``w<i>`` or ``m<j>``) is given."""
        digits = "".join(c for c in slot if c.isdigit())
        return self.node_urls[int(digits or 0) % len(self.node_urls)]

    def _node_url(self, base: str | None = None) -> tuple[str, TcpProxy | None]:
        """The URL a node is given for ``base`` (default: the run's URL), and its proxy."""
        base = self.url if base is None else base
        parsed = make_url(base)
        if self.cut_method != "tcp-proxy" or not parsed.host:
            # A libpq multi-host URL names its servers in the query: no proxy (cut in-process).
            return base, None
        port = parsed.port or self.provider.default_port
        if not (parsed.host and port):
            raise ConfigurationError(
                f"cannot proxy node connections to {safe_url(parsed)}: it names no port and the "
                f"{self.provider.name} provider declares no default_port; set one of them"
            )
        proxy = TcpProxy(parsed.host, port)
        url = parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        return url, proxy

    def _spawn(self, slot: str, role: str, args: list[str], out: bool) -> NodeProcess:
        self._counter += 1
        prefix = f"{slot}i{self._counter}"
        url, proxy = self._node_url(self.url_for(slot))
        cut_file = None if proxy is not None else self.workdir / f"cut-{prefix}"
        fault_dir = self.workdir / f"faults-{prefix}"
        fault_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "DBCLUSTER_NODE_ID_PREFIX": prefix}
        env.pop("DBCLUSTER_URL", None)
        env["DBCLUSTER_FAULT_DIR"] = str(fault_dir)
        if cut_file is not None:
            env["DBCLUSTER_FAULT_CUT_FILE"] = str(cut_file)
        log_path = self.workdir / f"{prefix}.log"
        out_path = self.workdir / f"{prefix}.out" if out else None
        command = [sys.executable, "-m", "dbcluster.cli", role, "--url", url, "--app", self.app]
        with open(log_path, "wb") as log, open(out_path or os.devnull, "wb") as stdout:
            popen = subprocess.Popen(
                command + args,
                env=env,
                stdout=stdout,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        process = NodeProcess(
            slot, role, prefix, popen, log_path, out_path, proxy, cut_file, fault_dir
        )
        self.processes.append(process)
        return process

    def start_worker(self, slot: str, *args: str) -> NodeProcess:
        """A ``dbcluster worker`` process (``args``: more of its options, e.g.
        ``--accept-launches``)."""
        return self._spawn(slot, "worker", list(args), out=False)

    def start_launcher(
        self, slot: str, job: str, params: Mapping[str, Any], *, work: bool = False
    ) -> NodeProcess:
        args = [job, *(f"{k}={v}" for k, v in params.items()), "--json"]
        if not work:
            args.append("--no-work")
        return self._spawn(slot, "launch", args, out=True)

    def node_ids(self, engine: Engine, process: NodeProcess) -> list[str]:
        """The ids this process has registered under and that are still in the registry."""
        from sqlalchemy import select

        from dbcluster.schema import nodes

        with engine.connect() as conn:
            rows = conn.execute(
                select(nodes.c.node_id).where(nodes.c.node_id.like(f"{process.prefix}-%"))
            ).all()
        return [r[0] for r in rows]

    # --- faults ---------------------------------------------------------------------------------

    def kill(self, process: NodeProcess) -> None:
        process.signal(signal.SIGKILL)

    def pause(self, process: NodeProcess) -> None:
        process.signal(signal.SIGSTOP)
        process.stopped = True

    def resume(self, process: NodeProcess) -> None:
        process.signal(signal.SIGCONT)
        process.stopped = False

    def terminate(self, process: NodeProcess) -> None:
        process.signal(signal.SIGTERM)

    def sever(self, process: NodeProcess) -> None:
        process.sever()

    def restore(self, process: NodeProcess) -> None:
        process.restore()

    def partition_locked(self, engine: Engine, step_execution_id: int) -> bool:
        """Whether some transaction holds the partition's row (its writer is inside a fenced
        transaction): a lock that cannot be taken at once. SQLite locks the whole database."""
        from sqlalchemy import select

        from dbcluster.schema import partitions

        if not self.provider.network_backend:
            return _sqlite_write_locked(engine)
        from sqlalchemy.exc import DBAPIError

        try:
            with engine.connect() as conn, conn.begin():
                conn.execute(
                    select(partitions.c.step_execution_id)
                    .where(partitions.c.step_execution_id == step_execution_id)
                    .with_for_update(nowait=True)
                ).all()
        except DBAPIError as exc:
            # NOWAIT refused: the row is locked (a lock conflict, which the provider calls
            # transient). Anything else (a statement the dialect cannot compile, a lost
            # server) is not an answer: it is raised, never read as "locked".
            if self.provider.is_transient(exc):
                return True
            raise
        return False

    # --- the end ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process still alive (by pid), reap it, close the proxies."""
        for process in self.processes:
            if process.alive():
                try:
                    process.popen.send_signal(signal.SIGCONT)
                    process.popen.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            try:
                process.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if process.proxy is not None:
                process.proxy.close()
            if process.cut_file is not None:
                process.cut_file.unlink(missing_ok=True)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Presence:
    first_seen: datetime
    last_seen: datetime
    first_absent: datetime | None = None


class MembershipObserver:
    """Samples the node registry (with the database clock) so that invariants can say when a node
    was removed: ``first_absent`` is the first sample, on the database clock, without a node that
    earlier samples had."""

    def __init__(self, engine: Engine, interval_s: float = 0.05) -> None:
        from dbcluster.dialects import get_provider

        self.engine = engine
        self.provider = get_provider(engine)
        self.interval_s = interval_s
        self.nodes: dict[str, Presence] = {}
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)

    def start(self) -> MembershipObserver:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

    def sample(self) -> None:
        from sqlalchemy import select

        from dbcluster.schema import nodes

        try:
            with self.engine.connect() as conn:
                now = conn.execute(self.provider.select_now()).scalar_one()
                present = {r[0] for r in conn.execute(select(nodes.c.node_id)).all()}
        except Exception:  # noqa: BLE001 - a missed sample only widens the window
            self.errors += 1
            return
        self.samples += 1
        for node_id in present:
            seen = self.nodes.get(node_id)
            if seen is None:
                self.nodes[node_id] = Presence(now, now)
            elif seen.first_absent is None:
                seen.last_seen = now
        for node_id, seen in self.nodes.items():
            if node_id not in present and seen.first_absent is None:
                seen.first_absent = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def removed_at(self, node_id: str) -> datetime | None:
        seen = self.nodes.get(node_id)
        return None if seen is None else seen.first_absent

    def last_seen(self, node_id: str) -> datetime | None:
        seen = self.nodes.get(node_id)
        return None if seen is None else seen.last_seen


def _sqlite_write_locked(engine: Engine) -> bool:
    """Whether another connection holds the SQLite database's write lock."""
    import sqlite3

    conn = sqlite3.connect(str(engine.url.database), timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def wait_until(condition: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
