"""``dbcluster demo``: a cluster that loses a worker mid-run and still gets the right answer.

The driver (:func:`run_demo`) creates the database (a SQLite file in a temporary folder unless a
URL is given), starts worker processes (``dbcluster worker``) running the demo application
(:mod:`dbcluster.demo`), launches its job with this process as its master (it runs no partitions
itself), SIGKILLs one worker while it runs partitions, narrates the reassignment from the
coordination tables, and checks the cluster's total against a single-process sum of the same
receipts.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from sqlalchemy import Engine, func, select

from dbcluster.cli.engines import open_engine
from dbcluster.cli.options import connect_timeout_option
from dbcluster.demo import (
    APP,
    DEMO_SETTINGS,
    JOB_NAME,
    demo_metadata,
    load_receipts,
    money,
    registry,
    results,
    single_process_total,
)
from dbcluster.schema import nodes, partitions, step_execution
from dbcluster.states import NODE_ACTIVE, NODE_UNREACHABLE, PARTITION_CLAIMED

if TYPE_CHECKING:
    from rich.console import Console


@click.command()
@click.option(
    "--nodes",
    type=click.IntRange(min=2, max=16),
    default=3,
    show_default=True,
    help="Worker processes to start (one of them is killed).",
)
@click.option(
    "--url",
    envvar="DBCLUSTER_DEMO_URL",
    help="Run on this database instead of a temporary SQLite file (or set "
    "DBCLUSTER_DEMO_URL; DBCLUSTER_URL is ignored on purpose).",
)
@connect_timeout_option()
@click.option("-v", "--verbose", is_flag=True, help="Show the workers' log lines too.")
def demo(nodes: int, url: str | None, verbose: bool) -> None:
    """Watch a cluster survive a dead worker: N worker processes sum receipts by id range, one
    is killed mid-run, its partitions move, and the total is checked. Needs no server."""
    sys.exit(run_demo(nodes=nodes, url=url, verbose=verbose))


#: The only variable of the caller's ``DBCLUSTER_*`` the demo's workers keep: how long to wait a
#: database outage out. The others steer a real deployment (its log level, its settings, its
#: listening URL); the demo runs on its own, as its master does, and reads its workers' INFO
#: lines (a caller's ``DBCLUSTER_LOG_LEVEL=warning`` left it waiting for workers that had
#: joined, then failing).
KEPT_FROM_CALLER = ("DBCLUSTER_CONNECT_TIMEOUT",)


def worker_env(url: str, name: str) -> dict[str, str]:
    """The environment of the demo's worker ``name`` on ``url``."""
    own = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DBCLUSTER_") or k in KEPT_FROM_CALLER
    }
    return {
        **own,
        **DEMO_SETTINGS,
        "DBCLUSTER_URL": url,
        "DBCLUSTER_NODE_ID_PREFIX": name,
        "DBCLUSTER_LOG_LEVEL": "info",
        "DBCLUSTER_LOG_FORMAT": "text",
    }


class Workers:
    """``dbcluster worker`` subprocesses, stopped by pid whatever happens."""

    def __init__(self, url: str, log_dir: Path) -> None:
        self.url = url
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.log"
        self.logs[name] = log
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dbcluster.cli", "worker", "--app", APP],
                env=worker_env(self.url, name),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def node_id(self, name: str) -> str | None:
        """The node id the worker announced (its first one)."""
        try:
            text = self.logs[name].read_text(errors="replace")
        except OSError:
            return None
        found = re.search(r"node (\S+) joined the cluster", text)
        return found[1] if found else None

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def tail(self, name: str, lines: int = 5) -> str:
        try:
            text = self.logs[name].read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop_all(self) -> None:
        alive = [p for p in self.procs.values() if p.poll() is None]
        for p in alive:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 8
        for p in alive:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def _wait(predicate: Any, timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


def run_demo(
    nodes: int = 3, url: str | None = None, verbose: bool = False, console: Console | None = None
) -> int:
    """Run the demo; the exit status (0 only when the job completed with the correct total).
    ``verbose`` prints the workers' logs at the end."""
    from rich.console import Console

    out = console or Console(highlight=False, soft_wrap=True)
    work_dir = Path(tempfile.mkdtemp(prefix="dbcluster-demo-"))
    own_database = url is None
    if url is None:
        url = f"sqlite:///{work_dir / 'demo.db'}"
    workers = Workers(url, work_dir)
    previous_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    try:
        return _run(out, url, own_database, nodes, workers, work_dir)
    except KeyboardInterrupt:
        out.print("[yellow]interrupted: stopping the workers[/]")
        return 130
    finally:
        workers.stop_all()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_term)
        if verbose:
            for name in workers.procs:
                out.rule(f"log of worker {name}")
                out.print(workers.tail(name, 10_000), markup=False, highlight=False)
        shutil.rmtree(work_dir, ignore_errors=True)


