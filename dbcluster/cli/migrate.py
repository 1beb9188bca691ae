"""``dbcluster migrate``: bring a database's dbcluster schema to this release's;
``migrate current`` says which revision a database is at, ``migrate history`` lists them all."""

from __future__ import annotations

import json
from typing import Any

import click

from dbcluster.cli.engines import open_engine, ride_out
from dbcluster.cli.options import URL_HELP, connect_timeout_option


@click.group(invoke_without_command=True)
@click.option("--url", envvar="DBCLUSTER_URL", help=URL_HELP)
@connect_timeout_option()
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
@click.pass_context
def migrate(
    ctx: click.Context,
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
    instead (with --dialect, no connection is made).

    `dbcluster migrate current` prints the revision the database is at; `dbcluster migrate
    history` lists every revision (and, with --url, which are applied)."""
    if ctx.invoked_subcommand is not None:
        if as_sql or dialect_name or from_version or to_version or force:
            raise click.UsageError(
                f"--sql, --dialect, --from, --to and --force go with migrate, not "
                f"migrate {ctx.invoked_subcommand}"
            )
        ctx.obj = {"url": url}
        return
    from dbcluster import migrations
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

                def read() -> str | None:
                    with engine.connect() as conn:
                        return migrations.current_version(conn)

                start = from_version or ride_out(engine, read, "migrate") or "0001"
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


def _state(url: str) -> dict[str, Any]:
    """The database's revision, when it was recorded, and the revisions it lacks."""
    from sqlalchemy import inspect, select

    from dbcluster import migrations, schema
    from dbcluster.masking import safe_url

    def read() -> tuple[str | None, Any]:
        with engine.connect() as conn:
            version = migrations.current_version(conn)
            applied_time = None
            if inspect(conn).has_table(schema.schema_version.name):
                applied_time = conn.execute(select(schema.schema_version.c.applied_time)).scalar()
        return version, applied_time

    engine = open_engine(url)
    try:
        version, applied_time = ride_out(engine, read, "migrate")
    finally:
        engine.dispose()
    known = [r.revision for r in migrations.revisions()]
    return {
        "database": safe_url(url),
        "revision": version,
        "applied_time": applied_time,
        "head": migrations.HEAD,
        "known": version is None or version in known,
        "pending": known[known.index(version) + 1 :] if version in known else [],
    }


def _url(ctx: click.Context, url: str | None) -> str | None:
    return url or (ctx.obj or {}).get("url")


@migrate.command("current")
@click.option("--url", envvar="DBCLUSTER_URL", help=URL_HELP)
@connect_timeout_option()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def current(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """Print the dbcluster schema revision the database is at, and what migrate would apply."""
    from dbcluster import migrations
    from dbcluster.monitor import jsonable

    url = _url(ctx, url)
    if not url:
        raise click.UsageError("give --url URL (or set DBCLUSTER_URL)")
    state = _state(url)
    if as_json:
        click.echo(json.dumps(jsonable(state)))
        return
    version = state["revision"]
    if version is None:
        click.echo("no dbcluster tables: run `dbcluster init`")
        return
    if not state["known"]:
        click.echo(
            f"{version}: newer than this dbcluster knows (its newest is {migrations.HEAD}); "
            "upgrade dbcluster"
        )
        return
    revision = next(r for r in migrations.revisions() if r.revision == version)
    line = f"{version} (dbcluster {revision.release}): {revision.title}"
    if state["pending"]:
        count = len(state["pending"])
        line += f"; {count} revision(s) to apply ({', '.join(state['pending'])}): "
        line += "run `dbcluster migrate`"
    else:
        line += " (head)"
    click.echo(line)


@migrate.command("history")
@click.option(
    "--url",
    envvar="DBCLUSTER_URL",
    help=URL_HELP + " Marks which revisions the database has (none: no connection is made).",
)
@connect_timeout_option()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def history(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """List every schema revision, oldest first: its id, the one it follows, the dbcluster
    release that made it and what it does."""
    from dbcluster import migrations

    url = _url(ctx, url)
    state = _state(url) if url else None
    rows = []
    for r in migrations.revisions():
        row: dict[str, Any] = {
            "revision": r.revision,
            "down_revision": r.down_revision,
            "release": r.release,
            "title": r.title,
            "head": r.revision == migrations.HEAD,
        }
        if state is not None:
            row["applied"] = state["revision"] is not None and r.revision not in state["pending"]
            row["current"] = r.revision == state["revision"]
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows))
        return
    for row in rows:
        marks = [m for m in ("head", "current") if row.get(m)]
        if state is not None and not row["applied"]:
            marks.append("pending")
        parent = row["down_revision"] or "<base>"
        tail = f" ({', '.join(marks)})" if marks else ""
        click.echo(
            f"{parent} -> {row['revision']} (dbcluster {row['release']}){tail}: {row['title']}"
        )
