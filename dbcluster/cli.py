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
from sqlalchemy.exc import OperationalError

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
    except OperationalError as exc:
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
    engine = open_engine(url)
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


@cli.command()
@url_option()
@click.option("--app", envvar="DBCLUSTER_APP", required=True, help=APP_HELP)
@click.argument("job")
@click.argument("params", nargs=-1)
@click.option("--no-work", is_flag=True, help="Be the master only; run no partitions here.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Partitions run at once here.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def launch(
    url: str,
    app: str,
    job: str,
    params: tuple[str, ...],
    no_work: bool,
    concurrency: int | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Launch JOB with name=value parameters, with this process as its master.

    Exit status 0 when the job COMPLETED, 1 when it FAILED."""
    import json

    from dbcluster.batch import JobParameters, load_registry
    from dbcluster.batch.status import BatchStatus
    from dbcluster.cluster import Cluster

    if verbose:
        _setup_logging(verbose)
    registry = load_registry(app)
    registry.get_job(job)
    parameters = JobParameters.parse(params)
    engine = open_engine(url)
    cluster = Cluster(engine, registry, _settings(concurrency, None), work=not no_work)
    with cluster:
        execution = cluster.launch(job, parameters)
    engine.dispose()
    outcome = {
        "job_execution_id": execution.id,
        "job": execution.job_name,
        "status": execution.status.value,
        "exit_code": execution.exit_status.code,
        "exit_message": execution.exit_status.description,
    }
    if as_json:
        click.echo(json.dumps(outcome))
    else:
        click.echo(
            f"job {job} execution {execution.id}: {execution.status.value}"
            + (
                f" ({execution.exit_status.description})"
                if execution.exit_status.description
                else ""
            )
        )
    sys.exit(0 if execution.status is BatchStatus.COMPLETED else 1)


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
