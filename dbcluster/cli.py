"""The ``dbcluster`` command.

Errors a user can cause are :class:`~dbcluster.errors.DbclusterError`s: printed as one line on
stderr, exit status 2, no traceback.
"""

from __future__ import annotations

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
        raise DatabaseUnreachableError(
            f"cannot connect to {safe_url(url)}: {reason}"
        ) from exc
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
