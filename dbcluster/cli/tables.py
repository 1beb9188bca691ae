"""``dbcluster ddl`` prints the dbcluster tables' DDL; ``dbcluster init`` creates them."""

from __future__ import annotations

import click

from dbcluster.cli.engines import open_engine, ride_out
from dbcluster.cli.options import url_option
from dbcluster.errors import ConfigurationError


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


@click.command()
@click.option("--dialect", "dialect_name", cls=ProviderNameOption)
@url_option(required=False, connects=False)
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


@click.command()
@url_option()
def init(url: str) -> None:
    """Create the dbcluster tables that are missing, and record the schema's version (safe to
    run from several processes). On an older schema it says to run `dbcluster migrate`."""
    from dbcluster import migrations

    engine = open_engine(url)
    try:
        # Safe to repeat after a lost connection: it creates what is missing, and records the
        # version where it is unrecorded.
        created, indexes = ride_out(engine, lambda: migrations.init(engine), "init")
    finally:
        engine.dispose()
    if created:
        click.echo(f"created {len(created)} table(s): {', '.join(created)}")
    else:
        click.echo("all dbcluster tables already exist")
    if indexes:  # of tables that existed without them (a CREATE INDEX lost to a crash)
        click.echo(f"created {len(indexes)} missing index(es): {', '.join(indexes)}")
