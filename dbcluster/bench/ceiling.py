"""``ceiling``: how many nodes one database coordinates at the configured intervals.

Simulated nodes are threads of load-generator processes (``ceiling_processes``, one per core by
default: one Python process cannot drive a thousand nodes' calls), each node with a connection of
its own (an engine with a pool of one, configured like a node's coordination engine), issuing the
real coordination statements through :class:`~dbcluster.cluster.store.CoordinationStore`:
``register`` once, then ``heartbeat`` every ``heartbeat_interval``, ``poll`` every
``task_polling_interval``, ``sweep`` every ``sweep_interval`` and ``stranded_jobs`` every
``stranded_master_scan_interval``, each from a random phase and, like a node's services, an
interval after the previous call ended. A node's calls share its one connection, so a slow poll
delays that node's next heartbeat (a real node has a small pool; this is the stricter case).

Statements per second at the database come from the server's own counters (see
:mod:`dbcluster.bench.server`), beside the same counters over a background window with no
simulated node connected. The load generator's CPU is reported, since a saturated generator shows
up as missed intervals that are not the database's (``load_generator_saturated``).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

from sqlalchemy import Engine, delete

from dbcluster.bench.common import Params, pct
from dbcluster.bench.harness import scratch_database
from dbcluster.bench.server import ServerProbe, SqliteProbe, probe_for, rates
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore
from dbcluster.dialects import make_engine
from dbcluster.dialects.base import SessionLimits
from dbcluster.schema import nodes

#: Connections the scenario needs beside its nodes (the probe's, and one spare).
_OWN_CONNECTIONS = 2
#: How many simulated nodes connect and register at once while starting.
_CONNECTING_AT_ONCE = 16
#: A call is late when its gap to the previous one exceeds its interval by more than this share.
_LATE = 0.5


@dataclass
class Call:
    #: Wall-clock start (``time.time()``: comparable across the load generator's processes).
    started: float
    ms: float


@dataclass
class SimulatedNode:
    """One simulated node: a thread, an engine with one connection, a store."""

    index: int
    url: str
    settings: ClusterSettings
    stop: threading.Event
    gate: threading.Semaphore
    #: Set once every node registered: the nodes' services start together, so that starting a
    #: thousand connections does not compete with the load of those already started.
    go: threading.Event
    calls: dict[str, list[Call]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: Times a heartbeat found the node's row gone (it was declared dead while alive); the node
    #: then joins again under a new id, as a real one does.
    fenced: int = 0
    registered: threading.Event = field(default_factory=threading.Event)
    joined: bool = False
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self._run, name=f"ceiling-node-{self.index}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        s = self.settings
        engine = make_engine(
            self.url,
            coordination=True,
            limits=SessionLimits(s.coordination_lock_timeout_ms, s.idle_transaction_ms),
            pool_size=1,
            max_overflow=0,
            pool_pre_ping=False,
        )
        store = CoordinationStore(engine)
        host = socket.gethostname()
        node_id = f"ceiling{self.index}-{uuid.uuid4().hex}"
        try:
            with self.gate:
                store.register(node_id, host, s.concurrency_limit)
            self.joined = True
        except Exception as exc:  # noqa: BLE001 - a node that cannot register is reported
            self.errors.append(f"register: {type(exc).__name__}: {exc}".splitlines()[0])
            engine.dispose()
            return
        finally:
            self.registered.set()
        try:
            while not self.go.wait(0.5):
                if self.stop.is_set():
                    return

            def heartbeat() -> None:
                nonlocal node_id
                if not store.heartbeat(node_id, 0):
                    self.fenced += 1
                    node_id = f"ceiling{self.index}-{uuid.uuid4().hex}"
                    store.register(node_id, host, s.concurrency_limit)

            services: list[tuple[str, int, Callable[[], Any]]] = [
                ("heartbeat", s.heartbeat_interval, heartbeat),
                ("poll", s.task_polling_interval, lambda: store.poll(node_id, s.concurrency_limit)),
                (
                    "sweep",
                    s.sweep_interval,
                    lambda: store.sweep(s.unreachable_threshold, s.cleanup_threshold),
                ),
                ("stranded_scan", s.stranded_master_scan_interval, store.stranded_jobs),
            ]
            now = time.monotonic()
            due = {name: now + random.uniform(0, ms / 1000) for name, ms, _ in services}
            for name, _, _ in services:
                self.calls[name] = []
            while not self.stop.is_set():
                name, interval_ms, call = min(services, key=lambda item: due[item[0]])
                delay = due[name] - time.monotonic()
                if delay > 0 and self.stop.wait(delay):
                    break
                started, wall = time.monotonic(), time.time()
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - counted and reported, the node goes on
                    self.errors.append(f"{name}: {type(exc).__name__}: {exc}".splitlines()[0])
                ended = time.monotonic()
                self.calls[name].append(Call(wall, (ended - started) * 1000))
                due[name] = ended + interval_ms / 1000
        finally:
            engine.dispose()


def _group(
    url: str,
    settings: ClusterSettings,
    indices: range,
    trace_path: str | None,
    ready: Any,
    go: Any,
    stop: Any,
    results: Any,
) -> None:
    """One process of the load generator: the nodes ``indices``, as threads. Says ``ready``
    with how many joined, starts them on ``go``, stops them on ``stop`` and hands back every
    call, error and the CPU the process used meanwhile. With ``trace_path`` (SQLite), counts the
    statements the library runs into that file."""
    if trace_path is not None:
        from dbcluster.bench import counting

        counting.install_trace()
        counting.start_dumping(trace_path)
    try:
        results.put(_run_group(url, settings, indices, ready, go, stop))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which reports it
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _run_group(
    url: str, settings: ClusterSettings, indices: range, ready: Any, go: Any, stop: Any
) -> dict[str, Any]:
    stop_nodes, go_nodes = threading.Event(), threading.Event()
    gate = threading.Semaphore(_CONNECTING_AT_ONCE)
    simulated = [SimulatedNode(i, url, settings, stop_nodes, gate, go_nodes) for i in indices]
    for node in simulated:
        node.start()
    while not all(node.registered.is_set() for node in simulated):
        if stop.wait(0.05):
            break
    ready.put(sum(node.joined for node in simulated))
    while not go.wait(0.5):
        if stop.is_set():
            break
    go_nodes.set()
    cpu, wall = time.process_time(), time.monotonic()
    stop.wait()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    stop_nodes.set()
    # Calls still running (a lock wait, a retry) are left behind: what they did before the
    # window ended is recorded already.
    deadline = time.monotonic() + 20
    for node in simulated:
        if node.thread is not None:
            node.thread.join(timeout=max(0.0, deadline - time.monotonic()))
    calls: dict[str, list[tuple[float, float]]] = {}
    for node in simulated:
        for name, made in list(node.calls.items()):
            calls.setdefault(name, []).extend((c.started, c.ms) for c in list(made))
    return {
        "calls": calls,
        "gaps": {
            name: [[c.started for c in list(node.calls.get(name, []))] for node in simulated]
            for name in ("heartbeat", "poll")
        },
        "errors": [e for node in simulated for e in list(node.errors)],
        "fenced": sum(node.fenced for node in simulated),
        "cpu_s": cpu,
        "wall_s": wall,
    }


def _latencies(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50": round(pct(values, 0.50), 2),
        "p95": round(pct(values, 0.95), 2),
        "p99": round(pct(values, 0.99), 2),
        "max": round(max(values), 2),
    }


def _late(starts: list[float], interval_ms: int, since: float, until: float) -> tuple[int, int]:
    """(late calls, gaps) among one node's gaps that end inside the window: a call later than
    its interval by more than half of it (measured from the previous call's start)."""
    late = gaps = 0
    for previous, current in zip(starts, starts[1:], strict=False):
        if since <= current <= until:
            gaps += 1
            if (current - previous) * 1000 > interval_ms * (1 + _LATE):
                late += 1
    return late, gaps


def _expected_calls_per_s(settings: ClusterSettings, n: int) -> float:
    return n * sum(
        1000 / ms
        for ms in (
            settings.heartbeat_interval,
            settings.task_polling_interval,
            settings.sweep_interval,
            settings.stranded_master_scan_interval,
        )
    )


def _background(probe: ServerProbe, seconds: float) -> dict[str, Any]:
    before = probe.read()
    time.sleep(seconds)  # the background window: nothing of ours runs
    return rates(before, probe.read(), seconds)


def _net(measured: dict[str, Any], background: dict[str, Any]) -> dict[str, Any]:
    """The window's server rates less the background window's (what our nodes added)."""
    out: dict[str, Any] = {}
    for key in ("statements_per_s", "transactions_per_s", "cpu_percent"):
        if measured.get(key) is not None and background.get(key) is not None:
            out[key] = round(measured[key] - background[key], 1)
    return out


def _collect(queue: Any, count: int, deadline: float) -> list[Any]:
    found: list[Any] = []
    while len(found) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            found.append(queue.get(timeout=min(remaining, 1.0)))
        except Empty:
            continue
    return found


def _run_nodes(
    db: str,
    settings: ClusterSettings,
    n: int,
    p: Params,
    probe: ServerProbe,
    background: dict[str, Any],
    trace_paths: list[str] | None,
) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    go, stop = context.Event(), context.Event()
    processes = max(1, min(p.ceiling_processes, n))
    groups = [range(i, n, processes) for i in range(processes)]
    children = [
        context.Process(
            target=_group,
            args=(
                db,
                settings,
                group,
                trace_paths[k] if trace_paths else None,
                ready,
                go,
                stop,
                results,
            ),
            daemon=True,
        )
        for k, group in enumerate(groups)
    ]
    started = time.monotonic()
    outcomes: list[dict[str, Any]] = []
    try:
        for child in children:
            child.start()
        joined = _collect(ready, processes, time.monotonic() + 60 + n * 0.5)
        if len(joined) < processes or sum(joined) < n:
            return {
                "failed": f"only {sum(joined)} of {n} simulated nodes connected and registered "
                f"within {round(time.monotonic() - started)} s"
            }
        connect_s = time.monotonic() - started
        go.set()
        # Past start-up: every node's first heartbeat and poll fall before the window.
        time.sleep(max(settings.heartbeat_interval, settings.task_polling_interval) / 1000)
        before = probe.read()
        since = time.time()
        read_before = time.monotonic()
        time.sleep(p.ceiling_seconds)  # the measuring window
        until = time.time()
        after = probe.read()
        server_window = time.monotonic() - read_before
        stop.set()
        outcomes = _collect(results, processes, time.monotonic() + 60 + n * 0.1)
    finally:
        stop.set()
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
                child.join()
    failures = [o["error"] for o in outcomes if "error" in o]
    if failures or len(outcomes) < processes:
        reason = failures[0] if failures else "no report within the deadline"
        return {"failed": f"a load-generator process did not report its calls: {reason}"}
    window = until - since
    server = rates(before, after, server_window)
    in_window: dict[str, list[float]] = {}
    for outcome in outcomes:
        for name, calls in outcome["calls"].items():
            in_window.setdefault(name, []).extend(ms for at, ms in calls if since <= at <= until)
    late: dict[str, dict[str, Any]] = {}
    intervals = {"heartbeat": settings.heartbeat_interval, "poll": settings.task_polling_interval}
    for name, interval_ms in intervals.items():
        count = gaps = 0
        for outcome in outcomes:
            for starts in outcome["gaps"][name]:
                found = _late(starts, interval_ms, since, until)
                count, gaps = count + found[0], gaps + found[1]
        late[name] = {"late": count, "of": gaps, "share": round(count / gaps, 4) if gaps else None}
    errors = [e for outcome in outcomes for e in outcome["errors"]]
    calls = sum(len(v) for v in in_window.values())
    expected = _expected_calls_per_s(settings, n)
    cpu = [o["cpu_s"] / o["wall_s"] * 100 for o in outcomes if o["wall_s"] > 0]
    fenced = sum(o["fenced"] for o in outcomes)
    # One process cannot use more than a core (the GIL), nor all of them more than the machine.
    saturated = max(cpu, default=0) > 90 or sum(cpu) > 90 * (os.cpu_count() or 1)
    keeps_up = (late["heartbeat"]["share"] or 0) < 0.01 and not fenced and not errors
    return {
        "nodes": n,
        "keeps_up": keeps_up,
        "load_generator_saturated": saturated,
        "connect_and_register_s": round(connect_s, 1),
        "window_s": round(window, 1),
        "store_calls_per_s": round(calls / window, 1),
        "expected_store_calls_per_s": round(expected, 1),
        "server": server,
        "server_net_of_background": _net(server, background),
        "heartbeat_ms": _latencies(in_window.get("heartbeat", [])),
        "poll_ms": _latencies(in_window.get("poll", [])),
        "sweep_ms": _latencies(in_window.get("sweep", [])),
        "stranded_scan_ms": _latencies(in_window.get("stranded_scan", [])),
        "missed_intervals": {
            "rule": f"a call later than its interval by more than {round(_LATE * 100)}%",
            **late,
        },
        "nodes_declared_dead_while_alive": fenced,
        "errors": len(errors),
        **({"first_error": errors[0]} if errors else {}),
        "load_generator": {
            "processes": processes,
            "cpu_percent_per_process": [round(c, 1) for c in cpu],
        },
    }


def _file_limit(n: int) -> str | None:
    """Raise this process's open-file limit for ``n`` connections (a socket each, three files
    each on SQLite: the database, its WAL and shared memory); why it cannot be, or None."""
    try:
        import resource
    except ImportError:  # not on this platform: let the connections tell
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = n * 4 + 256
    if soft >= needed:
        return None
    if hard != resource.RLIM_INFINITY and hard < needed:
        return f"open-file limit {hard}; raise it (ulimit -n) to {needed} to run {n} nodes"
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return None


def _clear_nodes(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(delete(nodes))


def ceiling(url: str | None, p: Params) -> dict[str, Any]:
    """Simulated nodes at each of ``ceiling_nodes``: statements per second at the database,
    heartbeat and poll latency, missed intervals, the server's CPU."""
    settings = p.settings
    seconds = p.ceiling_seconds
    out: dict[str, Any] = {
        "window_s": seconds,
        "settings_ms": {
            "heartbeat_interval": settings.heartbeat_interval,
            "task_polling_interval": settings.task_polling_interval,
            "sweep_interval": settings.sweep_interval,
            "stranded_master_scan_interval": settings.stranded_master_scan_interval,
        },
        "note": (
            f"nodes are threads of {p.ceiling_processes} load-generator process(es) on this "
            "machine, each node with its own connection; the database's counters are read "
            "before and after each window"
        ),
    }
    with scratch_database(url) as db, tempfile.TemporaryDirectory(prefix="dbcluster-c-") as tmp:
        engine = make_engine(db)
        probe: ServerProbe
        trace_paths: list[str] | None = None
        if engine.url.get_backend_name() == "sqlite":
            trace_paths = [str(Path(tmp, f"trace-{k}.json")) for k in range(p.ceiling_processes)]
            probe = SqliteProbe(engine, trace_paths)
        else:
            probe = probe_for(engine)
        try:
            limit = probe.max_connections()
            out["server_counts"] = probe.counts
            out["server_max_connections"] = limit
            background = _background(probe, min(5.0, max(1.0, seconds / 3)))
            out["background"] = background
            reserved = probe.reserved_connections()
            for n in p.ceiling_nodes:
                if limit is not None:
                    in_use = probe.connections_in_use()
                    if n + in_use + reserved + _OWN_CONNECTIONS > limit:
                        out[f"nodes_{n}"] = {
                            "skipped": f"server max_connections={limit}; raise it to run {n} "
                            f"nodes (in use: {in_use}, reserved: {reserved})"
                        }
                        continue
                files = _file_limit(n)
                if files is not None:
                    out[f"nodes_{n}"] = {"skipped": files}
                    continue
                out[f"nodes_{n}"] = _run_nodes(db, settings, n, p, probe, background, trace_paths)
                _clear_nodes(engine)
        finally:
            engine.dispose()
    return out
