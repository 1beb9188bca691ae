"""How long a node that cannot take a stranded job over leaves it to the nodes that can."""

from __future__ import annotations

from typing import Any

import pytest

from dbcluster.cluster.maintenance import stranded
from dbcluster.cluster.maintenance.stranded import StrandedMasters
from dbcluster.testing.app import FAST_SETTINGS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _scanner(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> tuple[StrandedMasters, Clock]:
    clock = Clock()
    monkeypatch.setattr(stranded.time, "monotonic", clock)
    scanner = StrandedMasters(
        None,  # type: ignore[arg-type] - the policy reads only its settings
        None,  # type: ignore[arg-type]
        FAST_SETTINGS.with_overrides(**settings),
        None,  # type: ignore[arg-type]
        lambda: None,
    )
    return scanner, clock


def test_under_takeover_it_waits_a_cleanup_threshold_before_abandoning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three scans are not enough when the fault that took the master also took every node that
    could take over: a restarted or thawed one needs about a cleanup threshold to rejoin."""
    scanner, clock = _scanner(
        monkeypatch,
        master_failover="takeover",
        stranded_master_scan_interval=200,
        cleanup_threshold=4000,
    )
    assert not scanner._may_abandon(7)  # first seen now
    clock.now += 0.7  # past three scans (600 ms)
    assert not scanner._may_abandon(7)
    clock.now += 3.2  # 3.9 s
    assert not scanner._may_abandon(7)
    clock.now += 0.2  # 4.1 s
    assert scanner._may_abandon(7)
    assert not scanner._may_abandon(8)  # each job has its own clock


def test_three_scans_when_they_are_longer_and_at_once_under_abandon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scanner, clock = _scanner(
        monkeypatch,
        master_failover="takeover",
        stranded_master_scan_interval=2000,
        cleanup_threshold=4000,
    )
    assert not scanner._may_abandon(7)
    clock.now += 5.0
    assert not scanner._may_abandon(7)
    clock.now += 1.1
    assert scanner._may_abandon(7)
    scanner, _ = _scanner(monkeypatch, master_failover="abandon")
    assert scanner._may_abandon(7)
