"""The ``dbcluster`` command (docs/cli.md).

Errors a user can cause are :class:`~dbcluster.errors.DbclusterError`s: printed as one line on
stderr, exit status 2, no traceback; a database that cannot be reached exits 3
(:mod:`dbcluster.cli_options` names the statuses).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from dbcluster.cli_options import (
    DURATION_S,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    chosen_level,
    log_options,
)
from dbcluster.errors import (
    ConfigurationError,
    DatabaseUnreachableError,
    DbclusterError,
    unreachable,
)

URL_HELP = "SQLAlchemy database URL (or set DBCLUSTER_URL)."


def _export_url(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The URL a command uses is ``DBCLUSTER_URL`` in its environment too (given as ``--url``
    or not), so the application's resources read the one its nodes use."""
    if value:
        os.environ["DBCLUSTER_URL"] = value
    return value


def url_option(required: bool = True) -> Callable[[Any], Any]:
    return click.option(
        "--url", envvar="DBCLUSTER_URL", required=required, help=URL_HELP, callback=_export_url
    )


def open_engine(url: str) -> Engine:
    """An engine for a user-given URL, connected once so that a bad host fails here, clearly."""
    from dbcluster.dialects import make_engine

    engine = make_engine(url)
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        engine.dispose()
        raise unreachable(url, exc) from exc
    return engine


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dbcluster")
def cli() -> None:
    """Partitioned batch jobs across worker processes, coordinated through SQL."""


class ProviderNameOption(click.Option):
    """An option naming a provider; its help lists every registered one, third parties' too.
    The list is read when help is shown, so starting the CLI scans no entry points."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from dbcluster.dialects.registry import known_names

        self.help = f"The database's provider: {', '.join(known_names())}."
        return super().get_help_record(ctx)


def _server_version(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        raise ConfigurationError(
            f"--server-version {text!r} is not a version such as 19 or 11.5"
        ) from None


@cli.command()
@click.option("--dialect", "dialect_name", cls=ProviderNameOption)
@url_option(required=False)
@click.option(
    "--server-version",
    help="The oldest server version the DDL must load on, e.g. 19 or 23 for Oracle "
    "(default: the oldest dbcluster supports; the first line of the output names it).",
)
def ddl(dialect_name: str | None, url: str | None, server_version: str | None) -> None:
    """Print the complete DDL for a database (no connection is made)."""
    from dbcluster.dialects import provider_for_name, provider_for_url

    version = _server_version(server_version)
    if dialect_name and url:
        raise click.UsageError("give --dialect or --url, not both")
    if dialect_name:
        provider = provider_for_name(dialect_name, version)
    elif url:
        provider = provider_for_url(url, version)
    else:
        raise click.UsageError("give --dialect NAME or --url URL")
    click.echo(provider.ddl_script(), nl=False)


@cli.command()
@url_option()
def init(url: str) -> None:
    """Create the dbcluster tables that are missing, and record the schema's version (safe to
    run from several processes). On an older schema it says to run `dbcluster migrate`."""
    from dbcluster import migrations
    from dbcluster.dialects import get_provider

    engine = open_engine(url)
    try:
        with engine.connect() as conn:
            version = migrations.current_version(conn)
        if version not in (None, migrations.HEAD):
            migrations.require_current_schema(engine)  # says to migrate or to upgrade
        created, indexes = get_provider(engine).create_schema(engine)
        migrations.record_if_unrecorded(engine)  # an init cut short made the tables only
    finally:
        engine.dispose()
    if created:
        click.echo(f"created {len(created)} table(s): {', '.join(created)}")
    else:
        click.echo("all dbcluster tables already exist")
    if indexes:  # of tables that existed without them (a CREATE INDEX lost to a crash)
        click.echo(f"created {len(indexes)} missing index(es): {', '.join(indexes)}")


APP_HELP = "The application: module:attribute of a JobRegistry (or set DBCLUSTER_APP)."


def _setup_logging(level: str, log_format: str) -> None:
    from dbcluster import logs

    logs.configure(level, log_format)


def _announce(message: str, log_format: str, *, warning: bool = False) -> None:
    """A line always shown on stderr, in the command's log format (see logs.announce)."""
    import logging

    from dbcluster import logs

    if warning and log_format == "json":
        message = message.removeprefix("warning: ")
    logs.announce(
        message, log_format, level=logging.WARNING if warning else logging.INFO, logger="dbcluster"
    )


