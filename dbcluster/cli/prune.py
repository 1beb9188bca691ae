"""``dbcluster prune``: delete finished job executions older than an age (see
:mod:`dbcluster.cluster.maintenance.pruner` for what stays)."""

from __future__ import annotations

import json

import click

from dbcluster.cli.engines import Tables, open_engine
from dbcluster.cli.options import connect_timeout_option


@click.command()
@click.option(
    "--url",
    envvar="DBCLUSTER_URL",
    required=True,
    help="SQLAlchemy database URL (or set DBCLUSTER_URL).",
)
@connect_timeout_option()
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Prune executions that ended longer ago than this (database clock): 30d, 12h, 90m.",
)
@click.option(
    "--keep-last",
    type=int,
    default=0,
    show_default=True,
    help="Keep the N newest executions of each job, whatever their age.",
)
@click.option(
    "--status",
    "statuses",
    help="Only executions in these finished statuses (comma-separated; default: every "
    "finished status: COMPLETED,STOPPED,FAILED,ABANDONED,UNKNOWN).",
)
@click.option(
    "--dry-run", is_flag=True, help="Print what would be deleted, per table; delete nothing."
)
@click.option(
    "--batch-size",
    type=int,
    default=500,
    show_default=True,
    help="Rows per statement and transaction (1 to 500).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def prune(
    url: str,
    older_than: str,
    keep_last: int,
    statuses: str | None,
    dry_run: bool,
    batch_size: int,
    as_json: bool,
) -> None:
    """Delete finished job executions that ended before now minus an age, with their steps,
    contexts, parameters, partitions and coordination rows, and the job instances left with no
    execution. Never an execution in flight, nor any execution of an instance whose newest
    execution did not complete (it may be restarted)."""
    from dbcluster.cluster.maintenance.pruner import PrunePolicy, Pruning, parse_statuses
    from dbcluster.cluster.settings import parse_age
    from dbcluster.cluster.store import CoordinationStore

    policy = PrunePolicy(
        older_than_ms=parse_age(older_than),
        keep_last=keep_last,
        statuses=parse_statuses(statuses),
        batch_size=batch_size,
    )
    engine = open_engine(url, Tables.PRESENT)
    try:
        pruning = Pruning(CoordinationStore(engine))
        result = pruning.dry_run(policy) if dry_run else pruning.prune(policy)
    finally:
        engine.dispose()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "executions": len(result.executions),
                    "rows": result.counts,
                    "seconds": round(result.seconds, 3),
                    "longest_transaction_s": round(result.longest_transaction_s, 3),
                }
            )
        )
        return
    from dbcluster.cluster.maintenance.pruner import TABLES

    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {len(result.executions)} job execution(s) in {result.seconds:.1f} s:")
    width = max(len(t) for t in TABLES)
    for table in TABLES:
        click.echo(f"  {table:<{width}}  {result.counts[table]:>10}")
