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
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
    else:
        out.append((prefix, str(value)))


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
) -> None:
    """Measure coordination cost, latency, failover time and the ceiling on your database.

    SCENARIOS: overhead, latency, failover, idle, scale, chunk (default: all)."""
    from dbcluster.bench.scenarios import SCENARIOS, Params
    from dbcluster.dialects import provider_for_url, safe_url

    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise ConfigurationError(
            f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}"
        )
    if url is not None:
        provider_for_url(url)  # a clear error for a bad URL before anything starts
    try:
        nodes = tuple(int(n) for n in scale_nodes.split(","))
    except ValueError:
        raise ConfigurationError(
            f"--scale-nodes must be integers like 2,5,10,20, not {scale_nodes!r}"
        ) from None
    params = Params(
        partitions=partitions,
        workers=workers,
        latency_runs=runs,
        idle_seconds=idle_seconds,
        idle_nodes=idle_nodes,
        scale_nodes=nodes,
        scale_partitions=scale_partitions,
        chunk_rows=chunk_rows,
    )
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
            _flatten("", {k: v for k, v in figures.items() if "detail" not in k}, rows)
            click.echo(f"\n== {name}")
            width = max(len(k) for k, _ in rows)
            for key, value in rows:
                click.echo(f"  {key:<{width}}  {value}")
    if as_json:
        click.echo(json.dumps(report, indent=2))
    sys.stdout.flush()