OTEL_HELP = (
    "Export OpenTelemetry spans of jobs, steps, partitions and chunks over OTLP/HTTP "
    "(configured by the OTEL_* variables; needs the otel extra)."
)


def otel_option() -> Callable[[Any], Any]:
    return click.option("--otel", is_flag=True, envvar="DBCLUSTER_OTEL", help=OTEL_HELP)


def _observe(
    cluster: Any,
    *,
    otel: bool = False,
    metrics_port: int | None = None,
    health_port: int | None = None,
    host: str = "0.0.0.0",
    log_format: str = "text",
) -> Callable[[], None]:
    """Attach what was asked for to the cluster's node before it starts (spans, metrics, probe
    endpoints); returns what detaches it all. A missing extra or a port in use is the user's
    to fix: one line, exit status 2."""
    stops: list[Callable[[], None]] = []
    node = cluster.node
    try:
        if otel:
            from dbcluster.tracing import Tracing, configure_otlp

            provider = configure_otlp()
            stops += [provider.shutdown, Tracing(node).start().stop]
        routes: dict[int, dict[str, Any]] = {}
        if metrics_port is not None:
            from dbcluster.metrics import NodeMetrics

            metrics = NodeMetrics()
            node.events.subscribe(metrics)
            routes.setdefault(metrics_port, {})["/metrics"] = lambda: (200, *metrics.exposition())
        if health_port is not None:
            from dbcluster.cluster.health import probe_routes

            routes.setdefault(health_port, {}).update(probe_routes(node))
    except ImportError as missing:
        raise ConfigurationError(str(missing)) from None
    from dbcluster.cluster.health import EndpointServer

    for port, served in routes.items():
        try:
            server = EndpointServer(host, port, served).start()
        except OSError as exc:
            for stop in reversed(stops):
                stop()
            raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        stops.append(server.stop)
        _announce(f"serving {', '.join(sorted(served))} on http://{host}:{server.port}", log_format)

    def stop_all() -> None:
        for stop in reversed(stops):
            stop()

    return stop_all


def _settings(
    concurrency: int | None, node_prefix: str | None, prune_after: str | None = None
) -> Any:
    from dbcluster.cluster import ClusterSettings
    from dbcluster.cluster.settings import parse_age

    return ClusterSettings.from_env(
        concurrency_limit=concurrency,
        node_id_prefix=node_prefix,
        prune_after=None if prune_after is None else parse_age(prune_after),
    )


