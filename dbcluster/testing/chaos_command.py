"""The ``dbcluster chaos`` command: its options, over :func:`dbcluster.testing.chaos.run_chaos`."""

from __future__ import annotations

import json

import click

from dbcluster.cli.options import DURATION_MS, DURATION_S, chosen_level, log_options
from dbcluster.testing.chaos import format_summary, run_chaos
from dbcluster.testing.chaos_plan import ALL_KINDS, TARGETS
from dbcluster.testing.dbfaults import DbControl


def _kinds_option(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = [k for k in kinds if k not in ALL_KINDS]
    if unknown or not kinds:
        raise click.BadParameter(
            f"unknown kind(s) {', '.join(unknown) or '(none)'}; known: {', '.join(ALL_KINDS)}"
        )
    return kinds


@click.command("chaos")
@click.option(
    "--url",
    "urls",
    envvar="DBCLUSTER_URL",
    required=True,
    multiple=True,
    help="A scratch database URL. Give it once per server to spread the nodes over the "
    "servers of one cluster (Galera nodes): worker i and job j's master use URL i (or j) "
    "modulo their number; the run's own checks use the first.",
)
@click.option("--nodes", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--jobs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--faults", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--window", type=DURATION_S, help="How long faults keep falling (default: auto; bare: s)."
)
@click.option(
    "--delay-ms", type=DURATION_MS, default="3000", show_default=True, help="Partition run time."
)
@click.option("--settle-timeout", type=DURATION_S, default="240", show_default=True)
@click.option("--workdir", type=click.Path(file_okay=False), help="Node logs go here.")
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default="any",
    show_default=True,
    help="Which processes the faults fall on: masters only, workers only, or both.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Partitions each node runs at once (few slots and short partitions: slots hand "
    "themselves on, partition after partition).",
)
@click.option(
    "--kinds",
    callback=lambda _ctx, _param, value: _kinds_option(value),
    help=f"Comma-separated fault kinds to plan, of: {', '.join(ALL_KINDS)} (default: the "
    "node kinds, and each database kind whose command is given).",
)
@click.option(
    "--db-restart",
    metavar="COMMAND",
    help="Kind dbrestart: a command that restarts the database and returns once it takes "
    "writes again, e.g. 'ci/ha.sh pg restart 3'.",
)
@click.option(
    "--db-crash",
    metavar="COMMAND",
    help="Kind dbcrash: a command that crashes the database (kill -9, or stop -m immediate) "
    "and starts it again, e.g. 'ci/ha.sh pg crash 3'.",
)
@click.option(
    "--db-switchover",
    metavar="COMMAND",
    help="Kind switchover: a command that moves the primary to a standby (nodes reach it "
    "through a multi-host URL), e.g. 'ci/ha.sh pg switchover --rebuild'.",
)
@click.option(
    "--db-kill",
    metavar="COMMAND",
    help="Kind galera-kill: a command that kills the server of URL {node} (1-based; never "
    "the first), e.g. 'ci/ha.sh galera kill {node}'.",
)
@click.option(
    "--db-rejoin",
    metavar="COMMAND",
    help="With --db-kill: a command that starts server {node} again and returns once it has "
    "rejoined, e.g. 'ci/ha.sh galera rejoin {node}'.",
)
@click.option(
    "--node-env",
    multiple=True,
    metavar="NAME=VALUE",
    help="A setting for every node process (e.g. DBCLUSTER_CLEANUP_THRESHOLD=20000), over the "
    "run's short defaults.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@log_options()
def chaos(
    urls: tuple[str, ...],
    nodes: int,
    jobs: int,
    faults: int,
    seed: int,
    window: float | None,
    delay_ms: int,
    settle_timeout: float,
    workdir: str | None,
    target: str,
    concurrency: int,
    kinds: tuple[str, ...] | None,
    db_restart: str | None,
    db_crash: str | None,
    db_switchover: str | None,
    db_kill: str | None,
    db_rejoin: str | None,
    node_env: tuple[str, ...],
    as_json: bool,
    log_level: str | None,
    log_format: str,
    verbose: bool,
) -> None:
    """Run nodes on URL, inject seeded faults, check every invariant (exit 0 only if all held).

    URL must be a scratch database: the dbcluster and test tables are created in it."""
    import logging
    import sys

    from dbcluster import logs
    from dbcluster.monitor import jsonable

    logs.configure(chosen_level(log_level, verbose), log_format)
    progress = logging.getLogger("dbcluster.chaos")

    def say(message: str) -> None:
        progress.info("%s", message)

    env = {"DBCLUSTER_CONCURRENCY_LIMIT": str(concurrency)}
    for item in node_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--node-env")
        env[name] = value
    control = DbControl(db_restart, db_crash, db_switchover, db_kill, db_rejoin)
    missing = control.missing(kinds or ())
    if missing:
        raise click.UsageError("; ".join(missing))
    if kinds and "galera-kill" in kinds and len(urls) < 2:
        raise click.UsageError(
            "galera-kill needs --url once per Galera node (it never kills the first)"
        )
    summary = run_chaos(
        list(urls),
        nodes=nodes,
        jobs=jobs,
        faults=faults,
        seed=seed,
        window=window,
        delay_ms=delay_ms,
        settle_timeout=settle_timeout,
        workdir=workdir,
        log=say,
        target=target,
        env=env,
        kinds=kinds,
        db_control=control,
    )
    if as_json:
        click.echo(json.dumps(jsonable(summary), default=str, indent=2))
    else:
        click.echo(format_summary(summary))
    sys.exit(0 if summary["ok"] else 1)
