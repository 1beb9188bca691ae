"""Cron expressions mean what cronie (and Debian's cron) makes them mean, checked against cronsim
(a test-only dependency, which follows Debian's cron) over a few thousand random expressions."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from dbcluster.batch.cron import Cron, CronError

cronsim = pytest.importorskip("cronsim", reason="cronsim (the test extra) is not installed")

#: (lowest, highest, names) of minute, hour, day of month, month, day of week.
FIELDS = (
    (0, 59, []),
    (0, 23, []),
    (1, 31, []),
    (1, 12, ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
    (0, 7, ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
)
SEED = 20261130
EXPRESSIONS = 3000
TICKS = 4


def test_day_of_month_and_day_of_week_combine_as_in_cronie() -> None:
    # A field starting with '*' leaves the day unrestricted by it: both must match (AND).
    odd_mondays = Cron.parse("0 0 */2 * mon")
    start = datetime(2026, 11, 30)  # a Monday, the 30th: even
    ticks = []
    at = start
    for _ in range(4):
        at = odd_mondays.next_after(at)
        ticks.append(at)
    assert ticks == [
        datetime(2026, 12, 7),
        datetime(2026, 12, 21),
        datetime(2027, 1, 11),
        datetime(2027, 1, 25),
    ]
    assert all(t.weekday() == 0 and t.day % 2 == 1 for t in ticks)
    # The 1st on a Sunday, Tuesday, Thursday or Saturday (2026-12-01 is a Tuesday; the next
    # such 1st is 2027-04-01, a Thursday), not any 1st and any of those days.
    firsts = Cron.parse("0 0 1 * */2")
    assert firsts.next_after(start) == datetime(2026, 12, 1)
    assert firsts.next_after(datetime(2026, 12, 1)) == datetime(2027, 4, 1)
    # Neither field starts with '*': either matches (OR).
    either = Cron.parse("0 0 1,15 * mon")
    assert either.next_after(start) == datetime(2026, 12, 1)
    assert either.next_after(datetime(2026, 12, 1)) == datetime(2026, 12, 7)
    # Both '*': every day.
    assert Cron.parse("0 0 * * *").next_after(start) == datetime(2026, 12, 1)


def _term(rng: random.Random, low: int, high: int, names: list[str]) -> str:
    def value(lo: int = low, hi: int = high) -> str:
        picked = rng.randint(lo, hi)
        if names and rng.random() < 0.3 and picked - low < len(names):
            return names[picked - low]
        return str(picked)

    kind = rng.random()
    if kind < 0.35:
        return value()
    first = rng.randint(low, high - 1)
    # (cronsim reads a range of one value with a step, 'a-a/n', as 'a/n': not generated)
    last = rng.randint(first + 1, high)
    if kind < 0.6:
        return f"{first}-{last}"
    step = rng.randint(1, max(1, (high - low) // 2))
    if kind < 0.8:
        return f"{first}-{last}/{step}"
    return f"{first}/{step}"


def _field(rng: random.Random, index: int) -> str:
    low, high, names = FIELDS[index]
    day_field = index in (2, 4)
    roll = rng.random()
    if roll < (0.3 if day_field else 0.35):
        return "*"
    if roll < (0.55 if day_field else 0.5):  # '*/n': restricted, yet starting with '*'
        return f"*/{rng.randint(1, max(2, (high - low) // 2))}"
    return ",".join(_term(rng, low, high, names) for _ in range(rng.randint(1, 3)))


def _expression(rng: random.Random) -> str:
    return " ".join(_field(rng, i) for i in range(5))


def _theirs(expression: str, start: datetime) -> list[datetime] | None:
    try:
        ticks = cronsim.CronSim(expression, start)
        return [next(ticks) for _ in range(TICKS)]
    except (cronsim.CronSimError, StopIteration):
        return None


def _ours(expression: str, start: datetime) -> list[datetime] | None:
    try:
        cron = Cron.parse(expression)
    except CronError:
        return None
    found, at = [], start
    for _ in range(TICKS):
        try:
            at = cron.next_after(at)
        except CronError:
            return None
        found.append(at)
    return found


def test_random_expressions_fire_when_cronsim_says() -> None:
    rng = random.Random(SEED)
    compared = restricted_both = star_step = 0
    for _ in range(EXPRESSIONS):
        expression = _expression(rng)
        start = datetime(2020, 1, 1) + timedelta(seconds=rng.randint(0, 10 * 365 * 86400))
        theirs = _theirs(expression, start)
        if theirs is None:
            continue  # an expression cronsim refuses (a day no month has)
        assert _ours(expression, start) == theirs, (expression, start)
        compared += 1
        dom, dow = expression.split()[2], expression.split()[4]
        restricted_both += not dom.startswith("*") and not dow.startswith("*")
        star_step += dom.startswith("*/") or dow.startswith("*/")
    # The sample exercises both rules, many times over.
    assert compared > EXPRESSIONS * 0.9
    assert restricted_both > 300 and star_step > 300, (restricted_both, star_step)
