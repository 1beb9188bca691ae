"""What the ``dbcluster`` command prints: tables for ``status``/``jobs``/``job`` and the progress
display of ``launch``/``restart``.

Tables go to stdout; progress goes to stderr (a live bar on a terminal, one plain line per change
otherwise), so ``--json`` output on stdout is never mixed with it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from sqlalchemy import Engine

from dbcluster.masking import mask_secrets
from dbcluster.monitor import (
    ClusterStatus,
    JobDetail,
    JobRow,
    PartitionRow,
    partition_progress,
    utc_iso,
)
from dbcluster.states import (
    PARTITION_COMPLETED,
    PARTITION_FAILED,
    PARTITION_IN_FLIGHT,
    PARTITION_STATUSES,
)

_UUID_TAIL = re.compile(r"^(?P<head>.+)-(?P<uuid>[0-9a-f]{32})$")


def short_node(node_id: str | None) -> str:
    """``prefix-<32 hex>`` shortened to ``prefix-<6 hex>`` for display."""
    if not node_id:
        return "-"
    match = _UUID_TAIL.match(node_id)
    return f"{match['head']}-{match['uuid'][:6]}" if match else node_id


def stdout_console(file: IO[str] | None = None) -> Console:
    console = Console(file=file, highlight=False)
    if not console.is_terminal:
        # Piped: no wrapping at 80 columns, so each row stays on one line for grep.
        console = Console(file=file, highlight=False, width=250, no_color=True)
    return console


def fmt_age(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 10_000:
        return f"{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{ms // 60_000}m{ms // 1000 % 60:02d}s"
    return f"{ms // 3_600_000}h{ms // 60_000 % 60:02d}m"


def fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def fmt_duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start).total_seconds():.1f}s"


def fmt_counts(counts: dict[str, int]) -> str:
    if not counts:
        return "-"
    order = PARTITION_STATUSES
    keys = [k for k in order if k in counts] + sorted(k for k in counts if k not in order)
    return ", ".join(f"{counts[k]} {k.lower()}" for k in keys)


def status_tables(status: ClusterStatus) -> list[Any]:
    nodes = Table(title=f"Nodes ({len(status.nodes)})", title_justify="left")
    for name in ("node", "host", "status", "load", "capacity", "heartbeat age"):
        nodes.add_column(name, justify="right" if name in ("load", "capacity") else "left")
    for n in status.nodes:
        nodes.add_row(
            n.node_id,
            n.host,
            n.status,
            str(n.load),
            str(n.capacity) if n.capacity else "0 (master only)",
            fmt_age(n.heartbeat_age_ms),
        )
    jobs = Table(title=f"Jobs in flight ({len(status.jobs)})", title_justify="left")
    for name in ("execution", "job", "status", "master", "coordination", "started", "partitions"):
        jobs.add_column(name)
    for j in status.jobs:
        jobs.add_row(
            str(j.job_execution_id),
            j.job,
            j.status,
            j.master or "-",
            j.coordination or "-",
            fmt_time(j.start_time),
            fmt_counts(j.partitions),
        )
    return [nodes, jobs]


def jobs_table(rows: list[JobRow]) -> Table:
    table = Table(title=f"Recent job executions ({len(rows)})", title_justify="left")
    for name in ("execution", "job", "status", "exit", "started", "duration", "partitions"):
        table.add_column(name)
    for j in rows:
        done = j.partitions.get("COMPLETED", 0)
        parts = f"{done}/{j.partitions_total}" if j.partitions_total else "-"
        failed = j.partitions.get(PARTITION_FAILED, 0)
        if failed:
            parts += f" ({failed} failed)"
        table.add_row(
            str(j.job_execution_id),
            j.job,
            j.status,
            j.exit_code or "-",
            fmt_time(j.start_time),
            fmt_duration(j.start_time, j.end_time),
            parts,
        )
    return table


def job_renderables(detail: JobDetail) -> list[Any]:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("execution", f"{detail.job_execution_id} (instance {detail.job_instance_id})")
    head.add_row("job", detail.job)
    head.add_row("status", f"{detail.status} (exit {detail.exit_code or '-'})")
    if detail.exit_message:
        head.add_row("exit message", mask_secrets(detail.exit_message))
    head.add_row("parameters", mask_secrets(" ".join(detail.parameters)) or "-")
    head.add_row("started", fmt_time(detail.start_time))
    head.add_row("ended", fmt_time(detail.end_time))
    head.add_row("duration", fmt_duration(detail.start_time, detail.end_time))
    head.add_row("master", f"{detail.master or '-'} (coordination {detail.coordination or '-'})")
    head.add_row("partitions", fmt_counts(detail.partition_counts))
    parts = Table(title=f"Partitions ({len(detail.partitions)})", title_justify="left")
    for name in ("partition", "node", "status", "attempt", "transferable", "last update"):
        parts.add_column(name, justify="right" if name == "attempt" else "left")
    for p in detail.partitions:
        parts.add_row(
            p.name,
            p.node or "-",
            p.status,
            str(p.attempt),
            "yes" if p.transferable else "no",
            f"{fmt_age(p.age_ms)} ago",
        )
    steps = Table(title=f"Step executions ({len(detail.steps)})", title_justify="left")
    columns = ("id", "step", "status", "exit", "read", "write", "commits", "duration", "context")
    for name in columns:
        steps.add_column(name, justify="right" if name in ("read", "write", "commits") else "left")
    for s in detail.steps:
        steps.add_row(
            str(s.step_execution_id),
            s.name,
            s.status,
            s.exit_code or "-",
            str(s.read_count),
            str(s.write_count),
            str(s.commit_count),
            fmt_duration(s.start_time, s.end_time),
            fmt_context(s.context),
        )
    failed = _failed_partitions(detail)
    failures = Table(title=f"Failures ({len(failed)})", title_justify="left")
    for name in ("partition", "node", "attempt", "reason"):
        failures.add_column(name, justify="right" if name == "attempt" else "left")
    for p in failed:
        failures.add_row(p.name, p.node or "-", str(p.attempt), mask_secrets(p.exit_message or "-"))
    masters = Table(title=f"Masters ({len(detail.masters)})", title_justify="left")
    for name in ("epoch", "node", "how", "since"):
        masters.add_column(name, justify="right" if name == "epoch" else "left")
    for m in detail.masters:
        masters.add_row(str(m.epoch), m.node, m.reason, fmt_time(m.since))
    return [head, parts, *([failures] if failed else []), steps, masters]


#: The longest step context `dbcluster job` shows in its table (`--json` has all of it).
CONTEXT_WIDTH = 60


def fmt_context(context: dict[str, Any]) -> str:
    """A step's context for the table: its keys and values, cut at :data:`CONTEXT_WIDTH`."""
    if not context:
        return "-"
    text = mask_secrets(
        " ".join(
            f"{k}={json.dumps(v, separators=(',', ':'), default=str)}" for k, v in context.items()
        )
    )
    return text if len(text) <= CONTEXT_WIDTH else text[: CONTEXT_WIDTH - 3] + "..."


