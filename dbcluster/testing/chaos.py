"""``dbcluster chaos``: a randomized fault run over real node processes, judged from data.

It starts ``--nodes`` worker processes, launches ``--jobs`` ledger jobs (each from its own
``dbcluster launch`` process, the job's master), injects ``--faults`` faults at times drawn from
``--seed`` (the same seed gives the same plan), restarts failed and abandoned jobs, waits for the
cluster to settle, checks every invariant of :mod:`dbcluster.testing.invariants` and prints a
summary. The exit status is 0 only when every invariant held.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # the CLI imports this module: the test application loads only when run
    from dbcluster.testing.rowmark import RowMark

#: Fault kinds. ``freeze-tx``: a worker parked inside a chunk transaction (its partition row
#: verifiably locked), then SIGSTOPped past the cleanup threshold. ``stop-between``: a master
#: parked between two steps of its job, then SIGSTOPped past the cleanup threshold. ``blip``: only
#: a master's connection cut, for less than the unreachable threshold.
KINDS = ("kill", "stop", "term", "cut", "freeze-tx", "stop-between", "blip")
#: Kinds that hit a job's master only.
MASTER_KINDS = ("stop-between", "blip")
#: Kinds that only make sense on a worker (a master's partitions run on the workers).
WORKER_KINDS = ("term", "freeze-tx")
#: ``--target``: which processes the faults fall on (``any``: workers and masters, mixed).
TARGETS = ("any", "masters", "workers")
JOB_NAMES = ("ledger-steps", "ledger-mixed", "ledger-fixed", "ledger")
#: Jobs whose master runs a step after the partitioned one (``stop-between`` needs one).
STEPPED_JOBS = ("ledger-steps",)


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``at`` seconds after the first job launch, on slot ``target`` (``w<i>``
    a worker, ``m<j>`` the master of job ``j``), lasting ``duration`` s (stop and cut)."""

    at: float
    kind: str
    target: str
    duration: float = 0.0


#: The fault point each parking kind arms.
POINTS = {"freeze-tx": "chunk.before_commit", "stop-between": "master.between_steps"}
#: Seconds the harness waits for an armed fault point to be reached (a master reaches the end of
#: its partitioned step only once every partition has run).
PARK_WAIT_S = {"chunk.before_commit": 8.0, "master.between_steps": 25.0}


def launch_times(jobs: int, window: float) -> list[float]:
    return [round(j * window / max(1, jobs), 3) for j in range(jobs)]


def plan_faults(
    seed: int,
    faults: int,
    nodes: int,
    jobs: int,
    *,
    window: float,
    cleanup_ms: int,
    unreachable_ms: int,
    on: str = "any",
) -> list[Fault]:
    """The fault plan: a pure function of its arguments. Every kind appears once before any
    repeats (when ``faults`` >= the number of kinds); about a quarter of kills and stops hit a
    job's master. ``on="masters"`` puts every fault on a master (the kinds a master can
    take), ``"workers"`` every fault on a worker."""
    if on not in TARGETS:
        raise ValueError(f"faults fall on one of {', '.join(TARGETS)}, not {on!r}")
    pool = {
        "any": KINDS,
        "masters": tuple(k for k in KINDS if k not in WORKER_KINDS),
        "workers": tuple(k for k in KINDS if k not in MASTER_KINDS),
    }[on]
    rng = random.Random(seed)
    kinds = list(pool)
    rng.shuffle(kinds)
    while len(kinds) < faults:
        kinds.append(rng.choice(pool))
    kinds = kinds[:faults]
    starts = launch_times(jobs, window)
    stepped = [j for j in range(jobs) if JOB_NAMES[j % len(JOB_NAMES)] in STEPPED_JOBS]
    master_hit = False
    plan: list[Fault] = []
    for kind in kinds:
        to_master = kind in MASTER_KINDS or (
            kind in ("kill", "stop", "cut")
            and (rng.random() < 0.25 or (kind == "kill" and not master_hit))
        )
        if on != "any":
            to_master = on == "masters"
        if kind == "stop-between" and not stepped:
            kind = "stop"
            to_master = on == "masters"
        if to_master and jobs > 0:
            master_hit = master_hit or kind == "kill"
            j = rng.choice(stepped) if kind == "stop-between" else rng.randrange(jobs)
            # A master is parked between steps once its partitioned step is over.
            lead = (0.5, 1.5) if kind == "stop-between" else (1.5, 3.0)
            target, at = f"m{j}", starts[j] + rng.uniform(*lead)
        else:
            target, at = f"w{rng.randrange(nodes)}", rng.uniform(1.0, window)
        duration = 0.0
        if kind in ("stop", "freeze-tx", "stop-between"):
            duration = cleanup_ms / 1000 * rng.uniform(1.3, 1.8)
        elif kind == "blip":
            duration = unreachable_ms / 1000 * rng.uniform(0.2, 0.6)
        elif kind == "cut":
            if rng.random() < 0.4:  # a blip shorter than the unreachable threshold
                duration = unreachable_ms / 1000 * rng.uniform(0.2, 0.6)
            else:
                duration = cleanup_ms / 1000 * rng.uniform(1.3, 1.8)
        plan.append(Fault(round(at, 3), kind, target, round(duration, 3)))
    plan.sort(key=lambda f: f.at)
    return plan


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