def _run(
    out: Console,
    url: str,
    own_database: bool,
    nodes_count: int,
    workers: Workers,
    work_dir: Path,
) -> int:
    from dbcluster.cluster import Cluster, ClusterSettings
    from dbcluster.cluster.events import ClusterEvents
    from dbcluster.dialects import get_provider, safe_url
    from dbcluster.views import short_node

    began = time.monotonic()
    where = f"a SQLite file in {work_dir}" if own_database else safe_url(url)
    out.print(f"[bold]dbcluster demo[/]: {nodes_count} worker processes on {where}")
    engine = open_engine(url)
    try:
        get_provider(engine).create_tables(engine)
        demo_metadata.create_all(engine)
        load_receipts(engine)
        ref_count, ref_total = single_process_total(engine)
        out.print(
            f"  loaded {ref_count:,} receipts; single-process total: [bold]{money(ref_total)}[/]"
        )

        names = [f"demo-w{i + 1}" for i in range(nodes_count)]
        for name in names:
            proc = workers.start(name)
            out.print(f"  started worker {name} (pid {proc.pid})")
        ids: dict[str, str] = {}

        def joined() -> bool:
            if workers.dead():
                return True
            for name in names:
                node_id = ids.get(name) or workers.node_id(name)
                if node_id:
                    ids[name] = node_id
            return len(ids) == len(names)

        if not _wait(joined, 60) or workers.dead():
            for name in workers.dead() or names:
                out.print(f"[red]worker {name} did not start:[/]\n{workers.tail(name)}")
            return 1
        out.print(f"  {len(ids)} worker nodes joined: " + ", ".join(map(short_node, ids.values())))

        settings = ClusterSettings.from_env(DEMO_SETTINGS, node_id_prefix="demo-master")
        cluster = Cluster(url, registry, settings, work=False)
        cluster.start()
        placed: dict[str, Any] = {}

        class OnPlaced(ClusterEvents):
            def placed(self, master: str, job_execution_id: int, step_id: int, _: Any) -> None:
                placed["master"] = step_id

        cluster.node.events.subscribe(OnPlaced())
        outcome: dict[str, Any] = {}

        def master() -> None:
            try:
                outcome["execution"] = cluster.launch(
                    JOB_NAME, {"run": uuid.uuid4().hex[:12], "pace_ms": 250}
                )
            except BaseException as exc:  # noqa: BLE001 - reported by the driver
                outcome["error"] = exc

        thread = threading.Thread(target=master, name="demo-master", daemon=True)
        thread.start()
        try:
            return _watch(out, engine, workers, ids, names, placed, outcome, thread, began)
        finally:
            workers.stop_all()
            cluster.stop(2000)
    finally:
        engine.dispose()


def _partition_rows(engine: Engine, master_id: int) -> dict[str, Any]:
    stmt = (
        select(
            partitions.c.partition_name,
            partitions.c.assigned_node,
            partitions.c.status,
            partitions.c.attempt,
            partitions.c.job_execution_id,
            step_execution.c.read_count,
        )
        .join(step_execution, step_execution.c.step_execution_id == partitions.c.step_execution_id)
        .where(partitions.c.master_step_execution_id == master_id)
        .order_by(partitions.c.partition_name)
    )
    with engine.connect() as conn:
        return {r.partition_name: r for r in conn.execute(stmt)}


