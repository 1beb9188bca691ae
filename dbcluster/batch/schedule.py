"""Recurring jobs: a :class:`Schedule` registered in the job registry.

The nodes that accept launches fire each tick exactly once across the cluster (see
:mod:`dbcluster.cluster.maintenance.scheduler`): firing a tick submits a launch request, which
one accepting node claims and runs as the job's master.

Ticks missed while no node could fire them (more than ``misfire_grace`` seconds late) follow the
schedule's ``misfire`` policy:

- ``"latest"`` (default): fire the most recent missed tick once, skip the others.
- ``"all"``: fire every missed tick, oldest first, at most ``catch_up_limit`` of them (the most
  recent ones).
- ``"skip"``: fire none of them; the schedule carries on from the next tick.

A tick less than ``misfire_grace`` late is not a misfire: it fires (a node paused for a moment
or a busy database does not lose ticks). A schedule no node has fired yet starts from the moment
a node first sees it: ticks before that are not missed ticks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from dbcluster.batch.cron import Cron, CronError, zone
from dbcluster.batch.parameters import JobParameter, JobParameters, as_job_parameters

MISFIRE_POLICIES = ("latest", "all", "skip")


@dataclass(frozen=True)
class Schedule:
    """``Schedule("nightly", cron="0 2 * * *", params={"region": "eu"}, timezone="Europe/Paris")``.

    ``job``: the job's name. ``cron``: 5 fields, or 6 with leading seconds (see
    :mod:`dbcluster.batch.cron`). ``params``: the parameters of every run. ``next_run``: start
    each run with the job's incrementer applied to its last run's parameters (``params`` on top),
    as ``launch --next`` does; None (default): when the job has an incrementer.
    ``fire_time_param``: also pass the tick's time (naive UTC datetime) as this identifying
    parameter, so each tick is an instance of its own. ``name``: the schedule's key in the
    database (default: the job's name); renaming it starts a new history.
    """

    job: str
    cron: str
    params: Mapping[str, Any] | JobParameters = field(default_factory=dict)
    timezone: str = "UTC"
    misfire: str = "latest"
    misfire_grace: float = 60.0
    catch_up_limit: int = 100
    fire_time_param: str | None = None
    next_run: bool | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.job, str):
            object.__setattr__(self, "job", self.job.name)  # a Job given for its name
        if not self.name:
            object.__setattr__(self, "name", self.job)
        object.__setattr__(self, "params", as_job_parameters(self.params))
        if self.misfire not in MISFIRE_POLICIES:
            raise CronError(
                f"schedule {self.name!r}: misfire must be one of {', '.join(MISFIRE_POLICIES)}, "
                f"not {self.misfire!r}"
            )
        if self.misfire_grace < 0 or self.catch_up_limit < 1:
            raise CronError(
                f"schedule {self.name!r}: misfire_grace must be >= 0 and catch_up_limit >= 1"
            )
        self.zone  # noqa: B018 - validates the time zone now, not at the first tick
        self.expression  # noqa: B018 - validates the cron expression now

    @property
    def expression(self) -> Cron:
        try:
            return _parsed(self.cron)
        except CronError as error:
            raise CronError(f"schedule {self.name!r}: {error}") from None

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)

    def next_after(self, utc: datetime) -> datetime:
        return self.expression.next_after(utc, self.zone)

    def due(self, since: datetime, now: datetime) -> list[datetime]:
        """The ticks to fire now (naive UTC, oldest first): those in ``(since, now]`` less than
        ``misfire_grace`` late, after the missed ones the misfire policy keeps."""
        cron, tz = self.expression, self.zone
        grace_start = now - timedelta(seconds=self.misfire_grace)
        missed: list[datetime] = []
        if since < grace_start and self.misfire != "skip":
            limit = 1 if self.misfire == "latest" else self.catch_up_limit
            missed = cron.latest_ticks(since, grace_start, tz, limit)
        return missed + cron.ticks_between(max(since, grace_start), now, tz)

    def run_parameters(self, fire_time: datetime) -> JobParameters:
        """The parameters a tick submits (before any incrementer)."""
        values = self.params.parameters()  # type: ignore[union-attr]
        if self.fire_time_param:
            values[self.fire_time_param] = JobParameter(fire_time)
        return JobParameters(values)


_CACHE: dict[str, Cron] = {}


def _parsed(expression: str) -> Cron:
    cron = _CACHE.get(expression)
    if cron is None:
        cron = _CACHE[expression] = Cron.parse(expression)
    return cron
