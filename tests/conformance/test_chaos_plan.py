"""``dbcluster chaos --target``: the fault plan puts every fault where it was asked to."""

from __future__ import annotations

import pytest

from dbcluster.testing.chaos import (
    KINDS,
    MASTER_KINDS,
    WORKER_KINDS,
    plan_faults,
)


def _plan(on: str, seed: int = 3, faults: int = 14) -> list:
    return plan_faults(seed, faults, 4, 5, window=16.8, cleanup_ms=2500, unreachable_ms=1000, on=on)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_master_faults_fall_on_masters_and_use_every_kind_a_master_can_take(seed: int) -> None:
    plan = _plan("masters", seed)
    assert {f.target[0] for f in plan} == {"m"}
    assert {f.kind for f in plan} == set(KINDS) - set(WORKER_KINDS)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_worker_faults_fall_on_workers_only(seed: int) -> None:
    plan = _plan("workers", seed)
    assert {f.target[0] for f in plan} == {"w"}
    assert {f.kind for f in plan} == set(KINDS) - set(MASTER_KINDS)


def test_the_mixed_plan_hits_both_and_is_a_pure_function_of_its_arguments() -> None:
    plan = _plan("any")
    assert {f.target[0] for f in plan} == {"m", "w"}
    assert plan == _plan("any")
    assert [f.at for f in plan] == sorted(f.at for f in plan)


def test_an_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match="masters"):
        _plan("everyone")
