"""The commands that join the cluster as a node: ``dbcluster worker`` runs one until it is
stopped; ``dbcluster launch`` and ``restart`` run one job with this process as its master."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from dbcluster.cli.engines import Tables, open_engine, ride_out
from dbcluster.cli.master import LogChoice, detach_launch, report_to_parent, run_as_master
from dbcluster.cli.node import cluster_settings, join, observe
from dbcluster.cli.options import (
    APP_HELP,
    EXIT_INTERRUPTED,
    EnvOption,
    chosen_level,
    log_options,
    otel_option,
    url_option,
)
from dbcluster.cli.output import announce, setup_logging
from dbcluster.cli.stop import Detached, interrupts


@click.command()
@url_option()
@click.option("--app", cls=EnvOption, envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
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

    setup_logging(chosen_level(log_level, verbose), log_format)
    registry = load_registry(app)
    settings = cluster_settings(concurrency, node_prefix, prune_after)
    engine = open_engine(url, Tables.CURRENT)
    cluster, detach = join(
        engine,
        lambda: Cluster(engine, registry, settings, accept_launches=accept_launches),
        lambda cluster: observe(
            cluster,
            otel=otel,
            metrics_port=metrics_port,
            health_port=health_port,
            host=endpoints_host,
            log_format=log_format,
        ),
    )
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        signals.append(signum)
        if len(signals) > 1:
            announce("second signal: stopping now", log_format)
            sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    announce(f"node {cluster.node.node_id} running; SIGTERM or Ctrl-C to stop", log_format)
    while not stop.wait(0.5):
        pass
    cluster.stop()
    detach()
    engine.dispose()


@click.command(context_settings={"ignore_unknown_options": True})
@url_option()
@click.option("--app", cls=EnvOption, envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
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
    engine = open_engine(url, Tables.CURRENT)
    try:
        if next_run:
            given = parameters
            parameters = ride_out(
                engine,
                lambda: JobLauncher(JobRepository(engine)).next_parameters(job_def, given),
                "launch",
            )
            params = tuple(parameters.to_strings())  # what a detached master is given
        job_def.validate_parameters(parameters)
    except BaseException:
        engine.dispose()
        raise
    if detach and not detached_child:
        engine.dispose()
        choice = LogChoice(log_level, log_format, verbose)
        detach_launch(url, app, job, params, no_work, concurrency, log_file, as_json, choice, otel)
        return

    def start(cluster: Any) -> Any:
        # The creating transaction is verified, not repeated, when its commit's outcome is
        # unknown (ride_out raises that at once): the launch never makes two executions. A
        # detached master reports the id only once the execution is committed.
        execution = ride_out(
            engine, lambda: cluster.create_execution(job_def, parameters), "launch"
        )
        if detached_child:
            report_to_parent(execution.id)
        # Cluster.launch() is create_execution() then run_execution(); split so a detached master
        # can report the execution id before it runs the job.
        with interrupts(cluster, execution.id, "stop" if detached_child else on_interrupt):
            return cluster.run_execution(job_def, execution)

    try:
        run_as_master(
            engine,
            registry,
            start,
            no_work,
            concurrency,
            as_json,
            quiet,
            LogChoice(log_level, log_format, verbose),
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


@click.command()
@url_option()
@click.option("--app", cls=EnvOption, envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
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
    engine = open_engine(url, Tables.CURRENT)
    try:
        old = ride_out(
            engine, lambda: JobRepository(engine).get_job_execution(execution_id), "restart"
        )
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
    job_def = registry.get_job(old.job_name)

    def start(cluster: Any) -> Any:
        # Cluster.restart(), with its creating transaction ridden out as a launch's is.
        execution = ride_out(
            engine,
            lambda: cluster.create_execution(job_def, old.parameters, existing=True),
            "restart",
        )
        return cluster.run_execution(job_def, execution)

    run_as_master(
        engine,
        registry,
        start,
        no_work,
        concurrency,
        as_json,
        quiet,
        LogChoice(log_level, log_format, verbose),
        otel=otel,
    )