def run_chaos(
    url: str,
    *,
    nodes: int = 4,
    jobs: int = 5,
    faults: int = 20,
    seed: int = 7,
    window: float | None = None,
    delay_ms: int = 3000,
    tick_ms: int = 500,
    settle_timeout: float = 240.0,
    workdir: str | Path | None = None,
    env: dict[str, str] | None = None,
    log: Any = None,
    target: str = "any",
) -> dict[str, Any]:
    """Run the chaos scenario on ``url`` (a scratch database) and return the summary.

    ``target`` chooses which processes the faults fall on (see :func:`plan_faults`)."""
    from dbcluster import schema
    from dbcluster.batch.parameters import JobParameters
    from dbcluster.batch.repository import JobRepository
    from dbcluster.dialects import make_engine, safe_url
    from dbcluster.testing.app import ledger_metadata
    from dbcluster.testing.harness import Harness, MembershipObserver, NodeProcess, wait_until
    from dbcluster.testing.invariants import JobRef, check_invariants
    from dbcluster.testing.rowmark import mark_rows

    say = log or (lambda message: None)
    began = time.monotonic()
    engine = make_engine(url)
    schema.metadata.create_all(engine)
    ledger_metadata.create_all(engine)
    since = mark_rows(engine)  # rows of earlier runs in this database are not judged
    workdir = Path(workdir or tempfile.mkdtemp(prefix="dbcluster-chaos-"))
    harness = Harness(url, workdir, env=env)
    cleanup_ms = harness.ms("cleanup_threshold")
    window = window if window is not None else max(8.0, faults * 1.2)
    plan = plan_faults(
        seed,
        faults,
        nodes,
        jobs,
        window=window,
        cleanup_ms=cleanup_ms,
        unreachable_ms=harness.ms("unreachable_threshold"),
        on=target,
    )
    run_id = f"{seed}-{uuid.uuid4().hex[:8]}"
    refs: list[JobRef] = []
    for j in range(jobs):
        params = [f"chaos={run_id}", f"n(int)={j}", f"delay_ms(int)={delay_ms}"]
        params.append(f"tick_ms(int)={tick_ms}")
        name = JOB_NAMES[j % len(JOB_NAMES)]
        refs.append(JobRef(name, params, master_step=name in STEPPED_JOBS))
    starts = launch_times(jobs, window)
    repository = JobRepository(engine)
    observer = MembershipObserver(engine).start()
    workers: dict[str, NodeProcess] = {}
    launchers: dict[int, NodeProcess] = {}
    launched = [False] * jobs
    done = [False] * jobs
    restarts = 0
    relaunches = 0  # launch processes started again before their job had an execution
    restart_causes: list[dict[str, Any]] = []  # why each relaunched job's last execution ended
    injected: list[dict[str, Any]] = []
    kills: list[KillRecord] = []
    timers: list[tuple[float, str, NodeProcess]] = []  # (monotonic time, action, process)
    parks: list[tuple[float, str, Fault, NodeProcess, dict[str, Any]]] = []
    respawn: dict[str, float] = {}
    summary: dict[str, Any] = {}
    try:
        for i in range(nodes):
            workers[f"w{i}"] = harness.start_worker(f"w{i}")
        wait_until(
            lambda: sum(len(harness.node_ids(engine, p)) > 0 for p in workers.values()) == nodes,
            60,
            f"{nodes} workers to join",
        )
        say(f"{nodes} workers joined; plan: {len(plan)} fault(s) over {window:.0f} s")
        t0 = time.monotonic()
        queue = list(plan)

        def busy(p: NodeProcess) -> bool:
            return not p.alive() or p.stopped or p.cut

        def pick(fault: Fault) -> NodeProcess | None:
            slots = [f"w{i}" for i in range(nodes)] + [f"m{j}" for j in range(jobs)]
            if fault.kind in WORKER_KINDS or target == "workers":
                slots = slots[:nodes]
            elif fault.kind in MASTER_KINDS or target == "masters":
                # A master's fault falls on another job's master when the planned one is gone.
                slots = [f"m{j}" for j in range(jobs)]
                if fault.kind == "stop-between":
                    slots = [f"m{j}" for j in range(jobs) if refs[j].master_step]
            start = slots.index(fault.target) if fault.target in slots else 0
            for slot in slots[start:] + slots[:start]:
                p = workers.get(slot) if slot[0] == "w" else launchers.get(int(slot[1:]))
                if p is not None and not busy(p):
                    return p
            return None

        def last_execution(j: int) -> Any:
            return repository.get_last_job_execution(
                refs[j].job, JobParameters.parse(refs[j].params)
            )

        def job_state(j: int) -> str:
            e = last_execution(j)
            if e is None:
                return "none"
            if e.status.value == "COMPLETED":
                return "completed"
            return "running" if e.status.is_running else "failed"

        def supervise_jobs(now: float) -> None:
            nonlocal restarts, relaunches
            for j in range(jobs):
                if done[j] or now - t0 < starts[j]:
                    continue
                p = launchers.get(j)
                if p is not None and p.alive():
                    continue
                state = job_state(j)
                if state == "completed":
                    done[j] = True
                    continue
                if state == "running":
                    continue  # its master is gone: a survivor takes it over (or abandons it)
                if launched[j] and state == "none":
                    # Its launch process ended (a fault as it connected) before the execution
                    # existed: launching it again restarts nothing.
                    relaunches += 1
                elif launched[j]:
                    restarts += 1
                    ended = last_execution(j)
                    restart_causes.append(
                        {
                            "job": j,
                            "job_execution_id": ended.id,
                            "status": ended.status.value,
                            "exit_code": ended.exit_status.code,
                            "exit_description": (ended.exit_status.description or "")[:300],
                        }
                    )
                launched[j] = True
                launchers[j] = harness.start_launcher(
                    f"m{j}", refs[j].job, dict(item.split("=", 1) for item in refs[j].params)
                )

        def supervise_workers(now: float) -> None:
            for slot, p in list(workers.items()):
                if p.alive():
                    continue
                due = respawn.setdefault(slot, now + 0.5)
                if now >= due:
                    respawn.pop(slot)
                    workers[slot] = harness.start_worker(slot)

        def inject(index: int, fault: Fault, now: float) -> None:
            p = pick(fault)
            record: dict[str, Any] = {**asdict(fault), "index": index}
            if p is None:
                record["skipped"] = "no eligible process"
                injected.append(record)
                say(f"fault {index} {fault.kind}: skipped (no eligible process)")
                return
            record.update(
                applied_to=p.slot,
                role="master" if p.role == "launch" else "worker",
                prefix=p.prefix,
                pid=p.pid,
                at_actual=round(now - t0, 3),
            )
            if p.role == "launch":
                # When a master's fault began, on the database clock (to time its takeover).
                record["db_time"] = _db_now(engine).isoformat()
            if fault.kind == "kill":
                held = _held_transferable(engine, p.prefix)
                harness.kill(p)
                kills.append(KillRecord(index, p.slot, p.prefix, _db_now(engine), held))
            elif fault.kind == "stop":
                harness.pause(p)
                timers.append((now + fault.duration, "cont", p))
            elif fault.kind == "term":
                harness.terminate(p)
            elif fault.kind in ("cut", "blip"):
                harness.sever(p)
                timers.append((now + fault.duration, "restore", p))
            elif fault.kind in ("freeze-tx", "stop-between"):
                # Armed now; stopped once a thread parks at the point (see settle_parks).
                point = POINTS[fault.kind]
                p.arm(point)
                p.stopped = True  # no other fault picks it meanwhile
                parks.append((now + PARK_WAIT_S[point], point, fault, p, record))
                say(f"fault {index} {fault.kind} -> {p.slot}: armed {point}")
                return
            injected.append(record)
            say(f"fault {index} {fault.kind} -> {p.slot} ({p.prefix}, pid {p.pid})")

        def settle_parks(now: float) -> None:
            """Stop each process whose armed point was reached (after checking, for a chunk
            transaction, that it holds its partition's row); give up on those not reached."""
            for item in list(parks):
                give_up, point, fault, p, record = item
                held = p.parked(point) if p.alive() else None
                if held is None and now < give_up and p.alive():
                    continue
                parks.remove(item)
                if held is None:
                    p.disarm(point)
                    p.stopped = False
                    record["skipped"] = f"no thread of {p.slot} reached {point}"
                    injected.append(record)
                    say(f"fault {record['index']} {fault.kind}: skipped ({record['skipped']})")
                    continue
                if point == "chunk.before_commit":
                    held["holds_partition_row"] = harness.partition_locked(
                        engine, int(held["step_execution_id"])
                    )
                harness.pause(p)
                record["parked"] = held
                record["at_actual"] = round(now - t0, 3)
                if p.role == "launch":
                    record["db_time"] = _db_now(engine).isoformat()
                injected.append(record)
                timers.append((now + fault.duration, f"unpark:{point}", p))
                say(f"fault {record['index']} {fault.kind}: {p.slot} stopped at {point} {held}")

        index = 0
        deadline: float | None = None
        while True:
            now = time.monotonic()
            while queue and now - t0 >= queue[0].at:
                inject(index, queue.pop(0), now)
                index += 1
            settle_parks(now)
            for item in [t for t in timers if t[0] <= now]:
                timers.remove(item)
                _, action, p = item
                if action == "cont":
                    harness.resume(p)
                elif action.startswith("unpark:"):
                    # Released before it runs again: the parked thread goes on to its COMMIT.
                    p.disarm(action.removeprefix("unpark:"))
                    harness.resume(p)
                else:
                    harness.restore(p)
            supervise_workers(now)
            supervise_jobs(now)
            if not queue and not timers and not parks:
                if deadline is None:
                    deadline = now + settle_timeout
                    say("faults over; waiting for the jobs to complete")
                if all(done):
                    break
                if now >= deadline:
                    say("settle timeout: some jobs did not complete")
                    break
            time.sleep(0.05)
        settled_at = time.monotonic()
        # Quiescence: let the workers' last writes land, then stop them gracefully.
        for p in workers.values():
            harness.terminate(p)
        for p in workers.values():
            try:
                p.popen.wait(timeout=30)
            except Exception:  # noqa: BLE001 - killed by close()
                pass
        observer.stop()
        report = check_invariants(
            engine,
            refs,
            removed_at={k: v.first_absent for k, v in observer.nodes.items()},
            last_seen={k: v.last_seen for k, v in observer.nodes.items()},
            since=since,
        )
        applied = [r for r in injected if "skipped" not in r]
        recoveries = []
        floor_ms = cleanup_ms + harness.ms("orphan_check_interval")
        for kill in kills:
            recoveries.append(
                {
                    "fault": kill.fault,
                    "target": kill.target,
                    "node_prefix": kill.prefix,
                    "transferable_partitions_held": len(kill.held),
                    "recovery_s": _recovery(engine, kill, since),
                    "floor_s": floor_ms / 1000,
                }
            )
        takeovers = _takeovers(engine, refs, injected)
        summary = {
            "ok": report.ok,
            "url": safe_url(url),
            "backend": harness.provider.name,
            "seed": seed,
            "run_id": run_id,
            "nodes": nodes,
            "jobs": jobs,
            "faults_planned": faults,
            "faults_injected": len(applied),
            "faults_by_kind": dict(Counter(r["kind"] for r in applied)),
            "faults_by_role": dict(Counter(r["role"] for r in applied)),
            "faults_skipped": len(injected) - len(applied),
            "cut_method": harness.cut_method,
            "thresholds_ms": {
                k.lower().removeprefix("dbcluster_"): int(v)
                for k, v in harness.env.items()
                if v.isdigit()
            },
            "target": target,
            "job_restarts": restarts,
            "restart_causes": restart_causes,
            "relaunches_before_start": relaunches,
            "recovery_after_kill": recoveries,
            "recovery_floor_s": floor_ms / 1000,
            "takeovers": takeovers,
            "takeover_floor_s": (cleanup_ms + harness.ms("stranded_master_scan_interval")) / 1000,
            "settle_s": round(settled_at - t0, 1),
            "elapsed_s": round(time.monotonic() - began, 1),
            "plan": [asdict(f) for f in plan],
            "faults": injected,
            "workdir": str(workdir),
            **report.as_dict(),
        }
        summary["ok"] = report.ok
        return summary
    finally:
        if observer._thread.is_alive():
            observer.stop()
        harness.close()
        engine.dispose()


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"chaos on {s['backend']} ({s['url']}), seed {s['seed']}: "
        f"{s['nodes']} nodes, {s['jobs']} jobs, {s['faults_injected']}/{s['faults_planned']} "
        f"faults injected in {s['elapsed_s']} s",
        "faults by kind: "
        + ", ".join(f"{k} {s['faults_by_kind'].get(k, 0)}" for k in KINDS)
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
    for r in s["recovery_after_kill"]:
        got = "n/a" if r["recovery_s"] is None else f"{r['recovery_s']:.2f} s"
        lines.append(
            f"  kill #{r['fault']} {r['target']}: {r['transferable_partitions_held']} transferable "
            f"partition(s) held, running elsewhere after {got} "
            f"(floor cleanup+orphan check = {r['floor_s']:.2f} s)"
        )
    for key, inv in s["invariants"].items():
        mark = "held" if inv["held"] else "VIOLATED"
        lines.append(f"invariant {key} {mark}: {inv['statement']}")
        for v in inv["violations"][:10]:
            lines.append(f"    {v}")
    lines.append("OK: every invariant held" if s["ok"] else "FAILED: an invariant was violated")
    return "\n".join(lines)