@cli.command()
@url_option()
@click.option("--app", envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
@click.option("--concurrency", type=click.IntRange(min=1), help="Partitions run at once.")
@click.option("--node-prefix", help="Node id prefix (default: the host name).")
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve Prometheus metrics on /metrics at this port (0: any free one; needs the "
    "metrics extra).",
)
@click.option(
    "--health-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve /healthz and /readyz probes at this port (may be the metrics port).",
)
@click.option(
    "--endpoints-host",
    default="0.0.0.0",
    show_default=True,
    help="The address the metrics and probe endpoints listen on.",
)
@click.option(
    "--accept-launches",
    is_flag=True,
    envvar="DBCLUSTER_ACCEPT_LAUNCHES",
    help="Claim submitted launch requests and be their jobs' master; fire the app's schedules.",
)
@click.option(
    "--prune-after",
    help="Prune finished executions that ended longer ago than this (30d, 12h), one node of "
    "the cluster at a time (or set DBCLUSTER_PRUNE_AFTER).",
)
@otel_option()
@log_options()
def worker(
    url: str,
    app: str,
    concurrency: int | None,
    node_prefix: str | None,
    metrics_port: int | None,
    health_port: int | None,
    endpoints_host: str,
    accept_launches: bool,
    prune_after: str | None,
    otel: bool,
    log_level: str | None,
    log_format: str,
    verbose: bool,
) -> None:
    """Run a node until SIGTERM or SIGINT, then stop gracefully (a second signal: stop now)."""
    import signal
    import threading

    from dbcluster.batch import load_registry
    from dbcluster.cluster import Cluster

    _setup_logging(chosen_level(log_level, verbose), log_format)
    registry = load_registry(app)
    settings = _settings(concurrency, node_prefix, prune_after)
    engine = open_checked_engine(url)
    cluster = Cluster(engine, registry, settings, accept_launches=accept_launches)
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        signals.append(signum)
        if len(signals) > 1:
            _announce("second signal: stopping now", log_format)
            sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    detach = _observe(
        cluster,
        otel=otel,
        metrics_port=metrics_port,
        health_port=health_port,
        host=endpoints_host,
        log_format=log_format,
    )
    cluster.start()
    _announce(f"node {cluster.node.node_id} running; SIGTERM or Ctrl-C to stop", log_format)
    while not stop.wait(0.5):
        pass
    cluster.stop()
    detach()
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
@otel_option()
@log_options()
@click.option(
    "--next",
    "next_run",
    is_flag=True,
    help="Start the job's next run: its incrementer applied to its last run's parameters "
    "(PARAMS given here override them).",
)
@click.option(
    "--on-interrupt",
    type=click.Choice(["ask", "stop", "detach"]),
    help="What Ctrl-C does: stop the job on every node (it ends STOPPED), detach (leave it to "
    "the cluster: a live node takes it over), or ask (default on a terminal; stop otherwise).",
)
@click.option("--detached-child", is_flag=True, hidden=True)
def launch(
    url: str,
    app: str,
    job: str,
    params: tuple[str, ...],
    next_run: bool,
    no_work: bool,
    concurrency: int | None,
    detach: bool,
    log_file: str | None,
    as_json: bool,
    quiet: bool,
    otel: bool,
    log_level: str | None,
    log_format: str,
    verbose: bool,
    on_interrupt: str | None,
    detached_child: bool,
) -> None:
    """Launch JOB with [-]name[(type)]=value parameters, with this process as its master.

    With --next, the parameters are the job's next run's (a job built with
    incrementer=RunIdIncrementer() gets run.id one higher than its last run), PARAMS on top.

    Shows a progress bar of partitions done / total (per node) on stderr while it waits, then a
    summary (not with --log-format json: stderr then holds only JSON lines). Exit status 0 when
    the job COMPLETED, 1 when it did not, 2 for usage errors, 3 when the database is
    unavailable.
    Parameters look like run.date(date)=2026-11-30 or count(int)=5; a leading '-' marks one
    non-identifying, e.g. -attempt(int)=2.

    With --detach, a background master process (its own session, so closing the terminal does
    not stop it) runs the job; this command prints the new execution id and returns. Watch it
    with `dbcluster job ID`; the background process logs to --log-file.
    """
    from dbcluster.batch import JobLauncher, JobParameters, JobRepository, load_registry

    registry = load_registry(app)
    job_def = registry.get_job(job)
    parameters = JobParameters.parse(params)
    engine = open_checked_engine(url)
    try:
        if next_run:
            parameters = JobLauncher(JobRepository(engine)).next_parameters(job_def, parameters)
            params = tuple(parameters.to_strings())  # what a detached master is given
        job_def.validate_parameters(parameters)
    except BaseException:
        engine.dispose()
        raise
    if detach and not detached_child:
        engine.dispose()
        choice = _LogChoice(log_level, log_format, verbose)
        _detach(url, app, job, params, no_work, concurrency, log_file, as_json, choice, otel)
        return

    def start(cluster: Any) -> Any:
        execution = cluster.create_execution(job_def, parameters)
        if detached_child:
            _report_to_parent(execution.id)
        # Cluster.launch() is create_execution() then run_execution(); split so a detached master
        # can report the execution id before it runs the job.
        with interrupts(cluster, execution.id, "stop" if detached_child else on_interrupt):
            return cluster.run_execution(job_def, execution)

    from dbcluster.cluster.stop_command import Detached, interrupts

    try:
        _run_as_master(
            engine,
            registry,
            start,
            no_work,
            concurrency,
            as_json,
            quiet,
            _LogChoice(log_level, log_format, verbose),
            summary_to_stderr=detached_child,
            otel=otel,
        )
    except Detached as detached:
        # This node has left the cluster: a live node takes the job over.
        click.echo(
            f"detached: execution {detached.execution_id} is left to the cluster (a live node "
            f"takes it over; watch it with `dbcluster job {detached.execution_id}`)",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)


def open_checked_engine(url: str) -> Engine:
    """:func:`open_engine`, then fail with "run dbcluster init" when tables are missing, or
    "run dbcluster migrate" when they are of an older schema."""
    from dbcluster.migrations import require_current_schema
    from dbcluster.monitor import require_schema

    engine = open_engine(url)
    try:
        require_current_schema(engine)
        require_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _report_to_parent(execution_id: int) -> None:
    """A detached master tells ``launch --detach`` its execution id on stdout, then lets go of
    the pipe (later output would have no reader)."""
    import json
    import logging

    try:
        sys.stdout.write(json.dumps({"job_execution_id": execution_id}) + "\n")
        sys.stdout.flush()
    except OSError as exc:  # the parent is gone (BrokenPipeError): the master carries on
        logging.getLogger("dbcluster.cluster").warning(
            "could not report execution %s to the launching process (%s); running it anyway",
            execution_id,
            exc,
        )
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
    log_choice: _LogChoice,
    otel: bool = False,
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
    args += ["-v"] if log_choice.verbose else []
    args += ["--log-level", log_choice.level] if log_choice.level else []
    args += ["--log-format", log_choice.format]
    args += ["--otel"] if otel else []
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
        sys.exit(code if code in (EXIT_USAGE, EXIT_UNAVAILABLE) else EXIT_USAGE if code == 0 else 1)
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


@dataclass(frozen=True)
class _LogChoice:
    """A command's log options: ``--log-level`` as given (None: the command's default),
    ``--log-format``, ``-v``."""

    level: str | None
    format: str
    verbose: bool


def _master_logging(choice: _LogChoice, quiet: bool, console: Any) -> None:
    """Warnings, and the master's own INFO lines (placement, reassignment), above the progress
    bar on a terminal; plain lines on stderr otherwise; JSON lines with --log-format json. An
    explicit --log-level applies to every logger."""
    import logging

    from dbcluster import logs
    from dbcluster.masking import SecretsFilter

    if console.is_terminal and choice.format == "text":
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=console, show_path=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        handler.addFilter(SecretsFilter())
    else:
        handler = logs.handler(choice.format)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(chosen_level(choice.level, choice.verbose, default="warning").upper())
    if choice.level is None and not choice.verbose and not quiet:
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
    log_choice: _LogChoice,
    *,
    summary_to_stderr: bool = False,
    otel: bool = False,
) -> None:
    """Join as a node, run ``start(cluster)`` (which creates and runs a job execution) with a
    progress display, print the outcome and exit 0 (COMPLETED) or 1. A detached master prints
    its summary to stderr (its log file): nobody reads its stdout. With JSON logs stderr holds
    only log lines: no progress display, and a detached master's summary is logged."""
    import json
    import time
    from contextlib import nullcontext

    from rich.console import Console

    from dbcluster.batch.status import BatchStatus
    from dbcluster.cluster import Cluster
    from dbcluster.masking import mask_secrets
    from dbcluster.monitor import job_detail
    from dbcluster.views import LaunchProgress, summary_json, summary_lines

    err = Console(stderr=True, highlight=False)
    _master_logging(log_choice, quiet, err)
    json_logs = log_choice.format == "json"
    # A launching process ends with its own job: it takes no other job over.
    cluster = Cluster(
        engine, registry, _settings(concurrency, None), work=not no_work, take_over=False
    )
    progress = LaunchProgress(engine, err)
    if not quiet and not json_logs:
        cluster.handler.progress = progress
    detach = _observe(cluster, otel=otel, log_format=log_choice.format)
    began = time.monotonic()
    try:
        with cluster, nullcontext() if json_logs else progress:
            execution = start(cluster)
        elapsed = time.monotonic() - began
        detail = job_detail(engine, execution.id)
    finally:
        detach()
        engine.dispose()
    outcome = {
        "job_execution_id": execution.id,
        "job": execution.job_name,
        "status": execution.status.value,
        "exit_code": execution.exit_status.code,
        "exit_message": mask_secrets(detail.exit_message or ""),
        "elapsed_s": round(elapsed, 3),
        **summary_json(detail),
    }
    if summary_to_stderr and json_logs:
        import logging

        logging.getLogger("dbcluster.cluster").info("%s", json.dumps(outcome))
    elif as_json:
        click.echo(json.dumps(outcome), err=summary_to_stderr)
    else:
        for line in summary_lines(detail, elapsed):
            click.echo(line, err=summary_to_stderr)
    sys.exit(EXIT_OK if execution.status is BatchStatus.COMPLETED else EXIT_FAILED)


