"""The test settings' thresholds follow DBCLUSTER_TEST_TIME_SCALE (read once, at import)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PRINT = (
    "from dbcluster.testing.app import FAST_SETTINGS as s; "
    "print(s.heartbeat_interval, s.unreachable_threshold, s.cleanup_threshold, "
    "s.task_polling_interval, s.idle_transaction_ms)"
)


def _settings_under(scale: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DBCLUSTER_TEST_TIME_SCALE", None)
    if scale is not None:
        env["DBCLUSTER_TEST_TIME_SCALE"] = scale
    return subprocess.run(
        [sys.executable, "-c", _PRINT], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("scale", "expected"),
    [(None, "100 500 1000 50 500"), ("1", "100 500 1000 50 500"), ("2", "100 1000 2000 50 1000")],
)
def test_the_scale_stretches_the_thresholds_not_the_intervals(
    scale: str | None, expected: str
) -> None:
    done = _settings_under(scale)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == expected.split()


@pytest.mark.parametrize("scale", ["fast", "0.5", "nan", "inf"])
def test_a_scale_that_is_not_a_number_of_at_least_one_is_refused(scale: str) -> None:
    done = _settings_under(scale)
    assert done.returncode != 0
    assert "DBCLUSTER_TEST_TIME_SCALE must be" in done.stderr


def test_the_scale_stretches_the_default_wait_not_a_named_one() -> None:
    env = {**os.environ, "DBCLUSTER_TEST_TIME_SCALE": "3"}
    code = (
        "import time\n"
        "from dbcluster.testing import waiting\n"
        "print(waiting.DEFAULT_WAIT_S)\n"
        "began = time.monotonic()\n"
        "try:\n"
        "    waiting.wait_for(lambda: False, timeout=0.2)\n"
        "except TimeoutError:\n"
        "    print(round(time.monotonic() - began, 1))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    default_s, named_s = map(float, done.stdout.split())
    assert default_s == 45.0
    assert 0.2 <= named_s < 1.0
