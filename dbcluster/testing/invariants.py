"""The cluster invariants, checked from data: the job repository, the coordination tables, the test
application's ``dbc_test_runs`` and ``dbc_test_ledger`` tables, and registry samples taken with the
database clock (:class:`~dbcluster.testing.harness.MembershipObserver`).

A *run* is an attempt of a partition that committed its first chunk; an *effect* is a ledger row
(it commits with the partition's final chunk). Both commit in the partition's guarded transaction,
so a fenced node leaves neither. Removal times come from samples: a node removed at time T was
seen at ``last_seen`` < T <= ``first_absent``; a check fails only on a certain violation.

Fencing is judged by commit order, not statement time: every fenced transaction of the test
application records, as its last statement before ``COMMIT``, the owner row it holds
(``dbc_test_commits``). A committed row whose owner is not its writer (the partition moved to
another node or attempt, or the job to another master or epoch) is a write that landed after its
partition or job moved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table, select

from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.inlists import in_batches
from dbcluster.schema import job_coordination, partitions
from dbcluster.states import COORD_ABANDONED, COORD_IN_FLIGHT, PARTITION_IN_FLIGHT
from dbcluster.testing.app import commits, expected_total, ledger, master_effects, runs
from dbcluster.testing.rowmark import EVERY_ROW, RowMark

INVARIANTS = {
    1: "no partition silently lost; no job stuck STARTED",
    2: "a non-transferable partition's effect at most once (nodes and restarts)",
    3: "a transferable partition ran again only after its first node was removed",
    4: "no transaction of a partition committed after the partition moved (commit order)",
    5: "a job whose master died is recovered by exactly one node and completes; no old master "
    "committed after another took over",
    6: "every completed job's output equals a fault-free run's",
}

#: Statuses a fenced partition transaction may see its own row in: holding it, or (its final
#: transaction) having just recorded its outcome.
_HELD = ("CLAIMED",)
_ENDED = ("COMPLETED", "FAILED")
_MASTERED = ("CREATED", "STARTED")


def commit_in_order(row: Any) -> bool:
    """Whether a ``dbc_test_commits`` row committed while its writer still owned its row."""
    if row.kind == "partition":
        if row.seen_node == row.node_id and row.seen_token == row.token:
            # PENDING on its node under its attempt: a partition run before it was claimed
            # (cluster/placed.py), whose first transaction's guard claims it. A final write sent
            # with its COMMIT runs that guard after this read, which locked the row: the guard
            # finds it so (no claimed partition goes back to PENDING under the same attempt).
            return (
                row.seen_status in _HELD
                or row.seen_status == "PENDING"
                or (row.final and row.seen_status in _ENDED)
            )
        # A final transaction that handed its partition back (a graceful stop).
        return bool(
            row.final
            and row.seen_status == "PENDING"
            and row.seen_node is None
            and row.seen_token == row.token + 1
        )
    if row.seen_node == row.node_id and row.seen_token == row.token:
        return row.seen_status in _MASTERED or (row.final and row.seen_status in _ENDED)
    return False


@dataclass
class JobRef:
    """A job instance by name and ``name=value`` parameter strings (as given to ``launch``)."""

    job: str
    params: Sequence[str]
    items: int = 1000
    #: Whether the job ends with a step its master runs itself (one effect when COMPLETED).
    master_step: bool = False


@dataclass
class Report:
    violations: dict[int, list[str]] = field(default_factory=lambda: {k: [] for k in INVARIANTS})
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def add(self, invariant: int, message: str) -> None:
        self.violations[invariant].append(message)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "invariants": {
                str(k): {
                    "statement": INVARIANTS[k],
                    "held": not self.violations[k],
                    "violations": self.violations[k][:50],
                }
                for k in INVARIANTS
            },
            **self.stats,
        }


def _of_executions(
    conn: Connection, table: Table, ids: list[int], since: RowMark = EVERY_ROW
) -> list[Any]:
    """The rows of ``table`` that belong to these job executions (and, for a test table, were
    written after ``since``)."""
    rows: list[Any] = []
    for batch in in_batches(ids):
        rows.extend(
            conn.execute(
                select(table).where(table.c.job_execution_id.in_(batch), since.after(table))
            ).all()
        )
    return rows


def _naive(value: datetime | None) -> datetime | None:
    return None if value is None else value.replace(tzinfo=None)


def check_invariants(
    engine: Engine,
    jobs: Iterable[JobRef],
    *,
    removed_at: dict[str, datetime | None] | None = None,
    last_seen: dict[str, datetime] | None = None,
    expect_complete: bool = True,
    since: RowMark = EVERY_ROW,
) -> Report:
    """Check every invariant for the given job instances. ``removed_at`` / ``last_seen`` map node
    ids to the first sample without them / the last sample with them (database clock); without
    them the timing checks of invariants 3 and 4 are skipped (reported in ``stats``). ``since``
    leaves out test-table rows of earlier runs in the same database (their execution ids may be
    this run's again)."""
    report = Report()
    repository = JobRepository(engine)
    removed = {k: _naive(v) for k, v in (removed_at or {}).items()}
    seen = {k: _naive(v) for k, v in (last_seen or {}).items()}
    timing = removed_at is not None
    totals = defaultdict(int)
    for ref in jobs:
        params = JobParameters.parse(ref.params)
        instance = repository.get_job_instance(ref.job, params)
        label = f"{ref.job}({', '.join(ref.params)})"
        if instance is None:
            report.add(1, f"{label}: never launched")
            continue
        executions = repository.get_job_executions(instance)  # newest first
        ids = [e.id for e in executions]
        totals["job_executions"] += len(ids)
        with engine.connect() as conn:
            part_rows = _of_executions(conn, partitions, ids)
            coord_rows = _of_executions(conn, job_coordination, ids)
            run_rows = _of_executions(conn, runs, ids, since)
            effect_rows = _of_executions(conn, ledger, ids, since)
            commit_rows = _of_executions(conn, commits, ids, since)
            master_rows = _of_executions(conn, master_effects, ids, since)
        totals["partitions"] += len({r.partition_name for r in part_rows})
        totals["runs"] += len(run_rows)
        totals["effects"] += len(effect_rows)

        # 1. nothing stuck, nothing lost
        for e in executions:
            if e.status.is_running or e.status is BatchStatus.UNKNOWN:
                report.add(1, f"{label}: execution {e.id} stuck {e.status.value}")
        for p in part_rows:
            if p.status in PARTITION_IN_FLIGHT:
                report.add(
                    1,
                    f"{label}: partition {p.partition_name} ({p.step_execution_id}) "
                    f"left {p.status} on {p.assigned_node}",
                )
        for c in coord_rows:
            if c.status in COORD_IN_FLIGHT:
                report.add(
                    1,
                    f"{label}: coordination of execution {c.job_execution_id} left "
                    f"{c.status} (master {c.master_node})",
                )
        names = {p.partition_name for p in part_rows}
        with_effect = {r.partition_name for r in effect_rows}
        completed = executions and executions[0].status is BatchStatus.COMPLETED
        if completed:
            lost = sorted(names - with_effect)
            totals["lost_partitions"] += len(lost)
            for name in lost:
                report.add(1, f"{label}: partition {name} completed with no effect recorded")
        elif expect_complete:
            report.add(
                5,
                f"{label}: did not complete (last execution "
                f"{executions[0].status.value if executions else 'none'})",
            )

        # 2. non-transferable: one effect across restarts, one node per step execution
        effects_by_name: dict[str, list[Any]] = defaultdict(list)
        for r in effect_rows:
            effects_by_name[r.partition_name].append(r)
        for name, rows in effects_by_name.items():
            if len(rows) > 1:
                if not rows[0].transferable:
                    totals["duplicate_non_transferable_effects"] += len(rows) - 1
                    report.add(
                        2,
                        f"{label}: non-transferable {name} took effect {len(rows)} "
                        f"times: {[(r.node_id, r.attempt) for r in rows]}",
                    )
                else:
                    totals["duplicate_transferable_effects"] += len(rows) - 1
        runs_by_step: dict[int, list[Any]] = defaultdict(list)
        for r in run_rows:
            runs_by_step[r.step_execution_id].append(r)
        for rows in runs_by_step.values():
            rows.sort(key=lambda r: (r.attempt, r.started))
            if len(rows) > 1:
                totals["reruns"] += len(rows) - 1
            if not rows[0].transferable and len({r.node_id for r in rows}) > 1:
                report.add(
                    2,
                    f"{label}: non-transferable {rows[0].partition_name} ran on "
                    f"{len({r.node_id for r in rows})} nodes",
                )
            # 3. a second run only under a new attempt, after the first node was removed
            for i, first in enumerate(rows):
                for later in rows[i + 1 :]:
                    if later.attempt == first.attempt:
                        report.add(
                            3,
                            f"{label}: {first.partition_name} ran twice under attempt "
                            f"{first.attempt} ({first.node_id}, {later.node_id})",
                        )
                    elif later.node_id != first.node_id and timing:
                        gone = removed.get(first.node_id)
                        last = seen.get(first.node_id)
                        started = _naive(later.started)
                        if last is None:
                            totals["unverifiable_reruns"] += 1
                        elif started is not None and started <= last:
                            report.add(
                                3,
                                f"{label}: {first.partition_name} ran on "
                                f"{later.node_id} (attempt {later.attempt}) at {started} "
                                f"while {first.node_id} was still registered ({last}, "
                                f"removed {gone})",
                            )

        # 4 (and 5 for masters): every fenced transaction committed while its writer owned
        # its row.
        totals["commits_checked"] += len(commit_rows)
        for r in commit_rows:
            if commit_in_order(r):
                continue
            invariant = 4 if r.kind == "partition" else 5
            totals["late_commits"] += 1
            what = (
                f"partition step execution {r.step_execution_id} by {r.node_id} attempt {r.token}"
                if r.kind == "partition"
                else f"master {r.node_id} epoch {r.token} of execution {r.job_execution_id}"
            )
            report.add(
                invariant,
                f"{label}: a transaction of {what} committed at {r.at} after its row moved to "
                f"({r.seen_node}, {r.seen_token}, {r.seen_status})",
            )
        if completed and ref.master_step and not master_rows:
            report.add(1, f"{label}: completed without its master-run step's effect")
        if len(master_rows) > 1:
            report.add(
                5,
                f"{label}: the master-run step took effect {len(master_rows)} times: "
                f"{[(m.job_execution_id, m.node_id, m.epoch) for m in master_rows]}",
            )

        # 5. abandoned by exactly one node, then completed on restart
        for c in coord_rows:
            if c.status != COORD_ABANDONED:
                continue
            totals["abandoned"] += 1
            e = next(x for x in executions if x.id == c.job_execution_id)
            message = e.exit_status.description or ""
            owners = {part.split()[0] for part in message.split("abandoned by node ")[1:]}
            if e.status is not BatchStatus.FAILED:
                report.add(5, f"{label}: abandoned execution {e.id} is {e.status.value}")
            if len(owners) > 1:
                report.add(5, f"{label}: execution {e.id} abandoned by {sorted(owners)}")
            if expect_complete and not completed:
                report.add(5, f"{label}: abandoned execution {e.id} never completed on restart")

        # 6. the output of a completed job is exactly the fault-free one
        if completed:
            latest: dict[str, Any] = {}
            for r in sorted(effect_rows, key=lambda r: r.id):
                latest.setdefault(r.partition_name, r)
            covered = sorted((r.lo, r.hi) for r in latest.values())
            position = 0
            for lo, hi in covered:
                if lo != position:
                    report.add(
                        6,
                        f"{label}: slices do not tile [0, {ref.items}): gap or overlap "
                        f"at {position}..{lo}",
                    )
                    break
                position = hi
            else:
                if position != ref.items:
                    report.add(6, f"{label}: slices end at {position}, not {ref.items}")
            got = sum(r.total for r in latest.values())
            if got != expected_total(ref.items):
                report.add(
                    6, f"{label}: output {got}, a fault-free run gives {expected_total(ref.items)}"
                )
            for r in latest.values():
                if r.total != sum(range(r.lo, r.hi)):
                    report.add(6, f"{label}: {r.partition_name} total {r.total} is wrong")
    report.stats.update(
        {
            "job_executions": totals["job_executions"],
            "partitions": totals["partitions"],
            "partitions_run": totals["runs"],
            "reruns": totals["reruns"],
            "effects": totals["effects"],
            "duplicate_non_transferable_effects": totals["duplicate_non_transferable_effects"],
            "duplicate_transferable_effects": totals["duplicate_transferable_effects"],
            "lost_partitions": totals["lost_partitions"],
            "stuck_jobs": sum(1 for v in report.violations[1] if "stuck" in v),
            "abandoned_executions": totals["abandoned"],
            "unverifiable_reruns": totals["unverifiable_reruns"],
            "commits_checked": totals["commits_checked"],
            "late_commits": totals["late_commits"],
            "timing_checks": timing,
        }
    )
    return report
