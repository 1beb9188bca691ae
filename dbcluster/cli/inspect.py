"""Looking at the cluster from the command line: ``dbcluster status``, ``jobs`` and ``job``
(read-only; the dashboard, ``dbcluster web``, shows the same)."""

from __future__ import annotations

from typing import Any

import click

from dbcluster.cli.engines import Tables, open_engine, ride_out
from dbcluster.cli.options import url_option
from dbcluster.cli.output import echo_json, print_renderables


def _job_json(row: Any) -> dict[str, Any]:
    from dbcluster.monitor import jsonable

    return {**jsonable(row), "partitions_total": row.partitions_total}


@click.command()
@url_option()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(url: str, as_json: bool) -> None:
    """The nodes (heartbeat age from the database clock) and the jobs in flight."""
    from dbcluster.monitor import cluster_status
    from dbcluster.views import status_tables

    engine = open_engine(url, Tables.CURRENT)
    try:
        found = ride_out(engine, lambda: cluster_status(engine), "status")
    finally:
        engine.dispose()
    if as_json:
        echo_json(
            {
                "db_now": found.db_now,
                "nodes": found.nodes,
                "jobs": [_job_json(j) for j in found.jobs],
            }
        )
    else:
        print_renderables(status_tables(found))


@click.command()
@url_option()
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--job", "job_name", help="Only executions of this job.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def jobs(url: str, limit: int, job_name: str | None, as_json: bool) -> None:
    """Recent job executions, newest first."""
    from dbcluster.monitor import recent_jobs
    from dbcluster.views import jobs_table

    engine = open_engine(url, Tables.CURRENT)
    try:
        rows = ride_out(engine, lambda: recent_jobs(engine, limit, job_name), "jobs")
    finally:
        engine.dispose()
    if as_json:
        echo_json([_job_json(j) for j in rows])
    else:
        print_renderables([jobs_table(rows)])


@click.command("job")
@url_option()
@click.argument("execution_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def job_command(url: str, execution_id: int, as_json: bool) -> None:
    """One job execution: its partitions (node, status, attempt, last update) and steps."""
    from dbcluster.monitor import job_detail, jsonable
    from dbcluster.views import job_renderables

    engine = open_engine(url, Tables.CURRENT)
    try:
        detail = ride_out(engine, lambda: job_detail(engine, execution_id), "job")
    finally:
        engine.dispose()
    if as_json:
        echo_json({**jsonable(detail), "partition_counts": detail.partition_counts})
    else:
        print_renderables(job_renderables(detail))
