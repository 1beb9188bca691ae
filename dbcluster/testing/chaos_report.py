"""What ``dbcluster chaos`` reads back after (and during) a run: kills and the recovery that
followed, master takeovers, the statuses of each job's executions, and the printed summary."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dbcluster.testing.chaos_plan import ALL_KINDS, KINDS

if TYPE_CHECKING:  # the CLI imports chaos: the test application loads only when run
    from dbcluster.testing.rowmark import RowMark


@dataclass
class KillRecord:
    fault: int
    target: str
    prefix: str
    db_time: datetime
    held: list[tuple[int, int]]  # (step execution id, attempt) of transferable in-flight rows


def _db_now(engine: Any) -> datetime:
    from dbcluster.dialects import get_provider

    with engine.connect() as conn:
        return conn.execute(get_provider(engine).select_now()).scalar_one()


def held_transferable_statement(prefix: str) -> Any:
    """The in-flight transferable partitions held by the nodes whose ids start ``prefix-``."""
    from sqlalchemy import select

    from dbcluster.schema import partitions
    from dbcluster.states import PARTITION_IN_FLIGHT

    return select(partitions.c.step_execution_id, partitions.c.attempt).where(
        partitions.c.assigned_node.like(f"{prefix}-%"),
        partitions.c.status.in_(PARTITION_IN_FLIGHT),
        # A bound flag: "IS true" is no SQL on Oracle (SMALLINT flags) or SQL Server.
        partitions.c.transferable == True,  # noqa: E712
    )


def _held_transferable(engine: Any, prefix: str) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(held_transferable_statement(prefix)).all()
    return [(r[0], r[1]) for r in rows]


def _recovery(engine: Any, kill: KillRecord, since: RowMark) -> float | None:
    """Seconds from the kill until the last of the killed node's transferable partitions was
    running elsewhere (its next attempt committed its first chunk); None if none was held or one
    never ran again (its job was abandoned, or it had already completed)."""
    from sqlalchemy import func, select

    from dbcluster.testing.app import runs

    if not kill.held:
        return None
    latest: datetime | None = None
    with engine.connect() as conn:
        for step_id, attempt in kill.held:
            started = conn.execute(
                select(func.min(runs.c.started)).where(
                    runs.c.step_execution_id == step_id,
                    runs.c.attempt > attempt,
                    since.after(runs),
                )
            ).scalar()
            if started is None:
                return None
            latest = started if latest is None or started > latest else latest
    assert latest is not None
    return round(
        (latest.replace(tzinfo=None) - kill.db_time.replace(tzinfo=None)).total_seconds(), 3
    )


def _cause(faults: list[dict[str, Any]], lost: str, at: datetime) -> dict[str, Any] | None:
    """The fault that cost ``lost`` its mastership at ``at``: the last one applied to its process
    before then (a process that lost a job's mastership may follow the job and take later
    faults; a skipped fault did nothing)."""
    for fault in reversed(faults):
        if "skipped" in fault or "db_time" not in fault or not fault.get("prefix"):
            continue
        applied = datetime.fromisoformat(fault["db_time"]).replace(tzinfo=None)
        if lost.startswith(f"{fault['prefix']}-") and applied <= at:
            return fault
    return None


def _takeovers(engine: Any, refs: list[Any], faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every master takeover of these jobs' executions: who took over from whom, when, and how
    long after the fault that hit the lost master (on the database clock)."""
    from sqlalchemy import select

    from dbcluster.batch.parameters import JobParameters
    from dbcluster.batch.repository import JobRepository
    from dbcluster.schema import job_masters

    repository = JobRepository(engine)
    out: list[dict[str, Any]] = []
    for ref in refs:
        instance = repository.get_job_instance(ref.job, JobParameters.parse(ref.params))
        if instance is None:
            continue
        for execution in repository.get_job_executions(instance):
            with engine.connect() as conn:
                rows = conn.execute(
                    select(job_masters)
                    .where(job_masters.c.job_execution_id == execution.id)
                    .order_by(job_masters.c.master_epoch)
                ).all()
            for before, row in zip(rows, rows[1:], strict=False):
                if row.reason != "takeover":
                    continue
                lost = str(before.master_node)
                fault = _cause(faults, lost, row.since.replace(tzinfo=None))
                since_fault = None
                if fault is not None:
                    began = datetime.fromisoformat(fault["db_time"])
                    since_fault = round((row.since.replace(tzinfo=None) - began).total_seconds(), 3)
                out.append(
                    {
                        "job": ref.job,
                        "job_execution_id": execution.id,
                        "epoch": int(row.master_epoch),
                        "from_node": lost,
                        "to_node": row.master_node,
                        "at": row.since.isoformat(),
                        "fault": None if fault is None else fault["index"],
                        "fault_kind": None if fault is None else fault["kind"],
                        "seconds_after_fault": since_fault,
                    }
                )
    return out