@cli.command()
@url_option()
@click.option("--app", envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
@click.argument("execution_id", type=int)
@click.option("--no-work", is_flag=True, help="Be the master only; run no partitions here.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Partitions run at once here.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress display, only warnings.")
@otel_option()
@log_options()
def restart(
    url: str,
    app: str,
    execution_id: int,
    no_work: bool,
    concurrency: int | None,
    as_json: bool,
    quiet: bool,
    otel: bool,
    log_level: str | None,
    log_format: str,
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
                f"if its master is gone, a live node takes it over (or, under master_failover="
                f"abandon, fails it; then restart it)"
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
        _LogChoice(log_level, log_format, verbose),
        otel=otel,
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

    from dbcluster.masking import masked
    from dbcluster.monitor import jsonable

    click.echo(json.dumps(masked(jsonable(value))))


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
@url_option()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8080,
    show_default=True,
    help="The port to listen on (0: any free one).",
)
@click.option(
    "--token",
    envvar="DBCLUSTER_WEB_TOKEN",
    help="Require this token to read the dashboard and to take actions (stop; restart with "
    "--app): a login form sets a session cookie, or send 'Authorization: Bearer TOKEN' "
    "(better: set DBCLUSTER_WEB_TOKEN). Without it the dashboard is read-only and public.",
)
@click.option(
    "--public-read",
    is_flag=True,
    envvar="DBCLUSTER_WEB_PUBLIC_READ",
    help="With --token: pages and /metrics are readable without the token; actions still need it.",
)
@click.option(
    "--app",
    envvar="DBCLUSTER_APP",
    help="With --token: the application whose jobs a restart runs (module:attribute).",
)
@click.option(
    "--refresh",
    type=DURATION_S,
    default="2s",
    show_default=True,
    help="How often an open page updates itself (a bare number is seconds; at least 0.5s).",
)
@log_options("Debug logging, every request logged (same as --log-level debug).")
def web(
    url: str,
    host: str,
    port: int,
    token: str | None,
    public_read: bool,
    app: str | None,
    refresh: float,
    log_level: str | None,
    log_format: str,
    verbose: bool,
) -> None:
    """Serve the dashboard: nodes, jobs, each job's partitions by node and their timeline, live;
    /metrics with the cluster's gauges. Without --token it is read-only and anyone who reaches
    it reads it; with --token it asks for the token to read (unless --public-read) and to act."""
    import socket

    try:
        import uvicorn

        from dbcluster.web import create_app
        from dbcluster.web.actions import Restarter, Stopper
    except ImportError as missing:
        raise ConfigurationError(
            f"the dashboard needs its extra ({missing}): pip install 'dbcluster[web]'"
        ) from None
    if refresh < 0.5:
        raise click.BadParameter("must be at least 0.5s", param_hint="--refresh")
    level = chosen_level(log_level, verbose, default="warning")
    _setup_logging(level, log_format)
    if app and token:
        from dbcluster.batch import load_registry

        load_registry(app)  # a wrong --app fails here, not at the first restart
    engine = open_checked_engine(url)
    application = create_app(
        engine,
        token=token,
        public_read=public_read,
        restarter=Restarter(url, app) if token and app else None,
        stopper=Stopper(url) if token else None,
        refresh_s=refresh,
    )
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        engine.dispose()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    bound = sock.getsockname()[1]
    if not token and not _loopback(host):
        _announce(
            f"warning: the dashboard listens on {host} without --token: anyone who can reach "
            "it reads job parameters, exit messages and database errors (set "
            "DBCLUSTER_WEB_TOKEN, or listen on 127.0.0.1)",
            log_format,
            warning=True,
        )
    if not token:
        mode = "read-only, no login"
    elif public_read:
        mode = "public read; actions need the token"
    else:
        mode = "the token is needed to read and to act"
    if token and not app:
        mode += "; restarts need --app"
    _announce(f"dashboard on http://{host}:{bound}/ ({mode})", log_format)
    config = uvicorn.Config(
        application,
        log_config=None,  # its records go to the root logger's handler, in --log-format
        log_level=level,
        access_log=level in ("debug", "info"),
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.dispose()


def _loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
    from dbcluster.cluster.launch_commands import schedules, submit
    from dbcluster.cluster.maintenance.prune_command import prune
    from dbcluster.cluster.stop_command import stop
    from dbcluster.migrations.command import migrate
    from dbcluster.testing.chaos import chaos

    cli.add_command(bench)
    cli.add_command(chaos)
    cli.add_command(stop)
    cli.add_command(submit)
    cli.add_command(schedules)
    cli.add_command(prune)
    cli.add_command(migrate)


_add_commands()


def _unavailable(error: BaseException) -> bool:
    """Whether a database error says the database is unavailable (no connection, a lost one,
    a pool that could not get one), not that a statement was wrong."""
    from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout))


