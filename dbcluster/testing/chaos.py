"""``dbcluster chaos``: a randomized fault run over real node processes, judged from data.

It starts ``--nodes`` worker processes, launches ``--jobs`` ledger jobs (each from its own
``dbcluster launch`` process, the job's master), injects ``--faults`` faults at times drawn from
``--seed`` (the same seed gives the same plan), restarts failed and abandoned jobs, waits for the
cluster to settle, checks every invariant of :mod:`dbcluster.testing.invariants` and prints a
summary. The exit status is 0 only when every invariant held.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dbcluster.testing.chaos_leader import LeaderWatch, holder_process, lease_holder
from dbcluster.testing.chaos_plan import (
    ALL_KINDS,
    DB_FAULT_SPACING_S,
    JOB_NAMES,
    KINDS,
    LEADER_KINDS,
    MASTER_KINDS,
    PARK_WAIT_S,
    POINTS,
    STEPPED_JOBS,
    TARGETS,
    WORKER_KINDS,
    Fault,
    launch_times,
    plan_faults,
)
from dbcluster.testing.chaos_report import (
    KillRecord,
    _db_now,
    _execution_statuses,
    _held_transferable,
    _recovery,
    _takeovers,
    format_summary,
    held_transferable_statement,
)
from dbcluster.testing.dbfaults import (
    COMMAND_TIMEOUT_S,
    DB_KINDS,
    DbControl,
    DbFaultRunner,
    first_execution_check,
    scan_logs,
)

#: The plan and the report live in chaos_plan and chaos_report; their names stay importable here.
__all__ = [
    "ALL_KINDS",
    "KINDS",
    "LEADER_KINDS",
    "MASTER_KINDS",
    "TARGETS",
    "WORKER_KINDS",
    "Fault",
    "format_summary",
    "held_transferable_statement",
    "plan_faults",
    "run_chaos",
]


def _transient(engine: Any, error: BaseException) -> bool:
    """Whether ``error`` is the database going away or coming back (a restart, a switchover, a
    Galera node outside the primary component): the run's own reads wait it out. Wider than the
    provider's judgement on purpose: these reads are harmless to repeat, and a run must not end
    on an error the provider does not (yet) call transient (Galera's 1047, "WSREP has not yet
    prepared node for application use", issue 34)."""
    from sqlalchemy.exc import OperationalError

    from dbcluster.dialects import get_provider

    provider = get_provider(engine)
    return (
        isinstance(error, OperationalError)
        or provider.is_transient(error)
        or provider.is_read_only(error)
    )


def _patiently(engine: Any, read: Any, timeout: float = 120.0) -> Any:
    """``read()``, repeated while the database is unavailable (up to ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except Exception as exc:
            if not _transient(engine, exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def run_chaos(
    url: str | Sequence[str],
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
    kinds: Sequence[str] | None = None,
    db_control: DbControl | None = None,
) -> dict[str, Any]:
    """Run the chaos scenario on ``url`` (a scratch database) and return the summary.

    ``target`` chooses which processes the faults fall on (see :func:`plan_faults`). ``url`` may
    be several URLs of one cluster's servers (Galera nodes): worker ``i`` and the launcher of job
    ``j`` connect to URL ``i``/``j`` modulo their number; the run's own reads use the first.
    ``kinds`` chooses the fault kinds (default: the node kinds, and each database kind whose
    command ``db_control`` gives)."""
    from dbcluster import schema
    from dbcluster.batch.parameters import JobParameters
    from dbcluster.batch.repository import JobRepository
    from dbcluster.dialects import make_engine, safe_url
    from dbcluster.testing.app import ledger_metadata
    from dbcluster.testing.harness import Harness, MembershipObserver, NodeProcess, wait_until
    from dbcluster.testing.invariants import JobRef, check_invariants
    from dbcluster.testing.rowmark import mark_rows

    say = log or (lambda message: None)
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("chaos needs a database URL")
    url = urls[0]
    control = db_control or DbControl()
    if kinds is None:
        kinds = KINDS + control.available()
    missing = control.missing(kinds)
    if missing:
        raise ValueError("; ".join(missing))
    began = time.monotonic()
    engine = make_engine(url)
    schema.metadata.create_all(engine)
    ledger_metadata.create_all(engine)
    since = mark_rows(engine)  # rows of earlier runs in this database are not judged
    workdir = Path(workdir or tempfile.mkdtemp(prefix="dbcluster-chaos-"))
    harness = Harness(url, workdir, env=env, node_urls=urls)
    cleanup_ms = harness.ms("cleanup_threshold")

    def planned(seconds: float) -> list[Fault]:
        return plan_faults(
            seed,
            faults,
            nodes,
            jobs,
            window=seconds,
            cleanup_ms=cleanup_ms,
            unreachable_ms=harness.ms("unreachable_threshold"),
            on=target,
            kinds=kinds,
            db_nodes=len(urls),
        )

    if window is None:
        window = max(8.0, faults * 1.2)
        # Room for the database's faults: one every DB_FAULT_SPACING_S at most.
        db_faults = sum(f.kind in DB_KINDS for f in planned(window))
        window = max(window, DB_FAULT_SPACING_S * db_faults)
    plan = planned(window)
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
    ended_launches: set[int] = set()  # pids of launch processes whose exit status is counted
    done = [False] * jobs
    restarts = 0
    relaunches = 0  # launch processes started again before their job had an execution
    relaunched = [0] * jobs  # the same, per job
    launch_exits: list[int | None] = []  # exit status of every launch process that ended
    restart_causes: list[dict[str, Any]] = []  # why each relaunched job's last execution ended
    injected: list[dict[str, Any]] = []
    kills: list[KillRecord] = []
    timers: list[tuple[float, str, NodeProcess]] = []  # (monotonic time, action, process)
    parks: list[tuple[float, str, Fault, NodeProcess, dict[str, Any]]] = []
    respawn: dict[str, float] = {}
    summary: dict[str, Any] = {}
    t0 = time.monotonic()
    runner = DbFaultRunner(control, lambda: time.monotonic() - t0, say)
    outage_warned = [False]
    leaders = LeaderWatch()
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
            if fault.kind in LEADER_KINDS:
                p = holder_process(lease_holder(engine), [*workers.values(), *launchers.values()])
                return None if p is None or busy(p) else p
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
                if p is not None and p.pid not in ended_launches:
                    ended_launches.add(p.pid)
                    launch_exits.append(p.popen.returncode)
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
                    relaunched[j] += 1
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
            record: dict[str, Any] = {**asdict(fault), "index": index}
            if fault.kind in DB_KINDS:
                node = int(fault.target[2:]) if fault.target[2:] else None
                record.update(applied_to=fault.target, role="database", prefix=None)
                record["at_actual"] = round(now - t0, 3)
                injected.append(record)
                runner.submit(record, fault.kind, fault.duration, node)
                say(f"fault {index} {fault.kind} -> {fault.target}")
                return
            p = _patiently(engine, lambda: pick(fault))
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
                record["db_time"] = _patiently(engine, lambda: _db_now(engine)).isoformat()
            kind = LEADER_KINDS.get(fault.kind, fault.kind)
            if fault.kind in LEADER_KINDS:
                leaders.fault(record, _patiently(engine, lambda: lease_holder(engine)) or "")
            if kind == "kill":
                held = _patiently(engine, lambda: _held_transferable(engine, p.prefix))
                harness.kill(p)
                killed_at = _patiently(engine, lambda: _db_now(engine))
                kills.append(KillRecord(index, p.slot, p.prefix, killed_at, held))
            elif kind == "stop":
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
                    record["db_time"] = _patiently(engine, lambda: _db_now(engine)).isoformat()
                injected.append(record)
                timers.append((now + fault.duration, f"unpark:{point}", p))
                say(f"fault {record['index']} {fault.kind}: {p.slot} stopped at {point} {held}")

        index = 0
        deadline: float | None = None
        while True:
            now = time.monotonic()
            while queue and now - t0 >= queue[0].at:
                fault = queue.pop(0)
                if fault.kind in LEADER_KINDS and not _patiently(engine, lambda f=fault: pick(f)):
                    if leaders.defer(fault, now - t0, queue):
                        continue  # the holder is down already: the next holder, a moment later
                inject(index, fault, now)
                index += 1
            settle_parks(now)
            leaders.poll(engine)
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
            try:
                supervise_jobs(now)
            except Exception as exc:
                if not _transient(engine, exc):
                    raise
                if not outage_warned[0]:  # the database is away (a fault of its own): next tick
                    say(f"the database is unavailable; waiting ({type(exc).__name__})")
                    outage_warned[0] = True
            else:
                outage_warned[0] = False
            if not queue and not timers and not parks and not runner.busy():
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
        runner.close()  # nothing is queued by now; a rejoin in progress ends first
        # Quiescence: let the workers' last writes land, then stop them gracefully.
        for p in workers.values():
            harness.terminate(p)
        for p in workers.values():
            try:
                p.popen.wait(timeout=30)
            except Exception:  # noqa: BLE001 - killed by close()
                pass
        observer.stop()
        report = _patiently(
            engine,
            lambda: check_invariants(
                engine,
                refs,
                removed_at={k: v.first_absent for k, v in observer.nodes.items()},
                last_seen={k: v.last_seen for k, v in observer.nodes.items()},
                since=since,
            ),
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
        db_applied = [r for r in applied if r["kind"] in DB_KINDS]
        node_applied = [r for r in applied if r["kind"] not in DB_KINDS]
        outcomes = {
            f"job {j} ({refs[j].job})": {
                "executions": _execution_statuses(repository, refs[j]),
                "relaunches": relaunched[j],
            }
            for j in range(jobs)
        }
        logs = scan_logs(sorted(Path(workdir).glob("*.log")))
        logs["outages"] = len(db_applied)
        if db_applied:
            logs["errors_per_outage"] = round(logs["errors"] / len(db_applied), 1)
            logs["tracebacks_per_outage"] = round(logs["tracebacks"] / len(db_applied), 1)
        # Enforced where the database's faults are the only ones: a restart must cost nothing.
        enforced = bool(db_applied) and not node_applied
        extra: dict[str, dict[str, Any]] = {
            "first_execution": {
                "statement": "every job COMPLETED in its first execution, launched once",
                "violations": first_execution_check(outcomes),
            },
            "quiet_logs": {
                "statement": "no ERROR line and no traceback in the node logs",
                "violations": [
                    f"{name}: {c['errors']} ERROR line(s), {c['tracebacks']} traceback(s)"
                    for name, c in logs["per_file"].items()
                    if c["errors"] or c["tracebacks"]
                ],
            },
        }
        for inv in extra.values():
            inv["held"] = not inv["violations"]
            inv["enforced"] = enforced
        db_commands_failed = [r["index"] for r in db_applied if not r.get("ok")]
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
            "leader_faults": leaders.summary(
                (harness.ms("unreachable_threshold") + harness.ms("sweep_interval")) / 1000
            ),
            "takeover_floor_s": (cleanup_ms + harness.ms("stranded_master_scan_interval")) / 1000,
            "settle_s": round(settled_at - t0, 1),
            "elapsed_s": round(time.monotonic() - began, 1),
            "plan": [asdict(f) for f in plan],
            "faults": injected,
            "workdir": str(workdir),
            "urls": [safe_url(u) for u in urls],
            "launch_exit_codes": dict(Counter(str(c) for c in launch_exits)),
            "executions_by_job": {k: v["executions"] for k, v in outcomes.items()},
            "db_faults": db_applied,
            "db_fault_commands_failed": db_commands_failed,
            "logs": logs,
            **report.as_dict(),
        }
        summary["invariants"].update(extra)
        summary["ok"] = (
            report.ok
            and not db_commands_failed
            and all(inv["held"] or not inv["enforced"] for inv in extra.values())
        )
        return summary
    finally:
        runner.close(timeout=COMMAND_TIMEOUT_S)
        if observer._thread.is_alive():
            observer.stop()
        harness.close()
        engine.dispose()