def _execution_statuses(repository: Any, ref: Any) -> list[str]:
    """The statuses of the job's executions, oldest first."""
    from dbcluster.batch.parameters import JobParameters

    instance = repository.get_job_instance(ref.job, JobParameters.parse(ref.params))
    if instance is None:
        return []
    executions = sorted(repository.get_job_executions(instance), key=lambda e: e.id)
    return [e.status.value for e in executions]


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"chaos on {s['backend']} ({s['url']}), seed {s['seed']}: "
        f"{s['nodes']} nodes, {s['jobs']} jobs, {s['faults_injected']}/{s['faults_planned']} "
        f"faults injected in {s['elapsed_s']} s",
        "faults by kind: "
        + ", ".join(
            f"{k} {s['faults_by_kind'].get(k, 0)}"
            for k in ALL_KINDS
            if k in KINDS or k in s["faults_by_kind"]
        )
        + f"  (on masters: {s['faults_by_role'].get('master', 0)}; cut: {s['cut_method']})",
        f"partitions {s['partitions']}, runs {s['partitions_run']}, re-runs {s['reruns']}, "
        f"job restarts {s['job_restarts']}, abandoned executions {s['abandoned_executions']}"
        f" (faults on: {s.get('target', 'any')}; launches repeated before their execution"
        f" existed: {s.get('relaunches_before_start', 0)})",
        f"duplicate non-transferable effects {s['duplicate_non_transferable_effects']}, "
        f"lost partitions {s['lost_partitions']}, stuck jobs {s['stuck_jobs']}",
    ]
    for c in s.get("restart_causes", []):
        lines.append(
            f"  restart of job {c['job']}: execution {c['job_execution_id']} ended {c['status']} "
            f"({c['exit_code']}: {c['exit_description'][:120]})"
        )
    for t in s.get("takeovers", []):
        after = (
            "" if t["seconds_after_fault"] is None else f" {t['seconds_after_fault']:.2f} s after"
        )
        lines.append(
            f"  takeover of execution {t['job_execution_id']} (epoch {t['epoch']}) by "
            f"{t['to_node']}{after} fault #{t['fault']} ({t['fault_kind']}) on {t['from_node']}"
        )
    for d in s.get("db_faults", []):
        took = ""
        if "ended_s" in d:
            took = f", {d['ended_s'] - d['started_s']:.1f} s"
        state = "ok" if d.get("ok") else "COMMAND FAILED"
        lines.append(
            f"  database fault #{d['index']} {d['kind']} on {d['applied_to']} at "
            f"{d.get('started_s', d['at_actual'])} s ({state}{took})"
        )
    if s.get("launch_exit_codes"):
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(s["launch_exit_codes"].items()))
        lines.append(f"launch processes ended with exit status (status: count) {codes}")
    logs = s.get("logs")
    if logs is not None:
        per = ""
        if logs.get("outages"):
            per = (
                f" ({logs['errors_per_outage']} ERROR lines and "
                f"{logs['tracebacks_per_outage']} tracebacks per database outage)"
            )
        lines.append(
            f"node logs: {logs['errors']} ERROR lines, {logs['tracebacks']} tracebacks, "
            f"{logs['warnings']} WARNING lines{per}"
        )
        for top in logs["top_errors"][:5]:
            lines.append(f"    {top['count']} x {top['message']}")
    for r in s["recovery_after_kill"]:
        got = "n/a" if r["recovery_s"] is None else f"{r['recovery_s']:.2f} s"
        lines.append(
            f"  kill #{r['fault']} {r['target']}: {r['transferable_partitions_held']} transferable "
            f"partition(s) held, running elsewhere after {got} "
            f"(floor cleanup+orphan check = {r['floor_s']:.2f} s)"
        )
    for r in s.get("leader_faults", []):
        got = "not moved" if r["lease_taken_s"] is None else f"{r['lease_taken_s']:.2f} s"
        lines.append(
            f"  {r['kind']} #{r['fault']} {r['target']}: sweep lease held by another node after "
            f"{got} (bound term+interval = {r['bound_s']:.2f} s)"
        )
    for key, inv in s["invariants"].items():
        mark = "held" if inv["held"] else "VIOLATED"
        if not inv.get("enforced", True):
            mark += " (reported, not enforced: node faults mixed in, or no database fault)"
        lines.append(f"invariant {key} {mark}: {inv['statement']}")
        for v in inv["violations"][:10]:
            lines.append(f"    {v}")
    if s.get("db_fault_commands_failed"):
        lines.append(
            f"database fault command(s) failed: faults {s['db_fault_commands_failed']} "
            "(the run proves nothing about them)"
        )
    lines.append("OK: every invariant held" if s["ok"] else "FAILED: an invariant was violated")
    return "\n".join(lines)
