"""The one retry primitive (dbcluster.retry), on an injected clock: no test here waits."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dbcluster.retry import Retry, warn_once


class Blip(Exception):
    """Worth another try."""


class Bug(Exception):
    """Not worth another try."""


class Clock:
    """A clock that only moves when the policy sleeps (or a test says so)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _policy(clock: Clock, **fields: object) -> Retry:
    settings: dict[str, object] = {
        "clock": clock,
        "sleep": clock.sleep,
        "draw": lambda: 0.5,  # the middle of the jitter: the pause itself
    }
    settings.update(fields)
    return Retry(lambda e: isinstance(e, Blip), **settings)  # type: ignore[arg-type]


def _failing(times: int, error: Exception, result: str = "done") -> Callable[[], str]:
    calls: list[int] = []

    def work() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return result

    work.calls = calls  # type: ignore[attr-defined]
    return work


def test_a_blip_is_tried_again_until_the_work_succeeds() -> None:
    clock = Clock()
    work = _failing(3, Blip("lost connection"))
    assert _policy(clock, attempts=5).call(work, "read") == "done"
    assert len(work.calls) == 4  # type: ignore[attr-defined]
    assert clock.slept == [0.05, 0.1, 0.2]


def test_an_error_not_worth_another_try_is_raised_at_once() -> None:
    clock = Clock()
    work = _failing(1, Bug("no such column"))
    with pytest.raises(Bug):
        _policy(clock, attempts=5).call(work)
    assert len(work.calls) == 1 and clock.slept == []  # type: ignore[attr-defined]


def test_attempts_count_the_first_try_and_the_last_error_is_raised() -> None:
    clock = Clock()
    work = _failing(10, Blip("still down"))
    with pytest.raises(Blip, match="still down"):
        _policy(clock, attempts=3).call(work)
    assert len(work.calls) == 3 and len(clock.slept) == 2  # type: ignore[attr-defined]


def test_pauses_grow_up_to_their_cap_and_jitter_spreads_them() -> None:
    clock = Clock()
    _policy(clock, attempts=6, pause_s=0.1, max_pause_s=0.3).call(_failing(5, Blip()))
    assert clock.slept == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.3])
    for draw, factor in ((0.0, 0.5), (0.999999, 1.5)):
        clock = Clock()
        _policy(clock, attempts=2, pause_s=0.2, draw=lambda d=draw: d).call(_failing(1, Blip()))
        assert clock.slept == pytest.approx([0.2 * factor])


def test_every_waits_the_same_pause_without_jitter() -> None:
    clock = Clock()
    policy = Retry.every(
        0.5, lambda e: isinstance(e, Blip), clock=clock, sleep=clock.sleep, draw=lambda: 0.99
    )
    assert policy.call(_failing(4, Blip())) == "done"
    assert clock.slept == [0.5, 0.5, 0.5, 0.5]


def test_the_deadline_counts_from_the_first_error_not_from_the_first_try() -> None:
    """Time the work spent before its first error (a long step, a stopped process) does not use
    up the deadline: it is still tried again."""
    clock = Clock()
    calls: list[int] = []

    def slow_then_blip() -> str:
        calls.append(1)
        if len(calls) == 1:
            clock.now += 60  # far longer than the deadline, before the first error
            raise Blip("lost connection during query")
        return "done"

    assert _policy(clock, deadline_s=1.0).call(slow_then_blip) == "done"
    assert len(calls) == 2


def test_repetitions_end_at_the_deadline() -> None:
    clock = Clock()
    work = _failing(10**6, Blip("still down"))
    with pytest.raises(Blip):
        _policy(clock, deadline_s=1.0, pause_s=0.25, growth=1.0).call(work)
    # Tries at 0, 0.25, 0.5, 0.75 and 1.0 s: at the deadline the last error is raised.
    assert len(work.calls) == 5  # type: ignore[attr-defined]
    assert clock.now == 101.0


def test_give_up_is_asked_before_each_repetition() -> None:
    clock = Clock()
    fenced: list[bool] = []
    work = _failing(10, Blip())

    def give_up() -> bool:
        fenced.append(len(work.calls) >= 2)  # type: ignore[attr-defined]
        return fenced[-1]

    with pytest.raises(Blip):
        _policy(clock, give_up=give_up).call(work)
    assert len(work.calls) == 2 and fenced == [False, True]  # type: ignore[attr-defined]


def test_on_retry_hears_of_each_repetition_and_warn_once_warns_once(caplog) -> None:
    clock = Clock()
    heard: list[tuple[str, int, str]] = []
    _policy(clock, on_retry=lambda what, n, e: heard.append((what, n, str(e)))).call(
        _failing(2, Blip("down")), "claim"
    )
    assert heard == [("claim", 1, "down"), ("claim", 2, "down")]

    import logging

    logger = logging.getLogger("dbcluster.test_retry")
    with caplog.at_level(logging.WARNING, logger="dbcluster.test_retry"):
        _policy(clock, on_retry=warn_once(logger)).call(
            _failing(3, Blip("refused")), "master n1 cannot place"
        )
    assert [r.getMessage() for r in caplog.records] == ["master n1 cannot place yet: Blip: refused"]


def test_a_run_shares_its_deadline_with_a_verification_started_from_it() -> None:
    """A transaction whose commit was unclear verifies it until the deadline its repetitions
    started (batch.Transactions): a second run started with that deadline ends with it."""
    clock = Clock()
    policy = _policy(clock, deadline_s=1.0, pause_s=0.25, growth=1.0)
    run = policy.start("step")
    assert run.accepts(Blip()) and run.deadline == pytest.approx(101.0)
    verifying = policy.but(attempts=None).start("step", deadline=run.deadline)
    tries = 0
    while verifying.again(Blip()):
        tries += 1
    assert tries == 4 and clock.now == pytest.approx(101.0)
    assert not run.again(Blip()), "the run's own deadline has passed too"
