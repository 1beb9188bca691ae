"""A registry with recurring jobs, for the scheduler's tests and demonstrations.

``--app dbcluster.testing.scheduled:registry``: the chaos registry's jobs, a ``tick`` job that
does nothing but complete (each run is one tick: the tick's time is its identifying parameter),
a per-second schedule of it, and ``counter``, a job with a ``RunIdIncrementer``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from dbcluster.batch import (
    ChunkContext,
    Job,
    JobRegistry,
    RepeatStatus,
    RunIdIncrementer,
    Schedule,
    TaskletStep,
)
from dbcluster.testing.app import build_registry

#: The per-second schedule's name.
EVERY_SECOND = "every-second"


def _done(ctx: ChunkContext) -> RepeatStatus:
    return RepeatStatus.FINISHED


def build_scheduled_registry(
    per_second: bool = True, misfire: str = "latest", grace: float = 60.0
) -> JobRegistry:
    registry = build_registry(per_node=2)
    registry.register(Job("tick", [TaskletStep("tick.step", _done)]))
    registry.register(
        Job("counter", [TaskletStep("counter.step", _done)], incrementer=RunIdIncrementer())
    )
    if per_second:
        registry.schedule(
            Schedule(
                "tick",
                cron="* * * * * *",
                fire_time_param="tick",
                misfire=misfire,
                misfire_grace=grace,
                name=EVERY_SECOND,
            )
        )
    return registry


#: ``--app dbcluster.testing.scheduled:registry``
registry = build_scheduled_registry()


# --- the per-second scenario (the suite runs it briefly; `benchmarks/scheduler_ticks.py` for a
# minute) -------------------------------------------------------------------------------------


@dataclass
class TickReport:
    """What a run of :func:`run_ticks` saw (times on the database clock)."""

    seconds: float
    #: Ticks in the judged window, and those of them that fired (each once: the primary key).
    expected: int = 0
    fired: int = 0
    missing: list[str] = field(default_factory=list)
    #: Fire rows beyond one per tick (the primary key allows none).
    duplicates: int = 0
    #: Fire rows whose request is not the one tick's only request, or not launched once.
    stray_requests: int = 0
    launched: int = 0
    completed: int = 0
    not_completed: list[str] = field(default_factory=list)
    #: Per node prefix: ticks it fired (how the firing happened to spread: not a property).
    fired_by: dict[str, int] = field(default_factory=dict)
    #: Ticks of the window after the killed node died, and those of them that fired.
    expected_after_kill: int = 0
    fired_after_kill: int = 0
    #: Ticks of the window while the paused node was stopped, and those of them that fired.
    expected_while_paused: int = 0
    fired_while_paused: int = 0
    #: Per node taken out (killed or paused): the ticks it had fired before.
    fired_before_out: dict[str, int] = field(default_factory=dict)
    #: How late the fires were (fired_at - tick), in ms.
    lag_ms_p50: float = 0.0
    lag_ms_max: float = 0.0
    events: list[str] = field(default_factory=list)
    #: The submitted job: its status, executions of its instance, masters' reasons, and whether
    #: each partition's effect is in the ledger once.
    submitted: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            not self.missing
            and not self.duplicates
            and not self.stray_requests
            and not self.not_completed
            and self.fired == self.expected
        )


def _master_of(engine: Any, job_execution_id: int) -> str | None:
    """The node that is master of the job execution now."""
    from sqlalchemy import select

    from dbcluster.schema import job_coordination

    with engine.connect() as conn:
        return conn.execute(  # type: ignore[no-any-return]
            select(job_coordination.c.master_node).where(
                job_coordination.c.job_execution_id == job_execution_id
            )
        ).scalar_one_or_none()


def _submit_and_wait(
    engine: Any, harness: Any, workers: list[Any], job: str, params: list[str]
) -> Any:
    """Submit ``job`` and wait until its execution runs partitions; its request row."""
    from sqlalchemy import func, select

    from dbcluster.batch.parameters import JobParameters
    from dbcluster.cluster.launches import LaunchStore
    from dbcluster.cluster.store import CoordinationStore
    from dbcluster.schema import launch_requests, partitions
    from dbcluster.testing.harness import wait_until

    request_id = LaunchStore(CoordinationStore(engine)).submit(job, JobParameters.parse(params))

    def launched() -> Any:
        with engine.connect() as conn:
            row = conn.execute(
                select(launch_requests).where(launch_requests.c.request_id == request_id)
            ).first()
            if row is None or row.status != "LAUNCHED":
                return None
            running = conn.execute(
                select(func.count()).where(
                    partitions.c.job_execution_id == row.job_execution_id,
                    partitions.c.status == "CLAIMED",
                )
            ).scalar_one()
            return row if running >= 2 else None

    return wait_until(launched, 30, f"submitted job {job} to run its partitions")


def _submitted_outcome(engine: Any, request: Any, timeout: float) -> dict[str, Any]:
    from collections import Counter

    from sqlalchemy import select

    from dbcluster.schema import job_execution, job_masters, partitions
    from dbcluster.testing.app import ledger
    from dbcluster.testing.harness import wait_until

    execution_id = int(request.job_execution_id)

    def status() -> str:
        with engine.connect() as conn:
            return str(
                conn.execute(
                    select(job_execution.c.status).where(
                        job_execution.c.job_execution_id == execution_id
                    )
                ).scalar_one()
            )

    wait_until(lambda: status() not in ("STARTING", "STARTED"), timeout, "the submitted job")
    with engine.connect() as conn:
        instance = conn.execute(
            select(job_execution.c.job_instance_id).where(
                job_execution.c.job_execution_id == execution_id
            )
        ).scalar_one()
        executions = conn.execute(
            select(job_execution).where(job_execution.c.job_instance_id == instance)
        ).all()
        parts = conn.execute(
            select(partitions).where(partitions.c.job_execution_id == execution_id)
        ).all()
        effects = Counter(
            r.partition_name
            for r in conn.execute(select(ledger).where(ledger.c.job_execution_id == execution_id))
        )
        reasons = [
            r.reason
            for r in conn.execute(
                select(job_masters)
                .where(job_masters.c.job_execution_id == execution_id)
                .order_by(job_masters.c.master_epoch)
            )
        ]
    return {
        "status": status(),
        "executions": len(executions),
        "masters": reasons,
        "effects_once": len(effects) == len(parts) and set(effects.values()) == {1},
    }


def run_ticks(
    url: str,
    workdir: str | Path,
    seconds: float,
    *,
    nodes: int = 4,
    kill_at: float | None = None,
    pause_at: float | None = None,
    pause_for: float = 3.0,
    settle_s: float = 60.0,
    submit: tuple[str, list[str]] | None = None,
) -> TickReport:
    """Start ``nodes`` worker processes with ``--accept-launches`` on the per-second schedule of
    :data:`registry`, SIGKILL one at ``kill_at`` s and SIGSTOP another at ``pause_at`` s (for
    ``pause_for`` s), for ``seconds``; then wait for every fired tick's job to end and judge:
    every tick of the window fired once, and its one request ran once and completed.

    ``submit`` (a job and its parameters): also submit that job before the clock starts; the
    node that accepted it (its master) is the one killed, and the report says how it ended.

    The node paused is the one that fired the latest tick, where it is neither the killed one
    nor the submitted job's master (else another bystander): the report says whether the ticks
    kept firing, once each, while each node was out."""
    from sqlalchemy import select

    from dbcluster.dialects import get_provider, make_engine
    from dbcluster.schema import (
        job_execution,
        job_execution_params,
        launch_requests,
        schedule_fires,
    )
    from dbcluster.testing.app import ledger_metadata
    from dbcluster.testing.harness import Harness, wait_until

    engine = make_engine(url)
    provider = get_provider(engine)
    report = TickReport(seconds)
    # The harness's nodes record every commit in the test application's tables.
    ledger_metadata.create_all(engine)

    def db_now() -> datetime:
        with engine.connect() as conn:
            return conn.execute(provider.select_now()).scalar_one().replace(tzinfo=None)

    def latest_firer() -> str | None:
        with engine.connect() as conn:
            row = conn.execute(
                select(schedule_fires.c.fired_by)
                .where(schedule_fires.c.schedule_name == EVERY_SECOND)
                .order_by(schedule_fires.c.fire_time.desc())
                .limit(1)
            ).first()
        return None if row is None else str(row[0])

    #: When each node taken out went out and came back (None: killed), on the database clock.
    out: dict[str, tuple[datetime, datetime | None]] = {}

    try:
        with Harness(url, workdir, app="dbcluster.testing.scheduled:registry") as harness:
            workers = [harness.start_worker(f"s{i}", "--accept-launches") for i in range(nodes)]
            wait_until(
                lambda: all(harness.node_ids(engine, w) for w in workers), 60, "the nodes to join"
            )

            def any_fire() -> bool:
                with engine.connect() as conn:
                    return conn.execute(select(schedule_fires).limit(1)).first() is not None

            # A schedule's history starts when a node first sees it: judge from the first fire.
            wait_until(any_fire, 30, "the first tick to fire")
            victim = workers[0]
            submitted: Any = None
            if submit is not None:
                submitted = _submit_and_wait(engine, harness, workers, *submit)
                victim = next(w for w in workers if submitted.claimed_by.startswith(w.prefix + "-"))
            bystander = next(w for w in workers if w is not victim)
            began = time.monotonic()
            start = db_now()
            plan = sorted(
                [(t, what) for t, what in ((kill_at, "kill"), (pause_at, "pause")) if t is not None]
                + ([(pause_at + pause_for, "resume")] if pause_at is not None else [])
            )
            for at, what in plan:
                time.sleep(max(0.0, began + at - time.monotonic()))
                if what == "pause":
                    # The node that fired the latest tick, unless it is the killed one or the
                    # submitted job's master (paused past the thresholds, its mastership would
                    # move a second time): then a bystander.
                    master = (
                        _master_of(engine, submitted.job_execution_id) or ""
                        if submitted is not None
                        else ""
                    )
                    firer = latest_firer() or ""
                    candidates = [
                        w
                        for w in workers
                        if w is not victim and not master.startswith(w.prefix + "-")
                    ]
                    bystander = next(
                        (w for w in candidates if firer.startswith(w.prefix + "-")),
                        # two nodes: the one left is its master; pause it all the same
                        candidates[0] if candidates else bystander,
                    )
                target = victim if what == "kill" else bystander
                getattr(harness, what)(target)
                at_db = db_now()
                if what == "resume":
                    out[target.prefix] = (out[target.prefix][0], at_db)
                else:
                    out[target.prefix] = (at_db, None if what == "kill" else at_db)
                report.events.append(f"{what} {target.prefix} at {at_db.isoformat()}")
            time.sleep(max(0.0, began + seconds - time.monotonic()))
            end = db_now()
            # The window judged: whole seconds after the start, up to a second before the end
            # (the last tick may be firing as we look).
            first = start.replace(microsecond=0) + timedelta(seconds=1)
            last = end.replace(microsecond=0) - timedelta(seconds=1)
            expected = {
                first + timedelta(seconds=i) for i in range(int((last - first).total_seconds()) + 1)
            }

            def fires() -> list[Any]:
                with engine.connect() as conn:
                    return conn.execute(
                        select(schedule_fires).where(
                            schedule_fires.c.schedule_name == EVERY_SECOND,
                            schedule_fires.c.fire_time >= first,
                            schedule_fires.c.fire_time <= last,
                        )
                    ).all()

            def requests() -> dict[int, Any]:
                with engine.connect() as conn:
                    return {r.request_id: r for r in conn.execute(select(launch_requests)).all()}

            def ended() -> bool:
                reqs = requests()
                wanted = [reqs.get(f.request_id) for f in fires()]
                if not all(r is not None and r.status in ("LAUNCHED", "FAILED") for r in wanted):
                    return False
                ids = [r.job_execution_id for r in wanted if r.job_execution_id is not None]
                with engine.connect() as conn:
                    statuses = conn.execute(
                        select(job_execution.c.status).where(
                            job_execution.c.job_execution_id.in_(ids)
                        )
                    ).all()
                return all(s[0] not in ("STARTING", "STARTED", "STOPPING") for s in statuses)

            try:
                wait_until(ended, settle_s, "every fired tick's job to end", interval=0.5)
                if submitted is not None:
                    report.submitted = _submitted_outcome(engine, submitted, settle_s)
            except TimeoutError as late:
                report.events.append(str(late))
            rows = fires()
            reqs = requests()
            with engine.connect() as conn:
                executions = {
                    r.job_execution_id: r for r in conn.execute(select(job_execution)).all()
                }
                tick_params = {
                    r.job_execution_id: r.parameter_value
                    for r in conn.execute(
                        select(job_execution_params).where(
                            job_execution_params.c.parameter_name == "tick"
                        )
                    )
                }
    finally:
        engine.dispose()
    fired = {r.fire_time.replace(tzinfo=None) for r in rows}
    report.expected = len(expected)
    report.fired = len(fired & expected)
    report.missing = sorted(t.isoformat() for t in expected - fired)
    report.duplicates = len(rows) - len(fired)
    lags = sorted(
        (r.fired_at.replace(tzinfo=None) - r.fire_time.replace(tzinfo=None)).total_seconds() * 1000
        for r in rows
    )
    if lags:
        report.lag_ms_p50 = round(lags[len(lags) // 2], 1)
        report.lag_ms_max = round(lags[-1], 1)
    for prefix, (went, back) in out.items():
        report.fired_before_out[prefix] = sum(
            1
            for r in rows
            if str(r.fired_by).startswith(prefix + "-") and r.fire_time.replace(tzinfo=None) < went
        )
        absent = {t for t in expected if t > went and (back is None or t < back)}
        if back is None:
            report.expected_after_kill = len(absent)
            report.fired_after_kill = len(absent & fired)
        else:
            report.expected_while_paused = len(absent)
            report.fired_while_paused = len(absent & fired)
    seen_requests: set[int] = set()
    for r in rows:
        prefix = str(r.fired_by).rsplit("-", 1)[0]
        report.fired_by[prefix] = report.fired_by.get(prefix, 0) + 1
        req = reqs.get(r.request_id)
        if req is None or r.request_id in seen_requests or req.status != "LAUNCHED":
            report.stray_requests += 1
            continue
        seen_requests.add(r.request_id)
        report.launched += 1
        execution = executions.get(req.job_execution_id)
        tick_text = tick_params.get(req.job_execution_id)
        if (
            execution is None
            or execution.status != "COMPLETED"
            or tick_text is None
            or datetime.fromisoformat(tick_text) != r.fire_time.replace(tzinfo=None)
        ):
            report.not_completed.append(r.fire_time.isoformat())
        else:
            report.completed += 1
    # Every tick request of the window is a fire's (none launched twice, none made elsewhere).
    report.stray_requests += sum(
        1
        for req in reqs.values()
        if req.job_name == "tick"
        and req.request_id not in seen_requests
        and any(tick_params.get(req.job_execution_id) == t.isoformat() for t in expected)
    )
    return report


#: The same jobs without the schedule: ``--app dbcluster.testing.scheduled:unscheduled``.
unscheduled = build_scheduled_registry(per_second=False)
