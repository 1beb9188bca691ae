"""The README example runs as printed and prints the correct total."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sum_by_range_example_prints_the_correct_total() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sum_by_range.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "total: 500000500000" in result.stdout
    assert result.stdout.rstrip().endswith("OK")
