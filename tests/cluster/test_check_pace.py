"""When a master looks at its partitions next (:class:`CheckPace`), and when first."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.handler import FIRST_CHECK_MS, CheckPace, ClusterPartitionHandler
from dbcluster.testing import points
from dbcluster.testing.app import FAST_SETTINGS
from dbcluster.testing.backends import Backend


def test_doubles_from_the_first_look_while_nothing_ends() -> None:
    pace = CheckPace(5, 500)
    pauses = [pace.next_ms(8, t / 1000) for t in (0, 5, 15, 35, 75, 155, 315, 815)]
    assert pauses == [5, 10, 20, 40, 80, 160, 320, 500]


def test_looks_at_half_the_time_the_rest_needs_at_the_pace_seen() -> None:
    pace = CheckPace(5, 500)
    assert pace.next_ms(1000, 0.0) == 5
    # 100 ended in 100 ms: the 900 left need 900 ms; look again at half that.
    assert pace.next_ms(900, 0.1) == 450
    # 800 more in 500 ms: the last 100 need 62.5 ms; look again at half that.
    assert pace.next_ms(100, 0.6) == 31.25
    # The end is near: never sooner than the first look's pause.
    assert pace.next_ms(1, 0.631) == 5


def test_no_progress_falls_back_to_doubling_and_errors_back_off() -> None:
    pace = CheckPace(5, 40)
    assert pace.next_ms(10, 0.0) == 5
    assert pace.next_ms(10, 0.005) == 10
    assert pace.backoff_ms() == 20
    assert pace.backoff_ms() == 40
    assert pace.backoff_ms() == 40


def test_a_look_that_finds_none_ended_since_waits_twice_its_last_pause() -> None:
    """Partitions were ending (a group commits several at once): a look between two groups
    finds none ended since, and the next waits twice the pause before it, not the doubling the
    looks grew meanwhile (500 ms by then: a drain's end was seen up to half a second late)."""
    pace = CheckPace(5, 500)
    assert pace.next_ms(1024, 0.0) == 5
    # One ended a millisecond, all along: look at half the time the rest needs.
    looks = [(0.512, 512), (0.768, 256), (0.896, 128), (0.960, 64), (0.992, 32), (1.008, 16)]
    assert [pace.next_ms(left, at) for at, left in looks] == pytest.approx(
        [256, 128, 64, 32, 16, 8]
    )
    assert pace.next_ms(8, 1.016) == 5
    # The last 8 are one group, still running: none ended since the last look.
    assert pace.next_ms(8, 1.021) == pytest.approx(10)
    assert pace.next_ms(8, 1.031) == pytest.approx(20)
    # Measured from the last look that found some ended: 4 in 35 ms.
    assert pace.next_ms(4, 1.051) == pytest.approx(17.5)
    # Errors still back off on the doubling.
    assert pace.backoff_ms() == 10


def test_capped_at_the_check_interval() -> None:
    pace = CheckPace(5, 500)
    pace.next_ms(10_000, 0.0)
    assert pace.next_ms(9_990, 0.1) == 500


def test_a_master_first_looks_at_what_it_just_placed_after_a_pause_and_checks_no_orphans(
    backend: Backend, make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partitions a master has just placed, on nodes it read as live, can neither have ended nor
    have been orphaned: its first look waits the first pause, and its first orphan check a whole
    ``orphan_check_interval``, so no statement of the master's competes with the workers that
    are claiming and starting them."""
    settings = FAST_SETTINGS.with_overrides(orphan_check_interval=60_000)
    master = make_cluster(settings, work=False)
    make_cluster(settings)
    created: list[float] = []
    looks: list[float] = []
    orphan_checks: list[int] = []
    recover = ClusterPartitionHandler._recover_orphans

    def counted(self: ClusterPartitionHandler, *args: Any, **kwargs: Any) -> Any:
        orphan_checks.append(1)
        return recover(self, *args, **kwargs)

    def on_created(**_: Any) -> None:
        created.append(time.monotonic())

    def on_look(**_: Any) -> None:
        looks.append(time.monotonic())

    monkeypatch.setattr(ClusterPartitionHandler, "_recover_orphans", counted)
    points.install("master.after_create_execution", on_created)
    points.install("master.monitor", on_look)
    try:
        execution = master.launch("ledger", {"run": 1})
    finally:
        points.remove("master.after_create_execution", on_created)
        points.remove("master.monitor", on_look)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert created and looks
    assert looks[0] - created[0] >= FIRST_CHECK_MS / 1000
    assert orphan_checks == []
