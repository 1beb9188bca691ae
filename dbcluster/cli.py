"""The ``dbcluster`` command.

Errors a user can cause are :class:`~dbcluster.errors.DbclusterError`s: printed as one line on
stderr, exit status 2, no traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from dbcluster.errors import DatabaseUnreachableError, DbclusterError

URL_HELP = "SQLAlchemy database URL (or set DBCLUSTER_URL)."


def url_option(required: bool = True) -> Callable[[Any], Any]:
    return click.option("--url", envvar="DBCLUSTER_URL", required=required, help=URL_HELP)


def open_engine(url: str) -> Engine:
    """An engine for a user-given URL, connected once so that a bad host fails here, clearly."""
    from dbcluster.dialects import make_engine, safe_url

    engine = make_engine(url)
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        engine.dispose()
        raise DatabaseUnreachableError(f"cannot connect to {safe_url(url)}: {reason}") from exc
    return engine


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dbcluster")
def cli() -> None:
    """Partitioned batch jobs across worker processes, coordinated through SQL."""


@cli.command()
@click.option(
    "--dialect",
    "dialect_name",
    help="postgresql, mysql, mariadb, oracle, mssql, db2 or sqlite.",
)
@url_option(required=False)
def ddl(dialect_name: str | None, url: str | None) -> None:
    """Print the complete DDL for a database (no connection is made)."""
    from dbcluster.dialects import provider_for_name, provider_for_url

    if dialect_name and url:
        raise click.UsageError("give --dialect or --url, not both")
    if dialect_name:
        provider = provider_for_name(dialect_name)
    elif url:
        provider = provider_for_url(url)
    else:
        raise click.UsageError("give --dialect NAME or --url URL")
    click.echo(provider.ddl_script(), nl=False)


@cli.command()
@url_option()
def init(url: str) -> None:
    """Create the dbcluster tables that are missing (safe to run from several processes)."""
    from dbcluster.dialects import get_provider

    engine = open_engine(url)
    try:
        created = get_provider(engine).create_tables(engine)
    finally:
        engine.dispose()
    if created:
        click.echo(f"created {len(created)} table(s): {', '.join(created)}")
    else:
        click.echo("all dbcluster tables already exist")


APP_HELP = "The application: module:attribute of a JobRegistry (or set DBCLUSTER_APP)."


def _setup_logging(verbose: bool) -> None:
    import logging

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _settings(concurrency: int | None, node_prefix: str | None) -> Any:
    from dbcluster.cluster import ClusterSettings

    return ClusterSettings.from_env(concurrency_limit=concurrency, node_id_prefix=node_prefix)


@cli.command()
@url_option()
@click.option("--app", envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
@click.option("--concurrency", type=click.IntRange(min=1), help="Partitions run at once.")
@click.option("--node-prefix", help="Node id prefix (default: the host name).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def worker(
    url: str, app: str, concurrency: int | None, node_prefix: str | None, verbose: bool
) -> None:
    """Run a node until SIGTERM or SIGINT, then stop gracefully (a second signal: stop now)."""
    import signal
    import threading

    from dbcluster.batch import load_registry
    from dbcluster.cluster import Cluster

    _setup_logging(verbose)
    registry = load_registry(app)
    settings = _settings(concurrency, node_prefix)
    engine = open_checked_engine(url)
    cluster = Cluster(engine, registry, settings)
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        signals.append(signum)
        if len(signals) > 1:
            click.echo("second signal: stopping now", err=True)
            sys.stdout.flush()
            os._exit(130)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster.start()
    click.echo(f"node {cluster.node.node_id} running; SIGTERM or Ctrl-C to stop", err=True)
    while not stop.wait(0.5):
        pass
    cluster.stop()
    engine.dispose()


@cli.command(context_settings={"ignore_unknown_options": True})
@url_option()
@click.option("--app", envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
@click.argument("job")
@click.argument("params", nargs=-1, type=click.UNPROCESSED)
@click.option("--no-work", is_flag=True, help="Be the master only; run no partitions here.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Partitions run at once here.")
@click.option(
    "--detach",
    is_flag=True,
    help="Launch in a background master process; print the execution id and return at once.",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, writable=True),
    help="With --detach: where the background master logs (default: a file in the temp dir).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress display, only warnings.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("--detached-child", is_flag=True, hidden=True)
def launch(
    url: str,
    app: str,
    job: str,
    params: tuple[str, ...],
    no_work: bool,
    concurrency: int | None,
    detach: bool,
    log_file: str | None,
    as_json: bool,
    quiet: bool,
    verbose: bool,
    detached_child: bool,
) -> None:
    """Launch JOB with [-]name[(type)]=value parameters, with this process as its master.

    Shows a progress bar of partitions done / total (per node) on stderr while it waits, then a
    summary. Exit status 0 when the job COMPLETED, 1 when it FAILED, 2 for usage errors.
    Parameters look like run.date(date)=2026-11-30 or count(int)=5; a leading '-' marks one
    non-identifying, e.g. -attempt(int)=2.

    With --detach, a background master process (its own session, so closing the terminal does
    not stop it) runs the job; this command prints the new execution id and returns. Watch it
    with `dbcluster job ID`; the background process logs to --log-file.
    """
    from dbcluster.batch import JobParameters, load_registry

    registry = load_registry(app)
    job_def = registry.get_job(job)
    parameters = JobParameters.parse(params)
    engine = open_checked_engine(url)
    if detach and not detached_child:
        engine.dispose()
        _detach(url, app, job, params, no_work, concurrency, log_file, as_json, verbose)
        return

    def start(cluster: Any) -> Any:
        execution = cluster.create_execution(job_def, parameters)
        if detached_child:
            _report_to_parent(execution.id)
        # Cluster.launch() is create_execution() then run_execution(); split so a detached master
        # can report the execution id before it runs the job.
        return cluster.run_execution(job_def, execution)

    _run_as_master(
        engine,
        registry,
        start,
        no_work,
        concurrency,
        as_json,
        quiet,
        verbose,
        summary_to_stderr=detached_child,
    )


def open_checked_engine(url: str) -> Engine:
    """:func:`open_engine`, then fail with "run dbcluster init" when tables are missing."""
    from dbcluster.monitor import require_schema

    engine = open_engine(url)
    try:
        require_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _report_to_parent(execution_id: int) -> None:
    """A detached master tells ``launch --detach`` its execution id on stdout, then lets go of
    the pipe (later output would have no reader)."""
    import json

    sys.stdout.write(json.dumps({"job_execution_id": execution_id}) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _detach(
    url: str,
    app: str,
    job: str,
    params: tuple[str, ...],
    no_work: bool,
    concurrency: int | None,
    log_file: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    import json
    import subprocess
    import tempfile
    import threading
    import time
    from pathlib import Path

    log_path = Path(
        log_file
        or Path(tempfile.gettempdir())
        / f"dbcluster-launch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    ).resolve()
    args = [sys.executable, "-m", "dbcluster.cli", "launch", "--app", app, "--detached-child"]
    args += ["--no-work"] if no_work else []
    args += ["--concurrency", str(concurrency)] if concurrency else []
    args += ["-v"] if verbose else []
    args += ["--", job, *params]
    # The URL travels in the environment, never on a command line other users can read.
    env = {**os.environ, "DBCLUSTER_URL": url}
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
        )
    assert child.stdout is not None
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.append(child.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=120)
    line = lines[0] if lines else b""
    try:
        execution_id = int(json.loads(line)["job_execution_id"])
    except (ValueError, KeyError, TypeError):
        if child.poll() is None:
            child.kill()
        code = child.wait()
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        reason = tail[-1] if tail else f"exit status {code}"
        click.echo(f"the background master did not start the job: {reason}", err=True)
        click.echo(f"(log: {log_path})", err=True)
        sys.exit(2 if code in (0, 2) else 1)
    child.stdout.close()
    outcome = {
        "job_execution_id": execution_id,
        "job": job,
        "detached": True,
        "pid": child.pid,
        "log_file": str(log_path),
    }
    if as_json:
        click.echo(json.dumps(outcome))
    else:
        click.echo(
            f"job {job} execution {execution_id} launched in the background (pid {child.pid})"
        )
        click.echo(f"  log: {log_path}")
        click.echo(f"  watch it: dbcluster job {execution_id}")


def _master_logging(verbose: bool, quiet: bool, console: Any) -> None:
    """Warnings, and the master's own INFO lines (placement, reassignment), above the progress
    bar on a terminal; plain lines on stderr otherwise."""
    import logging

    if console.is_terminal:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=console, show_path=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    if not verbose and not quiet:
        for name in ("dbcluster.master", "dbcluster.cluster", "dbcluster.recovery"):
            logging.getLogger(name).setLevel(logging.INFO)


def _run_as_master(
    engine: Engine,
    registry: Any,
    start: Callable[[Any], Any],
    no_work: bool,
    concurrency: int | None,
    as_json: bool,
    quiet: bool,
    verbose: bool,
    *,
    summary_to_stderr: bool = False,
) -> None:
    """Join as a node, run ``start(cluster)`` (which creates and runs a job execution) with a
    progress display, print the outcome and exit 0 (COMPLETED) or 1. A detached master prints
    its summary to stderr (its log file): nobody reads its stdout."""
    import json
    import time

    from rich.console import Console

    from dbcluster.batch.status import BatchStatus
    from dbcluster.cluster import Cluster
    from dbcluster.monitor import job_detail
    from dbcluster.views import LaunchProgress, summary_json, summary_lines

    err = Console(stderr=True, highlight=False)
    _master_logging(verbose, quiet, err)
    cluster = Cluster(engine, registry, _settings(concurrency, None), work=not no_work)
    progress = LaunchProgress(engine, err)
    if not quiet:
        cluster.handler.progress = progress
    began = time.monotonic()
    try:
        with cluster, progress:
            execution = start(cluster)
        elapsed = time.monotonic() - began
        detail = job_detail(engine, execution.id)
    finally:
        engine.dispose()
    outcome = {
        "job_execution_id": execution.id,
        "job": execution.job_name,
        "status": execution.status.value,
        "exit_code": execution.exit_status.code,
        "exit_message": detail.exit_message or "",
        "elapsed_s": round(elapsed, 3),
        **summary_json(detail),
    }
    if as_json:
        click.echo(json.dumps(outcome), err=summary_to_stderr)
    else:
        for line in summary_lines(detail, elapsed):
            click.echo(line, err=summary_to_stderr)
    sys.exit(0 if execution.status is BatchStatus.COMPLETED else 1)


@cli.command()
@url_option()
@click.option("--app", envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
@click.argument("execution_id", type=int)
@click.option("--no-work", is_flag=True, help="Be the master only; run no partitions here.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Partitions run at once here.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress display, only warnings.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def restart(
    url: str,
    app: str,
    execution_id: int,
    no_work: bool,
    concurrency: int | None,
    as_json: bool,
    quiet: bool,
    verbose: bool,
) -> None:
    """Restart a FAILED, STOPPED or ABANDONED job execution, with this process as its master.

    A new execution of the same job instance runs: COMPLETED steps are skipped and only the
    partitions that did not complete run again. Exit status as for launch."""
    from dbcluster.batch import JobRepository, load_registry
    from dbcluster.batch.exceptions import JobRestartError, NoSuchJobExecutionError
    from dbcluster.batch.status import BatchStatus

    registry = load_registry(app)
    engine = open_checked_engine(url)
    try:
        old = JobRepository(engine).get_job_execution(execution_id)
        if old is None:
            raise NoSuchJobExecutionError(f"there is no job execution with id {execution_id}")
        if old.status is BatchStatus.COMPLETED:
            raise JobRestartError(
                f"execution {execution_id} of job {old.job_name!r} COMPLETED; there is nothing "
                f"to restart (launch the job with new identifying parameters to run it again)"
            )
        if old.status.is_running:
            raise JobRestartError(
                f"execution {execution_id} of job {old.job_name!r} is still {old.status.value}; "
                f"if its master is gone, a live node abandons it (then restart it)"
            )
        registry.get_job(old.job_name)
    except BaseException:
        engine.dispose()
        raise
    _run_as_master(
        engine,
        registry,
        lambda cluster: cluster.restart(execution_id),
        no_work,
        concurrency,
        as_json,
        quiet,
        verbose,
    )


def _print(renderables: list[Any]) -> None:
    from dbcluster.views import stdout_console

    console = stdout_console()
    if console.is_terminal:
        for i, renderable in enumerate(renderables):
            if i:
                console.print()
            console.print(renderable)
        return
    with console.capture() as captured:
        for i, renderable in enumerate(renderables):
            if i:
                console.print()
            console.print(renderable)
    # Piped: no padding to the console's width at the end of each line.
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _echo_json(value: Any) -> None:
    import json

    from dbcluster.monitor import jsonable

    click.echo(json.dumps(jsonable(value)))


@cli.command()
@url_option()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(url: str, as_json: bool) -> None:
    """The nodes (heartbeat age from the database clock) and the jobs in flight."""
    from dbcluster.monitor import cluster_status
    from dbcluster.views import status_tables

    engine = open_checked_engine(url)
    try:
        found = cluster_status(engine)
    finally:
        engine.dispose()
    if as_json:
        _echo_json(
            {
                "db_now": found.db_now,
                "nodes": found.nodes,
                "jobs": [_job_json(j) for j in found.jobs],
            }
        )
    else:
        _print(status_tables(found))


def _job_json(row: Any) -> dict[str, Any]:
    from dbcluster.monitor import jsonable

    return {**jsonable(row), "partitions_total": row.partitions_total}


@cli.command()
@url_option()
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--job", "job_name", help="Only executions of this job.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def jobs(url: str, limit: int, job_name: str | None, as_json: bool) -> None:
    """Recent job executions, newest first."""
    from dbcluster.monitor import recent_jobs
    from dbcluster.views import jobs_table

    engine = open_checked_engine(url)
    try:
        rows = recent_jobs(engine, limit, job_name)
    finally:
        engine.dispose()
    if as_json:
        _echo_json([_job_json(j) for j in rows])
    else:
        _print([jobs_table(rows)])


@cli.command("job")
@url_option()
@click.argument("execution_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def job_command(url: str, execution_id: int, as_json: bool) -> None:
    """One job execution: its partitions (node, status, attempt, last update) and steps."""
    from dbcluster.monitor import job_detail
    from dbcluster.views import job_renderables

    engine = open_checked_engine(url)
    try:
        detail = job_detail(engine, execution_id)
    finally:
        engine.dispose()
    if as_json:
        _echo_json({**_as_json(detail), "partition_counts": detail.partition_counts})
    else:
        _print(job_renderables(detail))


def _as_json(value: Any) -> dict[str, Any]:
    from dbcluster.monitor import jsonable

    return jsonable(value)


@cli.command()
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
@click.option("-v", "--verbose", is_flag=True, help="Show the workers' log lines too.")
def demo(nodes: int, url: str | None, verbose: bool) -> None:
    """Watch a cluster survive a dead worker: N worker processes sum receipts by id range, one
    is killed mid-run, its partitions move, and the total is checked. Needs no server."""
    from dbcluster.demo import run_demo

    sys.exit(run_demo(nodes=nodes, url=url, verbose=verbose))


def _add_commands() -> None:
    """Commands that live beside the code they drive."""
    from dbcluster.bench.command import bench
    from dbcluster.testing.chaos import chaos

    cli.add_command(bench)
    cli.add_command(chaos)


_add_commands()


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="dbcluster", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except DbclusterError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(0)


if __name__ == "__main__":
    main()
