"""Cron expressions: five fields (minute hour day-of-month month day-of-week) or six with a
leading seconds field, evaluated in a time zone.

Each field takes ``*`` (or ``?``), a value, a range ``a-b``, a step ``*/n``, ``a-b/n`` or
``a/n``, and comma-separated lists of those; months and days of the week also take their
three-letter English names (``jan``, ``mon``), and Sunday is 0 or 7. Day of month and day of
week combine as in cronie (and Debian's cron, and cronsim): when either field starts with ``*``
(or ``?``) a day must match both, so ``0 0 */2 * mon`` fires on Mondays that fall on an odd day
of the month; when neither does, a day matching either fires (``0 0 1,15 * mon``: the 1st, the
15th and every Monday). ``@yearly``
(``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly`` are
shorthands.

Times in and out are naive UTC (the database clock's); the expression is matched against the
wall clock of its zone. Daylight-saving changes: a wall time that does not exist (the hour
skipped when clocks go forward) does not fire; a wall time that happens twice (the hour repeated
when they go back) fires once, at its first occurrence. Schedules that must fire on every tick
whatever the season use UTC (the default).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dbcluster.errors import ConfigurationError


class CronError(ConfigurationError):
    """A cron expression or time zone that cannot be used (the message names the field)."""


_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
#: (name, lowest, highest, names for lowest + i)
_FIELDS: tuple[tuple[str, int, int, list[str]], ...] = (
    ("second", 0, 59, []),
    ("minute", 0, 59, []),
    ("hour", 0, 23, []),
    ("day of month", 1, 31, []),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: How far a search looks for the next or previous tick (covers 29 February in a leap year).
_SEARCH_DAYS = 366 * 9


def _value(text: str, field: str, low: int, high: int, names: list[str]) -> int:
    lowered = text.lower()
    if lowered in names:
        return low + names.index(lowered)
    if not text.isdigit():
        raise CronError(f"cron {field} field: {text!r} is not a number{' or a name' * bool(names)}")
    number = int(text)
    if not low <= number <= high:
        raise CronError(f"cron {field} field: {number} is out of range {low}-{high}")
    return number


def _parse_field(text: str, field: str, low: int, high: int, names: list[str]) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"cron {field} field: empty list item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"cron {field} field: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base in ("*", "?"):
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _value(first, field, low, high, names)
            end = _value(last, field, low, high, names)
            if start > end:
                raise CronError(f"cron {field} field: range {base!r} runs backwards")
        else:
            start = _value(base, field, low, high, names)
            end = high if slash else start
        values.update(range(start, end + 1, step))
    return values


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression; :meth:`next_after` and :meth:`previous_before` walk its ticks."""

    expression: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    #: Whether the day-of-month and day-of-week fields start with ``*`` (or ``?``): cronie's
    #: DOM_STAR and DOW_STAR, which make a day match both fields instead of either.
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str) -> Cron:
        text = _MACROS.get(expression.strip().lower(), expression)
        parts = text.split()
        if len(parts) == 5:
            parts = ["0", *parts]
        elif len(parts) != 6:
            raise CronError(
                f"cron expression {expression!r} has {len(parts)} fields; expected 5 (minute hour "
                f"day-of-month month day-of-week) or 6 (a leading seconds field)"
            )
        sets = [
            _parse_field(part, name, low, high, names)
            for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True)
        ]
        weekdays = frozenset(d % 7 for d in sets[5])
        cron = cls(
            expression,
            tuple(sorted(sets[0])),
            tuple(sorted(sets[1])),
            tuple(sorted(sets[2])),
            frozenset(sets[3]),
            frozenset(sets[4]),
            weekdays,
            any_day=parts[3].startswith(("*", "?")),
            any_weekday=parts[5].startswith(("*", "?")),
        )
        if next(cron._walk(datetime(2000, 1, 1), forward=True), None) is None:
            raise CronError(f"cron expression {expression!r} never fires (no such day)")
        return cron

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def _walk(self, start: datetime, *, forward: bool) -> Iterator[datetime]:
        """Matching wall times strictly after (or before) ``start``, in order."""
        step = timedelta(days=1 if forward else -1)
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        if not forward:
            hours, minutes, seconds = hours[::-1], minutes[::-1], seconds[::-1]
        day = start.date()
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                on_start = day == start.date()
                for h in hours:
                    if on_start and (h < start.hour if forward else h > start.hour):
                        continue
                    for m in minutes:
                        if on_start and h == start.hour:
                            if m < start.minute if forward else m > start.minute:
                                continue
                        for s in seconds:
                            tick = datetime(day.year, day.month, day.day, h, m, s)
                            if (tick > start) if forward else (tick < start):
                                yield tick
            day += step

    def _ticks(self, utc: datetime, zone: ZoneInfo, *, forward: bool) -> Iterator[datetime]:
        """Ticks (naive UTC) strictly after (or before) ``utc``, in order."""
        wall = utc.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None)
        for tick in self._walk(wall, forward=forward):
            local = tick.replace(tzinfo=zone, fold=0)
            back = local.astimezone(UTC)
            if back.astimezone(zone).replace(tzinfo=None) != tick:
                continue  # skipped by a daylight-saving change
            instant = back.replace(tzinfo=None)
            if (instant > utc) if forward else (instant < utc):
                yield instant

    def next_after(self, utc: datetime, zone: ZoneInfo | None = None) -> datetime:
        """The first tick strictly after ``utc`` (naive UTC in and out)."""
        found = next(self._ticks(utc, zone or ZoneInfo("UTC"), forward=True), None)
        if found is None:
            raise CronError(f"cron expression {self.expression!r} never fires after {utc}")
        return found

    def previous_before(self, utc: datetime, zone: ZoneInfo | None = None) -> datetime | None:
        """The last tick strictly before ``utc`` (None: none within nine years)."""
        return next(self._ticks(utc, zone or ZoneInfo("UTC"), forward=False), None)

    def ticks_between(
        self, after: datetime, until: datetime, zone: ZoneInfo | None = None, limit: int = 1000
    ) -> list[datetime]:
        """Ticks in ``(after, until]``, oldest first, at most ``limit`` (the oldest)."""
        found: list[datetime] = []
        for tick in self._ticks(after, zone or ZoneInfo("UTC"), forward=True):
            if tick > until or len(found) >= limit:
                break
            found.append(tick)
        return found

    def latest_ticks(
        self, after: datetime, until: datetime, zone: ZoneInfo | None = None, limit: int = 1
    ) -> list[datetime]:
        """The last ``limit`` ticks in ``(after, until]``, oldest first."""
        found: list[datetime] = []
        for tick in self._ticks(
            until + timedelta(microseconds=1), zone or ZoneInfo("UTC"), forward=False
        ):
            if tick <= after or len(found) >= limit:
                break
            found.append(tick)
        return found[::-1]


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; a :class:`CronError` naming it when it is unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(
            f"unknown time zone {name!r} (use an IANA name such as 'Europe/Paris' or 'UTC')"
        ) from None
