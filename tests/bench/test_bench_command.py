"""`dbcluster bench` runs its scenarios end to end (tiny sizes; the figures are not judged here:
benchmarks print numbers, they are not timed tests)."""

from __future__ import annotations

import json
import subprocess
import sys


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_bench_overhead_and_chunk_print_json_on_sqlite() -> None:
    result = run_bench(
        "overhead",
        "chunk",
        "--partitions",
        "40",
        "--workers",
        "2",
        "--chunk-rows",
        "5000",
        "--json",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    overhead = report["scenarios"]["overhead"]
    assert overhead["local"]["status"] == overhead["cluster"]["status"] == "COMPLETED"
    assert overhead["cluster"]["partitions_per_s"] > 0
    assert overhead["extra_statements_per_partition"] > 0
    chunk = report["scenarios"]["chunk"]
    assert chunk["status"] == "COMPLETED" and chunk["totals_agree"] is True


def test_bench_rejects_an_unknown_scenario() -> None:
    result = run_bench("nonsense")
    assert result.returncode == 2
    assert "unknown scenario" in result.stderr and "Traceback" not in result.stderr