#: The failed partitions a launch's summary names with their reasons; `dbcluster job` has all.
SUMMARY_FAILURES = 5


def _failed_partitions(detail: JobDetail) -> list[PartitionRow]:
    return [p for p in detail.partitions if p.status == PARTITION_FAILED]


def summary_lines(detail: JobDetail, elapsed_s: float | None = None) -> list[str]:
    """The final summary of a run: outcome, partitions, per-node completions, reassignments."""
    took = f" in {elapsed_s:.1f}s" if elapsed_s is not None else ""
    lines = [f"job {detail.job} execution {detail.job_execution_id}: {detail.status}{took}"]
    if detail.exit_message and detail.status != "COMPLETED":
        lines.append(f"  reason: {mask_secrets(detail.exit_message)}")
    if len(detail.masters) > 1:
        lines.append(
            "  masters: "
            + ", then ".join(
                f"{short_node(m.node)} (epoch {m.epoch}, {m.reason})" for m in detail.masters
            )
        )
    if detail.partitions:
        reassigned = sum(1 for p in detail.partitions if p.attempt > 1)
        lines.append(
            f"  partitions: {fmt_counts(detail.partition_counts)}"
            + (f"; {reassigned} reassigned" if reassigned else "")
        )
        per_node: dict[str, int] = {}
        for p in detail.partitions:
            if p.status == "COMPLETED":
                key = short_node(p.node)
                per_node[key] = per_node.get(key, 0) + 1
        if per_node:
            lines.append(
                "  completed per node: "
                + ", ".join(f"{n} {c}" for n, c in sorted(per_node.items()))
            )
        # Why they failed: the job's reason names the partitions only.
        failed = _failed_partitions(detail)
        for p in failed[:SUMMARY_FAILURES]:
            lines.append(
                f"  failed {p.name} on {short_node(p.node)} (attempt {p.attempt}): "
                + mask_secrets(p.exit_message or "no reason recorded")
            )
        if len(failed) > SUMMARY_FAILURES:
            lines.append(
                f"  ... and {len(failed) - SUMMARY_FAILURES} more failed: "
                f"dbcluster job {detail.job_execution_id}"
            )
    return lines


