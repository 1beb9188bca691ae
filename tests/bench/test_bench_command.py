"""`dbcluster bench` runs its scenarios end to end (tiny sizes; the figures are not judged here:
benchmarks print numbers, they are not timed tests). Only what must hold whatever the machine is
asserted: jobs complete, rows are written, the counters count, limits are detected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

#: Short intervals so that the tiny runs finish in seconds (the scenarios take their settings
#: from the environment, like a node).
FAST = {
    "DBCLUSTER_HEARTBEAT_INTERVAL": "500",
    "DBCLUSTER_TASK_POLLING_INTERVAL": "100",
    "DBCLUSTER_SWEEP_INTERVAL": "1000",
    "DBCLUSTER_STRANDED_MASTER_SCAN_INTERVAL": "1000",
}


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def bench_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_bench(*args, "--json", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    scenarios: dict[str, Any] = json.loads(result.stdout)["scenarios"]
    return scenarios


def test_bench_overhead_and_chunk_print_json_on_sqlite() -> None:
    report = bench_json(
        "overhead", "chunk", "--partitions", "40", "--workers", "2", "--chunk-rows", "5000"
    )
    overhead = report["overhead"]
    assert overhead["local"]["status"] == overhead["cluster"]["status"] == "COMPLETED"
    assert overhead["cluster"]["partitions_per_s"] > 0
    assert overhead["extra_statements_per_partition"] > 0
    # The counting pass: SQLite's trace in this process and in the workers.
    assert overhead["cluster"]["round_trips_per_partition"] > 0
    assert overhead["cluster"]["commits_per_partition"] >= 1
    assert "sqlite3's statement trace" in overhead["round_trips"]["cluster"]["source"]
    chunk = report["chunk"]
    assert chunk["status"] == "COMPLETED" and chunk["totals_agree"] is True


def _check_drain(drain: dict[str, Any], partitions: int) -> None:
    framework, baseline = drain["framework"], drain["baseline"]
    assert framework["status"] == "COMPLETED"
    assert framework["rows_written"] == baseline["rows_written"] == partitions
    assert framework["partitions_per_s"] > 0 and baseline["rows_per_s"] > 0
    assert drain["ratio_framework_to_baseline"] > 0
    # The baseline is one INSERT and one COMMIT per row at least. The framework's partitions may
    # share a COMMIT (grouped commits, up to commit_group_size=8 of them), never an INSERT.
    assert baseline["commits_per_row"] == 1.0
    assert 2 <= baseline["round_trips_per_row"] < 4
    assert framework["commits_per_partition"] >= 1 / 8
    assert framework["round_trips_per_partition"] >= 1
    by_kind = drain["round_trips"]["framework"]["per_partition"]["by_kind"]
    assert by_kind["insert"] >= 1 and by_kind["commit"] >= 1 / 8
    assert drain["round_trips"]["framework"]["workers_per_partition"]["round_trips"] > 0


def _check_ceiling(ceiling: dict[str, Any], nodes: int) -> None:
    figures = ceiling[f"nodes_{nodes}"]
    assert figures["errors"] == 0, figures.get("first_error")
    assert figures["limit"]  # where the limit is, or that it was not reached
    generator = figures["load_generator"]
    assert generator["threads_per_process"] >= 1
    assert set(generator["start_lag_ms"]) == {"p50", "p95", "p99", "max"}
    assert figures["cadence_ms"]["heartbeat_ms"] == int(FAST["DBCLUSTER_HEARTBEAT_INTERVAL"])
    assert figures["store_calls_per_s"] > 0
    assert set(figures["heartbeat_ms"]) == {"p50", "p95", "p99", "max"}
    assert figures["poll_ms"]["p50"] > 0
    server = figures["server"]  # PostgreSQL counts statements only with pg_stat_statements
    assert (server["statements_per_s"] or server["transactions_per_s"]) > 0
    assert figures["missed_intervals"]["heartbeat"]["of"] > 0


def test_bench_drain_and_ceiling_on_sqlite() -> None:
    report = bench_json(
        "drain",
        "ceiling",
        "--drain-partitions",
        "30",
        "--ceiling-nodes",
        "3",
        "--ceiling-seconds",
        "2",
        env=FAST,
    )
    _check_drain(report["drain"], 30)
    # SQLite: BEGIN, INSERT, COMMIT, exactly (the trace sees the library's every statement).
    assert report["drain"]["baseline"]["round_trips_per_row"] == 3.0
    _check_ceiling(report["ceiling"], 3)
    assert report["ceiling"]["server_max_connections"] is None


@pytest.mark.parametrize(
    "env_var",
    ["DBCLUSTER_TEST_POSTGRESQL_URL", "DBCLUSTER_TEST_MARIADB_URL"],
    ids=["pg", "mariadb"],
)
def test_bench_drain_and_ceiling_on_a_server(env_var: str) -> None:
    """Through the wire proxy; the ceiling reads the server's counters and its connection
    limit, and reports a node count that does not fit as skipped, not as a pass."""
    url = os.environ.get(env_var)
    if not url:
        pytest.skip(f"{env_var} is not set")
    report = bench_json(
        "drain",
        "ceiling",
        "--url",
        url,
        "--drain-partitions",
        "30",
        "--ceiling-nodes",
        "3,100000",
        "--ceiling-seconds",
        "2",
        env=FAST,
    )
    _check_drain(report["drain"], 30)
    assert "wire-protocol proxy" in report["drain"]["round_trips"]["framework"]["source"]
    ceiling = report["ceiling"]
    _check_ceiling(ceiling, 3)
    limit = ceiling["server_max_connections"]
    assert ceiling["nodes_100000"]["skipped"].startswith(
        f"server max_connections={limit}; raise it to run 100000 nodes"
    )


def test_bench_idle_on_postgresql_costs_less_than_its_baseline() -> None:
    """Counted on the wire: an idle node's heartbeats carry its polls (one round trip each),
    against a hand-written node that sends both apart, in the same run."""
    url = os.environ.get("DBCLUSTER_TEST_POSTGRESQL_URL")
    if not url:
        pytest.skip("DBCLUSTER_TEST_POSTGRESQL_URL is not set")
    report = bench_json("idle", "--url", url, "--idle-seconds", "3", "--idle-nodes", "2", env=FAST)[
        "idle"
    ]
    baseline = report["baseline"]
    # Heartbeat every 0.5 s, poll every 0.1 s: 12 round trips a second.
    assert baseline["round_trips_per_s"] >= 10, baseline
    # A lone node holds the maintenance leases: its heartbeats (2 a second, each carrying a
    # poll), its lease renewals (2 a second) and its maintenance (a sweep check, a
    # stranded-master scan and a restart scan a second): about 7, well under the baseline.
    alone = report["nodes_1"]
    assert alone["round_trips_per_s_per_node"] < baseline["round_trips_per_s"] * 0.75, alone
    # Of two, the other holds no lease: its heartbeats carry its polls and its look for a
    # lapsed lease (2 a second), which halves the average.
    two = report["nodes_2"]
    assert two["round_trips_per_s_per_node"] < baseline["round_trips_per_s"] / 2, two


def test_bench_rejects_an_unknown_scenario() -> None:
    result = run_bench("nonsense")
    assert result.returncode == 2
    assert "unknown scenario" in result.stderr and "Traceback" not in result.stderr


def test_bench_rejects_bad_node_counts() -> None:
    result = run_bench("ceiling", "--ceiling-nodes", "50,zero")
    assert result.returncode == 2
    assert "--ceiling-nodes must be positive integers" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "env_var",
    [None, "DBCLUSTER_TEST_POSTGRESQL_URL", "DBCLUSTER_TEST_MARIADB_URL"],
    ids=["sqlite", "pg", "mariadb"],
)
def test_bench_latency_reads_the_start_at_the_partitions_body(env_var: str | None) -> None:
    """Launch -> the body's own clock comes after launch -> the start its claim recorded, and
    both are plausible (a start time stored with too little precision is off by minutes)."""
    url = os.environ.get(env_var) if env_var else None
    if env_var and not url:
        pytest.skip(f"{env_var} is not set")
    latency = bench_json("latency", "--runs", "3", *(("--url", url) if url else ()), env=FAST)[
        "latency"
    ]
    body, recorded = latency["launch_to_partition_start_ms"], latency["launch_to_start_recorded_ms"]
    assert 0 <= recorded["median"] <= body["median"] < 10_000, latency
    assert body["median"] <= latency["launch_to_job_complete_ms"]["median"], latency
    # Where the time went: every launch reached the master's commit and the body, through a
    # claim or, on PostgreSQL, as the wake-up carried it (its transactional step runs on an
    # idle node before a claim: cluster/placed.py); only PostgreSQL wakes the worker
    # (elsewhere a poll finds the partition, and on PostgreSQL too when a poll finds it first,
    # e.g. before the listener is up). A worker's marks of a launch come before its body; the
    # master's commit before its launch returns. Each stage of a launch within a total of the
    # same launch: its median is at most that total's.
    # (tests/cluster/test_idle_cost.py checks that a listening worker reaches the wake-up's
    # point; here a worker whose listener was not up yet found every launch by a poll.)
    stages = latency["stages"]
    claimed = {"claim", "claimed_to_body"}
    allowed = {"launch_to_created", *claimed}
    if env_var == "DBCLUSTER_TEST_POSTGRESQL_URL":
        allowed |= {"launch_to_offered", "offered_to_claim_sent"}
        allowed |= {"offered_to_placed_run", "placed_run_to_body"}
    assert "launch_to_created" in stages and set(stages) <= allowed, stages
    assert claimed <= set(stages) or "placed_run_to_body" in stages, stages
    assert stages["launch_to_created"]["n"] == 3, stages
    complete = latency["launch_to_job_complete_ms"]["median"]
    for name, stage in stages.items():
        assert 1 <= stage["n"] <= 3, (name, stages)
        bound = complete if name == "launch_to_created" else body["median"]
        assert 0 <= stage["median_ms"] <= bound + 0.1, (name, latency)