@click.command("chaos")
@click.option("--url", envvar="DBCLUSTER_URL", required=True, help="A scratch database URL.")
@click.option("--nodes", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--jobs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--faults", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--window", type=float, help="Seconds over which faults fall (default: auto).")
@click.option("--delay-ms", type=int, default=3000, show_default=True, help="Partition run time.")
@click.option("--settle-timeout", type=float, default=240, show_default=True)
@click.option("--workdir", type=click.Path(file_okay=False), help="Node logs go here.")
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default="any",
    show_default=True,
    help="Which processes the faults fall on: masters only, workers only, or both.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Partitions each node runs at once (few slots and short partitions: slots hand "
    "themselves on, partition after partition).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def chaos(
    url: str,
    nodes: int,
    jobs: int,
    faults: int,
    seed: int,
    window: float | None,
    delay_ms: int,
    settle_timeout: float,
    workdir: str | None,
    target: str,
    concurrency: int,
    as_json: bool,
) -> None:
    """Run nodes on URL, inject seeded faults, check every invariant (exit 0 only if all held).

    URL must be a scratch database: the dbcluster and test tables are created in it."""
    import sys

    def say(message: str) -> None:
        click.echo(f"chaos: {message}", err=True)

    summary = run_chaos(
        url,
        nodes=nodes,
        jobs=jobs,
        faults=faults,
        seed=seed,
        window=window,
        delay_ms=delay_ms,
        settle_timeout=settle_timeout,
        workdir=workdir,
        log=say,
        target=target,
        env={"DBCLUSTER_CONCURRENCY_LIMIT": str(concurrency)},
    )
    click.echo(json.dumps(summary, default=str, indent=2) if as_json else format_summary(summary))
    sys.exit(0 if summary["ok"] else 1)
