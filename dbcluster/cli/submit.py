"""``dbcluster submit`` and ``dbcluster schedules``: launch requests and recurring jobs from the
command line."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from functools import partial
from typing import Any

import click

from dbcluster.cli.engines import Tables, open_engine, ride_out
from dbcluster.cli.options import (
    APP_HELP,
    DURATION_S,
    EXIT_FAILED,
    EXIT_OK,
    URL_HELP,
    connect_timeout_option,
)
from dbcluster.states import LAUNCH_FAILED, LAUNCH_LAUNCHED, LAUNCH_PENDING

#: How long ``submit --wait`` waits for a node to claim the request before it says that none has.
UNCLAIMED_HINT_S = 30.0


def _json(value: Any) -> None:
    from dbcluster.masking import masked
    from dbcluster.monitor import jsonable

    click.echo(json.dumps(masked(jsonable(value)), indent=2))


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--url", envvar="DBCLUSTER_URL", required=True, help=URL_HELP)
@connect_timeout_option()
@click.option(
    "--app",
    envvar="DBCLUSTER_APP",
    help=APP_HELP + " Required: JOB and PARAMS are checked against it.",
)
@click.argument("job")
@click.argument("params", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--next",
    "next_run",
    is_flag=True,
    help="Run the job's next run: the accepting node applies the job's incrementer to its last "
    "run's parameters (PARAMS on top), as launch --next does.",
)
@click.option("--wait", is_flag=True, help="Wait for the job to end; exit 0 when it COMPLETED.")
@click.option(
    "--timeout",
    type=DURATION_S,
    default="1h",
    show_default=True,
    help="With --wait: stop waiting after this long (30m, 6h; a bare number is seconds) and "
    "exit 1; the job goes on.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def submit(
    url: str,
    app: str | None,
    job: str,
    params: tuple[str, ...],
    next_run: bool,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Ask the cluster to run JOB: write a launch request that a node started with
    `dbcluster worker --accept-launches` claims and runs as the job's master. Prints the
    request's id.

    PARAMS look like launch's: run.date(date)=2026-11-30 or -attempt(int)=2. The job and its
    parameters are checked here, against the application's registry (--app, as the workers
    have it), the way Cluster.submit checks them: an unknown job exits 2 naming the known ones
    (a node claims only requests for jobs it knows, so a request for another would wait for
    ever). --wait follows the job to its end: exit 0 when it COMPLETED, 1 when it or its
    launch did not, or when --timeout passed first.
    """
    from dbcluster.batch import JobParameters, load_registry
    from dbcluster.cluster.launches import LaunchStore
    from dbcluster.cluster.store import CoordinationStore

    if not app:
        raise click.UsageError(
            "submit checks JOB against the application's jobs: give --app module:attribute "
            "(or set DBCLUSTER_APP), the registry your workers run"
        )
    parameters = JobParameters.parse(params)
    job_def = load_registry(app).get_job(job)
    if not next_run:
        job_def.validate_parameters(parameters)
    elif job_def.incrementer is None:
        raise click.UsageError(
            f"job {job!r} has no incrementer, so it has no next run; submit it without "
            f"--next, or give it Job(..., incrementer=RunIdIncrementer())"
        )
    engine = open_engine(url, Tables.PRESENT)
    try:
        launches = LaunchStore(CoordinationStore(engine))
        request_id = launches.submit(job, parameters, next_run=next_run)
        if not wait:
            if as_json:
                _json({"request_id": request_id})
            else:
                click.echo(request_id)
            return
        click.echo(f"launch request {request_id} submitted; waiting", err=True)
        sys.exit(_wait(launches, engine, request_id, job, timeout, as_json))
    finally:
        engine.dispose()


