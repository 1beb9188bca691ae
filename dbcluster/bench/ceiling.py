"""``ceiling``: how many nodes one database coordinates at the configured intervals.

Simulated nodes (:mod:`dbcluster.bench.simulated`) are state machines, many per load-generator
process (``ceiling_processes``, one per core by default), run by a fixed pool of threads
(``ceiling_threads`` per process), not a thread each; each node has a connection of its own and
issues the real coordination statements through
:class:`~dbcluster.cluster.store.CoordinationStore` at a node's cadence: ``register`` once, then
the heartbeat and the idle poll (in one round trip where the database can: a node's heartbeat
carries its poll, and its poll the heartbeat, where they coincide), and the maintenance (sweeps,
stranded-master scans) on one node, the lease holder, while the others read the leases (in
their heartbeat's round trip where the database can), or on every node
(``ceiling_maintenance``).

Statements per second at the database come from the server's own counters (see
:mod:`dbcluster.bench.server`), beside the same counters over a background window with no
simulated node connected; sessions waiting for a lock are sampled through the window. The load
generator's CPU, its threads' busy share and how late it starts calls against their due time are
reported, since a saturated generator shows up as missed intervals that are not the database's
(``load_generator_saturated``); ``limit`` says which of the generator, lock waits or the
server's CPU was reached.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import Any

from sqlalchemy import Engine, delete

from dbcluster.bench.common import Params, pct
from dbcluster.bench.connections import NodeEngines
from dbcluster.bench.harness import scratch_database
from dbcluster.bench.server import ServerProbe, SqliteProbe, probe_for, rates
from dbcluster.bench.simulated import (
    Cadence,
    Scheduler,
    SimulatedNode,
    join_all,
    runqueue_wait_s,
    summary,
)
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import nodes

#: Connections the scenario needs beside its nodes (the probe's, and one spare).
_OWN_CONNECTIONS = 2
#: How many simulated nodes connect and register at once while starting.
_CONNECTING_AT_ONCE = 16
#: A call is late when its gap to the previous one exceeds its interval by more than this share.
_LATE = 0.5


def _group(
    url: str,
    settings: ClusterSettings,
    indices: range,
    maintenance: str,
    threads: int,
    listening: bool,
    plain: bool,
    trace_path: str | None,
    ready: Any,
    go: Any,
    stop: Any,
    results: Any,
) -> None:
    """One process of the load generator: the nodes ``indices`` on ``threads`` threads. Says
    ``ready`` with how many joined, starts them on ``go``, stops them on ``stop`` and hands back
    every call, error and the CPU the process used meanwhile. With ``trace_path`` (SQLite),
    counts the statements the library runs into that file."""
    if trace_path is not None:
        from dbcluster.bench import counting

        counting.install_trace()
        counting.start_dumping(trace_path)
    try:
        results.put(
            _run_group(
                url, settings, indices, maintenance, threads, listening, plain, ready, go, stop
            )
        )
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which reports it
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _run_group(
    url: str,
    settings: ClusterSettings,
    indices: range,
    maintenance: str,
    threads: int,
    listening: bool,
    plain: bool,
    ready: Any,
    go: Any,
    stop: Any,
) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        leased = maintenance == "one"
        maintaining = Cadence.of(settings, engine, True, listening, leased)
        idle = Cadence.of(settings, engine, False, listening, leased)
    finally:
        engine.dispose()
    # The lease holder is node 0 (of the first process) where one node maintains for all.
    shared = NodeEngines(url, settings, plain)
    nodes = [
        (
            SimulatedNode(i, url, settings, plain, shared),
            maintaining if maintenance == "every" or i == 0 else idle,
        )
        for i in indices
    ]
    joined = join_all(nodes, _CONNECTING_AT_ONCE, stop.is_set)
    ready.put(len(joined))
    while not go.wait(0.5):
        if stop.is_set():
            break
    scheduler = Scheduler(joined, threads)
    cpu, wall, waited = time.process_time(), time.monotonic(), runqueue_wait_s()
    scheduler.start()
    stop.wait()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    after = runqueue_wait_s()
    waited = None if waited is None or after is None else after - waited
    # Calls still running (a lock wait, a retry) are left behind: what they did before the
    # window ended is recorded already.
    scheduler.stop()
    for node, _ in nodes:
        node.close()
    shared.dispose()
    return {
        **summary(joined),
        "errors": [e for node, _ in nodes for e in list(node.errors)],
        "cpu_s": cpu,
        "wall_s": wall,
        "busy_s": scheduler.busy_s,
        "runqueue_wait_s": waited,
        "threads": threads,
        "cadence": {
            "heartbeat_ms": idle.heartbeat_ms,
            "poll_ms": idle.poll_ms,
            "heartbeat_and_poll_in_one_round_trip": idle.together,
            "lease_read_in_heartbeat": idle.carries_leases,
        },
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
                p.ceiling_maintenance,
                max(1, p.ceiling_threads),
                p.ceiling_listening,
                p.ceiling_plain,
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
        waiters = _sample_lock_waits(probe, p.ceiling_seconds)  # the measuring window
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
    lags: list[float] = []
    for outcome in outcomes:
        for name, calls in outcome["calls"].items():
            inside = [(ms, lag) for at, ms, lag in calls if since <= at <= until]
            in_window.setdefault(name, []).extend(ms for ms, _ in inside)
            lags.extend(lag for _, lag in inside)
    late: dict[str, dict[str, Any]] = {}
    cadence = outcomes[0]["cadence"]
    intervals = {"heartbeat": cadence["heartbeat_ms"], "poll": cadence["poll_ms"]}
    for name, interval_ms in intervals.items():
        count = gaps = 0
        for outcome in outcomes:
            for starts in outcome["gaps"][name]:
                found = _late(starts, interval_ms, since, until)
                count, gaps = count + found[0], gaps + found[1]
        late[name] = {"late": count, "of": gaps, "share": round(count / gaps, 4) if gaps else None}
    errors = [e for outcome in outcomes for e in outcome["errors"]]
    calls = sum(len(v) for v in in_window.values())
    cpu = [o["cpu_s"] / o["wall_s"] * 100 for o in outcomes if o["wall_s"] > 0]
    busy = [o["busy_s"] / (o["wall_s"] * o["threads"]) for o in outcomes if o["wall_s"] > 0]
    fenced_at = [at for o in outcomes for at in o["fenced"]]
    fenced = sum(1 for at in fenced_at if at >= since)
    waits = [
        round(o["runqueue_wait_s"] / o["wall_s"], 2)
        for o in outcomes
        if o["wall_s"] > 0 and o["runqueue_wait_s"] is not None
    ]
    lag = _latencies(lags)
    # One process cannot use more than a core (the GIL), nor all of them more than the machine;
    # or every thread of a process was busy while calls started late.
    saturated = (
        max(cpu, default=0) > 90
        or sum(cpu) > 90 * (os.cpu_count() or 1)
        or (max(busy, default=0) > 0.9 and lag.get("p99", 0) > 100)
    )
    late_share = max(v["share"] or 0 for v in late.values())
    keeps_up = late_share < 0.01 and not fenced and not errors
    net = _net(server, background)
    return {
        "nodes": n,
        "keeps_up": keeps_up,
        "limit": _limit(
            keeps_up,
            saturated,
            max(waits, default=0) >= 0.5 and lag.get("p99", 0) > 100,
            waiters,
            net.get("cpu_percent"),
        ),
        "load_generator_saturated": saturated,
        "connect_and_register_s": round(connect_s, 1),
        "window_s": round(window, 1),
        "cadence_ms": cadence,
        "store_calls_per_s": round(calls / window, 1),
        "server": server,
        "server_net_of_background": net,
        "server_statements_per_node_per_s": (
            round(net["statements_per_s"] / n, 3) if net.get("statements_per_s") else None
        ),
        "lock_waits": waiters,
        "heartbeat_ms": _latencies(in_window.get("heartbeat", [])),
        "poll_ms": _latencies(in_window.get("poll", [])),
        "sweep_ms": _latencies(in_window.get("sweep", [])),
        "stranded_scan_ms": _latencies(in_window.get("stranded_scan", [])),
        "lease_renew_ms": _latencies(in_window.get("renew", [])),
        "lease_read_ms": _latencies(in_window.get("lease_read", [])),
        "missed_intervals": {
            "rule": f"a call later than its interval by more than {round(_LATE * 100)}%",
            **late,
        },
        "nodes_declared_dead_while_alive": fenced,
        "nodes_declared_dead_before_the_window": len(fenced_at) - fenced,
        "errors": len(errors),
        **({"first_error": errors[0]} if errors else {}),
        "load_generator": {
            "processes": processes,
            "threads_per_process": outcomes[0]["threads"],
            "cpu_percent_per_process": [round(c, 1) for c in cpu],
            "threads_busy_share_per_process": [round(b, 3) for b in busy],
            "start_lag_ms": lag,
            # Seconds its threads waited for a CPU per second: near or above 1, the machine
            # (other processes, the server) held the generator back, whatever its own CPU.
            "runqueue_wait_s_per_s_per_process": waits,
        },
        "machine_load_average_1m": round(os.getloadavg()[0], 1),
    }


def _sample_lock_waits(probe: ServerProbe, seconds: float) -> dict[str, Any]:
    """Sessions waiting for a lock, sampled twice a second for ``seconds``: mean and max (None
    where the probe cannot tell)."""
    samples: list[int] = []
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            found = probe.lock_waiters()
        except Exception:  # noqa: BLE001 - a busy server may not answer: not a sample
            found = None
        if found is not None:
            samples.append(found)
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    if not samples:
        return {"sessions_waiting_mean": None, "sessions_waiting_max": None}
    return {
        "sessions_waiting_mean": round(sum(samples) / len(samples), 2),
        "sessions_waiting_max": max(samples),
        "samples": len(samples),
    }


def _limit(
    keeps_up: bool,
    saturated: bool,
    starved: bool,
    waiters: dict[str, Any],
    server_cpu: float | None,
) -> str:
    """Where the limit is, from what was measured: the generator (its CPU or threads, or the
    machine's CPUs it waited for), lock waits, the server's CPU; or not reached."""
    reasons = []
    if saturated:
        reasons.append("load generator (CPU or threads)")
    if starved:
        reasons.append("machine CPUs (the generator waited for a CPU while calls started late)")
    if (waiters.get("sessions_waiting_mean") or 0) >= 1:
        reasons.append("lock waits")
    if server_cpu is not None and server_cpu >= 80 * (os.cpu_count() or 1):
        reasons.append("server CPU")
    if keeps_up:
        return f"not reached (nearest: {', '.join(reasons)})" if reasons else "not reached"
    if not reasons:
        return "unclear (none of generator, locks, server CPU)"
    return ", ".join(reasons)


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
            "wakeup_poll_interval": settings.wakeup_poll_interval,
        },
        "maintenance": p.ceiling_maintenance,
        "listening": p.ceiling_listening,
        "plain_connections": p.ceiling_plain,
        "note": (
            f"nodes are state machines run by {p.ceiling_threads} threads in each of "
            f"{p.ceiling_processes} load-generator process(es) on this machine, each node with "
            "its own connection (two where it sweeps); where the database has wake-ups their "
            "listeners are taken to be up (not opened); the database's counters are read "
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
            per_node = 2 if p.ceiling_maintenance == "every" else 1
            for n in p.ceiling_nodes:
                if limit is not None:
                    in_use = probe.connections_in_use()
                    if n * per_node + 1 + in_use + reserved + _OWN_CONNECTIONS > limit:
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
