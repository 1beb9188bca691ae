"""``dbcluster bench``."""

from __future__ import annotations

import json
import platform
import sys
import time
from typing import Any

import click

from dbcluster.errors import ConfigurationError


def _machine() -> dict[str, Any]:
    import os

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def _flatten(prefix: str, value: Any, out: list[tuple[str, str]]) -> None:
    """Dotted rows for the text report; ``*detail*`` keys are left to ``--json``."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if "detail" not in str(key):
                _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
    else:
        out.append((prefix, str(value)))


def _counts(option: str, value: str, example: str) -> tuple[int, ...]:
    try:
        found = tuple(int(n) for n in value.split(","))
    except ValueError:
        found = ()
    if not found or min(found) < 1:
        raise ConfigurationError(
            f"{option} must be positive integers like {example}, not {value!r}"
        )
    return found


@click.command()
@click.option(
    "--url", envvar="DBCLUSTER_URL", help="Database URL (default: a temporary SQLite file)."
)
@click.argument("scenarios", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--partitions", default=1000, show_default=True, help="overhead: no-op partitions.")
@click.option("--workers", default=4, show_default=True, help="overhead: worker processes.")
@click.option("--runs", default=50, show_default=True, help="latency: launches.")
@click.option("--idle-seconds", default=15.0, show_default=True, help="idle: measuring window.")
@click.option("--idle-nodes", default=4, show_default=True, help="idle: the N of N nodes.")
@click.option("--scale-nodes", default="2,5,10,20", show_default=True, help="scale: node counts.")
@click.option("--scale-partitions", default=400, show_default=True, help="scale: partitions.")
@click.option("--chunk-rows", default=1_000_000, show_default=True, help="chunk: table rows.")
@click.option(
    "--drain-partitions", default=2000, show_default=True, help="drain: one-INSERT partitions."
)
@click.option("--drain-workers", default=2, show_default=True, help="drain: worker processes.")
@click.option(
    "--drain-concurrency", default=4, show_default=True, help="drain: partitions per worker."
)
@click.option(
    "--baseline-threads",
    default=8,
    show_default=True,
    help="drain: threads of the hand-written baseline.",
)
@click.option(
    "--ceiling-nodes",
    default="50,200,500,1000",
    show_default=True,
    help="ceiling: simulated node counts.",
)
@click.option(
    "--ceiling-seconds", default=30.0, show_default=True, help="ceiling: measuring window."
)
@click.option(
    "--ceiling-processes",
    type=click.IntRange(min=1),
    help="ceiling: load-generator processes (default: one per core).",
)
@click.option(
    "--ceiling-threads",
    default=24,
    show_default=True,
    type=click.IntRange(min=1),
    help=(
        "ceiling: threads per load-generator process that run its simulated nodes' calls "
        "(more hide the database's latency, fewer contend less for the interpreter)."
    ),
)
@click.option(
    "--ceiling-maintenance",
    type=click.Choice(["every", "one"]),
    default="one",
    show_default=True,
    help="ceiling: one node (the lease holder) sweeps and scans for stranded masters, the "
    "others read the leases as a node that holds none does; or every node maintains (as "
    "before leased maintenance).",
)
@click.option(
    "--ceiling-listening/--no-ceiling-listening",
    default=True,
    show_default=True,
    help="ceiling: the simulated nodes' wake-ups arrive (PostgreSQL), or they poll as nodes "
    "without a listener do.",
)
@click.option(
    "--ceiling-plain-connections",
    "ceiling_plain",
    is_flag=True,
    help="ceiling: simulated nodes connect without session settings (lock and idle bounds) "
    "or server-side prepared statements, to reach PostgreSQL through PgBouncer in transaction "
    "mode.",
)
@click.option(
    "--counting/--no-counting",
    default=True,
    show_default=True,
    help="Repeat the partition scenarios through the round-trip counter (wire proxy, or "
    "SQLite's trace) for round trips and commits per partition.",
)
def bench(
    url: str | None,
    scenarios: tuple[str, ...],
    as_json: bool,
    partitions: int,
    workers: int,
    runs: int,
    idle_seconds: float,
    idle_nodes: int,
    scale_nodes: str,
    scale_partitions: int,
    chunk_rows: int,
    drain_partitions: int,
    drain_workers: int,
    drain_concurrency: int,
    baseline_threads: int,
    ceiling_nodes: str,
    ceiling_seconds: float,
    ceiling_processes: int | None,
    ceiling_threads: int,
    ceiling_maintenance: str,
    ceiling_listening: bool,
    ceiling_plain: bool,
    counting: bool,
) -> None:
    """Measure coordination cost, latency, failover time and the ceiling on your database.

    SCENARIOS: overhead, drain, latency, failover, idle, scale, chunk, ceiling (default: all).

    Timings come from direct runs; round trips (every one the driver makes: BEGIN, COMMIT,
    ROLLBACK, pings, each row sent on its own) from a second, counting pass of the same sizes
    through a wire-protocol proxy (PostgreSQL, MySQL, MariaDB) or SQLite's statement trace.
    The ceiling scenario reads the server's own counters instead."""
    from dbcluster.bench.scenarios import SCENARIOS, Params
    from dbcluster.dialects import provider_for_url, safe_url

    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise ConfigurationError(
            f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}"
        )
    if url is not None:
        provider_for_url(url)  # a clear error for a bad URL before anything starts
    nodes = _counts("--scale-nodes", scale_nodes, "2,5,10,20")
    simulated = _counts("--ceiling-nodes", ceiling_nodes, "50,200,500,1000")
    params = Params(
        partitions=partitions,
        workers=workers,
        latency_runs=runs,
        idle_seconds=idle_seconds,
        idle_nodes=idle_nodes,
        scale_nodes=nodes,
        scale_partitions=scale_partitions,
        chunk_rows=chunk_rows,
        drain_partitions=drain_partitions,
        drain_workers=drain_workers,
        drain_concurrency=drain_concurrency,
        baseline_threads=baseline_threads,
        ceiling_nodes=simulated,
        ceiling_seconds=ceiling_seconds,
        ceiling_threads=ceiling_threads,
        ceiling_maintenance=ceiling_maintenance,
        ceiling_listening=ceiling_listening,
        ceiling_plain=ceiling_plain,
        counting=counting,
    )
    if ceiling_processes is not None:
        params.ceiling_processes = ceiling_processes
    chosen = list(scenarios) or list(SCENARIOS)
    report: dict[str, Any] = {
        "database": safe_url(url) if url else "sqlite (temporary file)",
        "machine": _machine(),
        "scenarios": {},
    }
    for name in chosen:
        click.echo(f"running {name} ...", err=True)
        started = time.perf_counter()
        figures = SCENARIOS[name](url, params)
        figures["scenario_wall_s"] = round(time.perf_counter() - started, 1)
        report["scenarios"][name] = figures
        if not as_json:
            rows: list[tuple[str, str]] = []
            _flatten("", figures, rows)
            click.echo(f"\n== {name}")
            width = max(len(k) for k, _ in rows)
            for key, value in rows:
                click.echo(f"  {key:<{width}}  {value}")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    sys.stdout.flush()
