"""The examples run in one process as their docstrings say and check their own results (each
also runs on a cluster of worker processes: tests/cli/test_examples_on_a_cluster.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run_example(name: str, timeout: float) -> str:
    """The example's stdout, once it exited 0 and said OK."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.rstrip().endswith("OK"), result.stdout
    return result.stdout


def test_hello_example_counts_the_primes_below_200000() -> None:
    out = _run_example("hello.py", 120)
    assert "job status: COMPLETED; primes below 200,000: 17984" in out, out


def test_sum_by_range_example_prints_the_correct_total() -> None:
    assert "total: 500000500000" in _run_example("sum_by_range.py", 300)


def test_nightly_flow_example_takes_the_big_day_branch_and_checks_its_totals() -> None:
    out = _run_example("nightly_flow.py", 120)
    first, second, *_ = out.splitlines()
    assert first == (
        "COMPLETED: prepare (COMPLETED) -> load (COMPLETED) -> volume (BIG) -> "
        "big-day (COMPLETED) -> report (COMPLETED)"
    ), out
    assert second == "4 partitions, 9 step executions", out
    assert "exported 5000 orders" in out
