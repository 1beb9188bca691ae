"""Cron expressions, time zones and the missed-tick policies of a Schedule (no database)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from dbcluster.batch import Job, JobRegistry, RunIdIncrementer, Schedule, TaskletStep
from dbcluster.batch.cron import Cron, CronError, zone
from dbcluster.batch.tasklet import RepeatStatus

T = datetime(2026, 11, 30, 20, 0, 0)


def test_five_and_six_fields_names_steps_lists_and_macros() -> None:
    assert Cron.parse("0 2 * * *").next_after(T) == datetime(2026, 12, 1, 2, 0)
    every = Cron.parse("* * * * * *")
    assert every.ticks_between(T + timedelta(microseconds=500), T + timedelta(seconds=3)) == [
        T + timedelta(seconds=s) for s in (1, 2, 3)
    ]
    assert Cron.parse("*/15 9-17 * * mon-fri").next_after(datetime(2026, 11, 28)) == datetime(
        2026, 11, 30, 9, 0
    )  # Saturday -> Monday 09:00
    assert Cron.parse("0 0 1,15 jan,jul *").next_after(T) == datetime(2027, 1, 1)
    assert Cron.parse("@hourly").next_after(T) == T + timedelta(hours=1)
    assert Cron.parse("0 0 * * 7").next_after(T) == datetime(2026, 12, 6)  # 7 is Sunday
    assert Cron.parse("0 0 29 2 *").next_after(T) == datetime(2028, 2, 29)
    # Day of month and day of week both restricted: either matches (cronie).
    assert Cron.parse("0 0 13 * fri").next_after(datetime(2026, 12, 1)) == datetime(2026, 12, 4)
    assert Cron.parse("30 * * * *").previous_before(T) == datetime(2026, 11, 30, 19, 30)
    assert Cron.parse("* * * * *").latest_ticks(T - timedelta(hours=1), T, limit=3) == [
        T - timedelta(minutes=2),
        T - timedelta(minutes=1),
        T,
    ]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * *", "has 3 fields"),
        ("61 * * * *", "cron minute field: 61 is out of range 0-59"),
        ("0 24 * * *", "cron hour field: 24 is out of range 0-23"),
        ("0 0 0 * *", "cron day of month field: 0 is out of range 1-31"),
        ("0 0 * 13 *", "cron month field: 13 is out of range 1-12"),
        ("0 0 * * funday", "cron day of week field: 'funday' is not a number or a name"),
        ("*/0 * * * * *", "cron second field: step '0' must be a positive number"),
        ("5-1 * * * *", "cron minute field: range '5-1' runs backwards"),
        ("0 0 31 2 *", "never fires"),
    ],
)
def test_an_invalid_expression_names_its_field(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=message.replace("*", r"\*").replace("(", r"\(")):
        Cron.parse(expression)


def test_daylight_saving_skipped_times_do_not_fire_and_repeated_times_fire_once() -> None:
    paris = zone("Europe/Paris")
    at_0230 = Cron.parse("30 2 * * *")
    # 29 March 2026: 02:30 does not exist in Paris; the next 02:30 is on the 30th (CEST, UTC+2).
    assert at_0230.next_after(datetime(2026, 3, 28, 12), paris) == datetime(2026, 3, 30, 0, 30)
    # 25 October 2026: 02:30 happens twice; it fires at the first (CEST, 00:30 UTC) only.
    assert at_0230.next_after(datetime(2026, 10, 24, 12), paris) == datetime(2026, 10, 25, 0, 30)
    assert at_0230.next_after(datetime(2026, 10, 25, 0, 30), paris) == datetime(2026, 10, 26, 1, 30)
    half_hourly = Cron.parse("*/30 * * * *").ticks_between(
        datetime(2026, 10, 24, 23, 50), datetime(2026, 10, 25, 2, 10), paris
    )
    # 02:00 and 02:30 CEST, then the repeated 02:00-03:00 (CET) is skipped, then 03:00 CET.
    assert half_hourly == [
        datetime(2026, 10, 25, 0, 0),
        datetime(2026, 10, 25, 0, 30),
        datetime(2026, 10, 25, 2, 0),
    ]
    with pytest.raises(CronError, match="unknown time zone 'Mars/Base'"):
        Schedule("job", cron="0 2 * * *", timezone="Mars/Base")


def test_misfire_policies_decide_the_missed_ticks_and_late_ticks_within_grace_fire() -> None:
    minutely = dict(job="job", cron="* * * * *", misfire_grace=90)
    now = T + timedelta(seconds=5)
    down_since = T - timedelta(hours=1)  # the last tick fired an hour ago
    grace = [T - timedelta(minutes=1), T]  # less than 90 s late: not misfires
    assert Schedule(**minutely).due(down_since, now) == [T - timedelta(minutes=2), *grace]
    assert Schedule(**minutely, misfire="skip").due(down_since, now) == grace
    assert (
        Schedule(**minutely, misfire="all", catch_up_limit=3).due(down_since, now)
        == [T - timedelta(minutes=m) for m in (4, 3, 2)] + grace
    )
    assert len(Schedule(**minutely, misfire="all").due(down_since, now)) == 60  # 19:01 to 20:00
    # Nothing missed: only the tick due now.
    assert Schedule(**minutely).due(T - timedelta(seconds=1), now) == [T]
    with pytest.raises(CronError, match="misfire must be one of latest, all, skip"):
        Schedule("job", cron="* * * * *", misfire="sometimes")
    with pytest.raises(CronError, match="schedule 'job': cron hour field"):
        Schedule("job", cron="0 99 * * *")


def test_the_registry_holds_schedules_and_a_job_with_an_incrementer_runs_next() -> None:
    def done(ctx: object) -> RepeatStatus:
        return RepeatStatus.FINISHED

    plain = Job("plain", [TaskletStep("plain.s", done)])
    counted = Job("counted", [TaskletStep("counted.s", done)], incrementer=RunIdIncrementer())
    registry = JobRegistry(
        [plain, counted],
        schedules=[
            Schedule("plain", cron="0 2 * * *", fire_time_param="run.at"),
            Schedule(counted, cron="@daily"),
        ],
    )
    by_name = {s.name: s for s in registry.schedules()}
    assert by_name["plain"].next_run is False and by_name["counted"].next_run is True
    assert by_name["plain"].run_parameters(T)["run.at"] == T
    with pytest.raises(Exception, match="no job named 'nosuch'"):
        registry.schedule(Schedule("nosuch", cron="@daily"))
    with pytest.raises(ValueError, match="a different schedule named 'plain'"):
        registry.schedule(Schedule("plain", cron="@hourly"))