def main(argv: list[str] | None = None) -> None:
    """The ``dbcluster`` command: exit 0 done, 1 a job did not complete, 2 a usage or user
    error, 3 the database is unavailable, 130 interrupted (one line on stderr, no traceback).

    A command puts its URL in ``DBCLUSTER_URL`` for the application's resources (``--url``);
    called in-process (``main([...])``), it leaves the environment as it found it."""
    saved = os.environ.get("DBCLUSTER_URL")
    try:
        _main(argv)
    finally:
        if saved is None:
            os.environ.pop("DBCLUSTER_URL", None)
        else:
            os.environ["DBCLUSTER_URL"] = saved


def _main(argv: list[str] | None) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from dbcluster.cluster.settings import warn_unknown_variables
    from dbcluster.logs import json_requested
    from dbcluster.masking import mask_secrets

    args = sys.argv[1:] if argv is None else list(argv)
    log_format = "json" if json_requested(args, os.environ) else "text"

    def warn(line: str) -> None:
        _announce(line, log_format, warning=True)

    def fail(line: str, status: int) -> None:
        if log_format == "json":
            _announce_error(line)
        else:
            click.echo(f"error: {line}", err=True)
        sys.exit(status)

    warn_unknown_variables(os.environ, echo=warn)
    try:
        cli.main(args=args, prog_name="dbcluster", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except DatabaseUnreachableError as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except DbclusterError as exc:
        fail(str(exc), EXIT_USAGE)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except SQLAlchemyError as exc:
        if not _unavailable(exc):
            raise
        orig = getattr(exc, "orig", None) or exc
        lines = str(orig).strip().splitlines() or [type(orig).__name__]
        fail(f"the database is unavailable: {mask_secrets(lines[0])}", EXIT_UNAVAILABLE)
    sys.exit(EXIT_OK)


def _announce_error(line: str) -> None:
    import logging

    from dbcluster import logs

    logs.announce(line, "json", level=logging.ERROR, logger="dbcluster")


if __name__ == "__main__":
    main()