def _wait(
    launches: Any, engine: Any, request_id: int, job: str, timeout: float, as_json: bool
) -> int:
    from dbcluster.batch import JobRepository
    from dbcluster.masking import mask_secrets
    from dbcluster.views import fmt_age

    began = time.monotonic()
    hinted = False
    repository = JobRepository(engine)
    while True:
        # Each look waits an outage out on its own (the job goes on through it).
        row = ride_out(engine, lambda: launches.request(request_id), "wait", fresh=True)
        if row is not None and row.status == LAUNCH_FAILED:
            if as_json:
                _json(
                    {"request_id": request_id, "status": LAUNCH_FAILED, "error": row.error_message}
                )
            else:
                reason = mask_secrets(row.error_message or "")
                click.echo(f"launch request {request_id} FAILED: {reason}", err=True)
            return EXIT_FAILED
        execution = None
        if row is not None and row.status == LAUNCH_LAUNCHED:
            look = partial(repository.get_job_execution, int(row.job_execution_id))
            execution = ride_out(engine, look, "wait", fresh=True)
            if execution is not None and not execution.status.is_running:
                status = execution.status.value
                if as_json:
                    _json(
                        {
                            "request_id": request_id,
                            "job_execution_id": execution.id,
                            "status": status,
                            "exit_code": execution.exit_status.code,
                        }
                    )
                else:
                    click.echo(f"job execution {execution.id} ended {status}")
                return EXIT_OK if status == "COMPLETED" else EXIT_FAILED
        waited = time.monotonic() - began
        pending = row is None or row.status == LAUNCH_PENDING
        if pending and not hinted and waited >= min(UNCLAIMED_HINT_S, timeout):
            hinted = True
            click.echo(
                f"launch request {request_id} is still PENDING after "
                f"{fmt_age(round(waited * 1000))}: no node has claimed it; is a `dbcluster "
                f"worker --accept-launches` whose app has job {job!r} running?",
                err=True,
            )
        if waited >= timeout:
            where = (
                f"job execution {execution.id} is still {execution.status.value}"
                if execution is not None
                else f"the request is still {row.status if row is not None else 'PENDING'}"
            )
            if as_json:
                _json(
                    {
                        "request_id": request_id,
                        "job_execution_id": None if execution is None else execution.id,
                        "status": (
                            execution.status.value
                            if execution is not None
                            else (row.status if row is not None else LAUNCH_PENDING)
                        ),
                        "timed_out": True,
                    }
                )
            click.echo(
                f"launch request {request_id}: gave up waiting after "
                f"{fmt_age(round(timeout * 1000))} ({where}; --timeout waits longer)",
                err=True,
            )
            return EXIT_FAILED
        time.sleep(0.5)


@click.command()
@click.option("--app", envvar="DBCLUSTER_APP", help=APP_HELP)
@click.option(
    "--url",
    envvar="DBCLUSTER_URL",
    help=URL_HELP + " Adds each schedule's last fire (and uses the database clock).",
)
@connect_timeout_option()
@click.option(
    "--cron",
    "expression",
    help="Check a cron expression instead: print its next fire times (see --count).",
)
@click.option("--timezone", default="UTC", show_default=True, help="With --cron: its time zone.")
@click.option("--count", type=click.IntRange(min=1, max=1000), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def schedules(
    app: str | None,
    url: str | None,
    expression: str | None,
    timezone: str,
    count: int,
    as_json: bool,
) -> None:
    """List the schedules of an app's registry: job, cron, time zone, misfire policy, next fire
    and (with --url) last fire. Times are UTC. With --cron, check an expression instead."""
    from dbcluster.batch.cron import Cron, zone

    now = datetime.utcnow().replace(microsecond=0)  # noqa: DTZ003 - naive UTC, like the database
    if expression is not None:
        cron, tz = Cron.parse(expression), zone(timezone)
        ticks, at = [], now
        for _ in range(count):
            at = cron.next_after(at, tz)
            ticks.append(at)
        if as_json:
            _json({"cron": expression, "timezone": timezone, "next": ticks})
        else:
            for tick in ticks:
                click.echo(f"{tick.isoformat()}Z")
        return
    if not app:
        raise click.UsageError("give --app (the registry whose schedules to list) or --cron")
    from dbcluster.batch import load_registry

    registry = load_registry(app)
    last: dict[str, datetime] = {}
    if url:
        from dbcluster.cluster.launches import LaunchStore
        from dbcluster.cluster.store import CoordinationStore

        engine = open_engine(url, Tables.PRESENT)
        try:
            launches = LaunchStore(CoordinationStore(engine))
            names = [s.name for s in registry.schedules()]
            now, last = ride_out(
                engine, lambda: (launches.db_now(), launches.last_fires(names)), "schedules"
            )
        finally:
            engine.dispose()
    rows = [
        {
            "name": s.name,
            "job": s.job,
            "cron": s.cron,
            "timezone": s.timezone,
            "misfire": s.misfire,
            "next_fire": s.next_after(now),
            "last_fire": last.get(s.name),
        }
        for s in registry.schedules()
    ]
    if as_json:
        _json(rows)
        return
    if not rows:
        click.echo("no schedules registered")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "job", "cron", "timezone", "misfire", "next fire (UTC)", "last fire")
    for r in rows:
        last_fire = r["last_fire"].isoformat() if r["last_fire"] else ("-" if url else "(no --url)")
        table.add_row(
            r["name"],
            r["job"],
            r["cron"],
            r["timezone"],
            r["misfire"],
            r["next_fire"].isoformat(),
            last_fire,
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)