def _node_statuses(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {r.node_id: r.status for r in conn.execute(select(nodes.c.node_id, nodes.c.status))}


def _watch(
    out: Console,
    engine: Engine,
    workers: Workers,
    ids: Mapping[str, str],
    names: list[str],
    placed: dict[str, Any],
    outcome: dict[str, Any],
    thread: threading.Thread,
    began: float,
) -> int:
    from dbcluster.batch.status import BatchStatus
    from dbcluster.views import short_node

    if not _wait(lambda: "master" in placed or not thread.is_alive(), 60):
        out.print("[red]the master did not place the partitions within 60 s[/]")
        return 1
    if "master" not in placed:
        out.print(f"[red]the job did not start: {outcome.get('error')}[/]")
        return 1
    master_id = int(placed["master"])
    rows = _partition_rows(engine, master_id)
    per_node: dict[str, int] = {}
    for r in rows.values():
        per_node[short_node(r.assigned_node)] = per_node.get(short_node(r.assigned_node), 0) + 1
    job_execution_id = next(iter(rows.values())).job_execution_id if rows else None
    out.print(
        f"  launched {JOB_NAME}, execution {job_execution_id}: {len(rows)} partitions "
        f"placed on {len(per_node)} nodes ("
        + ", ".join(f"{n} {c}" for n, c in sorted(per_node.items()))
        + "); this process is the master"
    )

    victim = names[0]
    victim_id = ids[victim]

    def victim_mid_run() -> bool:
        now = _partition_rows(engine, master_id)
        return (
            any(
                r.assigned_node == victim_id and r.status == PARTITION_CLAIMED and r.read_count > 0
                for r in now.values()
            )
            or not thread.is_alive()
        )

    if not _wait(victim_mid_run, 30, 0.02):
        out.print("[red]the victim never started a partition[/]")
        return 1
    now = _partition_rows(engine, master_id)
    held = [
        n for n, r in now.items() if r.assigned_node == victim_id and r.status == PARTITION_CLAIMED
    ]
    os.kill(workers.procs[victim].pid, signal.SIGKILL)
    workers.procs[victim].wait()
    out.print(
        f"[bold red]  SIGKILL[/] worker {victim} (pid {workers.procs[victim].pid}, node "
        f"{short_node(victim_id)}) while it runs {len(held)} partition(s): " + ", ".join(held)
    )
    killed_at = time.monotonic()

    seen = {n: (r.assigned_node, r.attempt, r.status) for n, r in now.items()}
    victim_state = NODE_ACTIVE
    reassigned = 0
    last_done = -1
    deadline = time.monotonic() + 90
    while True:
        alive = thread.is_alive()
        statuses = _node_statuses(engine)
        state = statuses.get(victim_id, "REMOVED")
        if state != victim_state:
            t = time.monotonic() - killed_at
            if state == NODE_UNREACHABLE:
                out.print(f"  +{t:.1f}s node {short_node(victim_id)} is silent: UNREACHABLE")
            elif state == "REMOVED":
                out.print(f"  +{t:.1f}s node {short_node(victim_id)} removed from the cluster")
            victim_state = state
        now = _partition_rows(engine, master_id)
        for name, r in now.items():
            before = seen.get(name)
            if before and r.attempt > before[1] and r.assigned_node == before[0]:
                # A new attempt still on its old node: re-placed and not yet taken by a live
                # node (or taken up again by a live one). It is told when it has moved.
                continue
            if before and r.attempt > before[1]:
                reassigned += 1
                out.print(
                    f"[bold green]  +{time.monotonic() - killed_at:.1f}s reassigned[/] {name} "
                    f"from {short_node(before[0])} to {short_node(r.assigned_node)} "
                    f"(attempt {r.attempt}, resumes after {r.read_count:,} receipts)"
                )
            seen[name] = (r.assigned_node, r.attempt, r.status)
        done = sum(1 for r in now.values() if r.status in ("COMPLETED", "FAILED"))
        if done != last_done:
            by_node: dict[str, list[int]] = {}
            for r in now.values():
                counts = by_node.setdefault(short_node(r.assigned_node), [0, 0])
                counts[1] += 1
                counts[0] += r.status in ("COMPLETED", "FAILED")
            out.print(
                f"  progress {done}/{len(now)}: "
                + ", ".join(f"{n} {d}/{t}" for n, (d, t) in sorted(by_node.items())),
                style="dim",
            )
            last_done = done
        if not alive:
            break
        if time.monotonic() > deadline:
            out.print("[red]the job did not finish within 90 s[/]")
            return 1
        time.sleep(0.1)

    if "error" in outcome:
        out.print(f"[red]the master failed: {outcome['error']}[/]")
        return 1
    execution = outcome["execution"]
    elapsed = time.monotonic() - began
    with engine.connect() as conn:
        count, total, rows_written = conn.execute(
            select(
                func.coalesce(func.sum(results.c.receipts), 0),
                func.coalesce(func.sum(results.c.total_cents), 0),
                func.count(),
            ).where(results.c.job_execution_id == execution.id)
        ).one()
    ref_count, ref_total = single_process_total(engine)
    out.print(
        f"  job {JOB_NAME} execution {execution.id}: [bold]{execution.status.value}[/] "
        f"({reassigned} partition(s) reassigned, demo took {elapsed:.1f}s)"
    )
    out.print(f"  cluster total:        {money(int(total))} from {int(count):,} receipts")
    out.print(f"  single-process total: {money(ref_total)} from {ref_count:,} receipts")
    ok = (
        execution.status is BatchStatus.COMPLETED
        and int(total) == ref_total
        and int(count) == ref_count
        and int(rows_written) == len(seen)
    )
    if not reassigned:
        out.print("[yellow]  note: no partition needed to move this time[/]")
    if ok:
        out.print("[bold green]OK[/]: the totals match; no receipt was lost or counted twice")
        return 0
    out.print(
        f"[bold red]MISMATCH[/]: status {execution.status.value}, {int(rows_written)} result "
        f"rows for {len(seen)} partitions"
    )
    return 1