def summary_json(detail: JobDetail) -> dict[str, Any]:
    per_node: dict[str, int] = {}
    for p in detail.partitions:
        if p.status == "COMPLETED" and p.node:
            per_node[p.node] = per_node.get(p.node, 0) + 1
    return {
        "partitions": detail.partition_counts,
        "reassigned": sum(1 for p in detail.partitions if p.attempt > 1),
        "completed_per_node": per_node,
        "masters": [
            {
                "node": m.node,
                "epoch": m.epoch,
                "reason": m.reason,
                "since": utc_iso(m.since) if m.since else None,
            }
            for m in detail.masters
        ],
    }


class LaunchProgress:
    """The ``progress`` hook of a :class:`~dbcluster.cluster.ClusterPartitionHandler`: a bar of
    partitions done / total per partitioned step, with per-node counts, on stderr.

    The hook runs on the master's monitor thread; per-node counts are re-read at most every
    ``min_interval_s``. On a terminal it is a live bar; elsewhere one line per change.
    """

    def __init__(
        self, engine: Engine, console: Console | None = None, min_interval_s: float = 0.25
    ) -> None:
        self.engine = engine
        self.console = console or Console(stderr=True, highlight=False)
        self.live = self.console.is_terminal
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._progress: Progress | None = None
        self._tasks: dict[int, TaskID] = {}
        self._last_read: dict[int, float] = {}
        self._last_line: dict[int, str] = {}
        self._step_names: dict[int, str] = {}

    def __enter__(self) -> LaunchProgress:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[nodes]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _step_name(self, master_id: int) -> str:
        if master_id not in self._step_names:
            from dbcluster.batch.repository import JobRepository

            try:
                se = JobRepository(self.engine).get_step_execution(master_id)
                self._step_names[master_id] = se.step_name if se else f"step {master_id}"
            except Exception:  # noqa: BLE001 - a label is not worth failing a job for
                self._step_names[master_id] = f"step {master_id}"
        return self._step_names[master_id]

    def __call__(self, master_id: int, counts: dict[str, int]) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_read.get(master_id, 0.0) < self.min_interval_s and sum(
                counts.get(s, 0) for s in PARTITION_IN_FLIGHT
            ):
                return
            self._last_read[master_id] = now
        try:
            by_node = partition_progress(self.engine, master_id)
        except Exception:  # noqa: BLE001 - progress must never break the master
            return
        self.show(master_id, counts, by_node)

    def show(
        self, master_id: int, counts: dict[str, int], by_node: dict[str, dict[str, int]]
    ) -> None:
        total = sum(counts.values())
        done = counts.get(PARTITION_COMPLETED, 0) + counts.get(PARTITION_FAILED, 0)
        nodes = ", ".join(
            f"{short_node(node) if node else '(unplaced)'} "
            f"{c.get('COMPLETED', 0) + c.get('FAILED', 0)}/{sum(c.values())}"
            for node, c in sorted(by_node.items())
        )
        failed = counts.get(PARTITION_FAILED, 0)
        label = self._step_name(master_id)
        if self._progress is not None:
            with self._lock:
                task = self._tasks.get(master_id)
                if task is None:
                    task = self._progress.add_task(label, total=total, nodes="")
                    self._tasks[master_id] = task
            self._progress.update(
                task,
                total=total,
                completed=done,
                nodes=nodes + (f" [red]{failed} failed[/]" if failed else ""),
            )
            return
        line = f"{label}: {done}/{total} partitions done" + (
            f" ({failed} failed)" if failed else ""
        )
        line += f" | {nodes}" if nodes else ""
        with self._lock:
            if self._last_line.get(master_id) == line:
                return
            self._last_line[master_id] = line
        self.console.print(line, markup=False, soft_wrap=True)
