"""When a master looks at its partitions next (:class:`CheckPace`)."""

from __future__ import annotations

from dbcluster.cluster.handler import CheckPace


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


def test_capped_at_the_check_interval() -> None:
    pace = CheckPace(5, 500)
    pace.next_ms(10_000, 0.0)
    assert pace.next_ms(9_990, 0.1) == 500
