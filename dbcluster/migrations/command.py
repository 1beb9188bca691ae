"""``dbcluster migrate``: bring a database's dbcluster schema to this release's."""

from __future__ import annotations

import click


@click.command()
@click.option(
    "--url", envvar="DBCLUSTER_URL", help="SQLAlchemy database URL (or set DBCLUSTER_URL)."
)
@click.option("--sql", "as_sql", is_flag=True, help="Print the SQL for a DBA; touch nothing.")
@click.option(
    "--dialect",
    "dialect_name",
    help="With --sql: the database's provider, as `dbcluster ddl --dialect` names it.",
)
@click.option(
    "--from",
    "from_version",
    default=None,
    help="With --sql: the revision the database is at (default: read from --url, else 0001, "
    "the 0.1.0 schema).",
)
@click.option("--to", "to_version", default=None, help="With --sql: the last revision to print.")
@click.option(
    "--force",
    is_flag=True,
    help="Migrate even though nodes heartbeated in the last minute (they must be stopped).",
)
def migrate(
    url: str | None,
    as_sql: bool,
    dialect_name: str | None,
    from_version: str | None,
    to_version: str | None,
    force: bool,
) -> None:
    """Upgrade the dbcluster tables to this release's schema (stop every node first).

    Each revision runs in one transaction where the database's DDL is transactional
    (PostgreSQL, SQLite, SQL Server, Db2); MySQL, MariaDB and Oracle commit each DDL statement,
    so a run cut short is completed by running migrate again. With --sql, prints the statements
    instead (with --dialect, no connection is made)."""
    from dbcluster import migrations
    from dbcluster.cli import open_engine
    from dbcluster.dialects import get_provider, provider_for_name

    if as_sql:
        if dialect_name and url:
            raise click.UsageError("give --dialect or --url, not both")
        if dialect_name:
            provider, start = provider_for_name(dialect_name), from_version or "0001"
        elif url:
            engine = open_engine(url)
            try:
                provider = get_provider(engine)
                with engine.connect() as conn:
                    start = from_version or migrations.current_version(conn) or "0001"
            finally:
                engine.dispose()
        else:
            raise click.UsageError("give --dialect NAME or --url URL")
        known = [r.revision for r in migrations.revisions()]
        end = to_version or migrations.HEAD
        for value, hint in ((start, "--from"), (end, "--to")):
            if value not in known:
                raise click.BadParameter(
                    f"there is no schema revision {value!r} (known: {', '.join(known)})",
                    param_hint=hint,
                )
        click.echo(migrations.upgrade_sql(provider, from_version=start, to=end), nl=False)
        return
    if dialect_name or from_version or to_version:
        raise click.UsageError("--dialect, --from and --to go with --sql")
    if not url:
        raise click.UsageError("give --url URL (or set DBCLUSTER_URL)")
    engine = open_engine(url)
    try:
        applied = migrations.upgrade(engine, force=force)
    finally:
        engine.dispose()
    if not applied:
        click.echo(f"the schema is current ({migrations.HEAD}); nothing to do")
    for revision in applied:
        click.echo(f"applied {revision.revision} ({revision.release}): {revision.title}")
