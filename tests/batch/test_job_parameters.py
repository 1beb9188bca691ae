"""Job parameters: the run-id incrementer, the next run's parameters, validation per job."""

from __future__ import annotations

from datetime import date

import pytest

from dbcluster.batch import (
    BatchStatus,
    Job,
    JobLauncher,
    JobParameters,
    JobParametersError,
    ParametersValidator,
    RunIdIncrementer,
    TaskletStep,
)


def _job(**options: object) -> Job:
    return Job("params", [TaskletStep("noop", lambda ctx: None)], **options)  # type: ignore[arg-type]


def test_next_parameters_increment_the_last_run(launcher: JobLauncher) -> None:
    job = _job(incrementer=RunIdIncrementer())
    first = launcher.next_parameters(job, {"region": "eu"})
    assert dict(first) == {"run.id": 1, "region": "eu"}
    assert launcher.run(job, first).status is BatchStatus.COMPLETED
    second = launcher.next_parameters(job)
    assert dict(second) == {"run.id": 2, "region": "eu"}, "the last run's parameters, run.id + 1"
    launcher.run(job, second)
    third = launcher.next_parameters(job, {"region": "us"})
    assert dict(third) == {"run.id": 3, "region": "us"}, "given parameters win"
    with pytest.raises(JobParametersError, match="no incrementer"):
        launcher.next_parameters(_job())


def test_a_validator_checks_every_launch(launcher: JobLauncher) -> None:
    validator = ParametersValidator(required={"day": date}, optional={"limit": "int"})
    job = _job(validator=validator, incrementer=RunIdIncrementer())
    with pytest.raises(JobParametersError, match="'day' is missing"):
        launcher.run(job, {"limit": 3})
    with pytest.raises(JobParametersError, match="'day' must be date, not str"):
        launcher.run(job, {"day": "2026-11-30"})
    with pytest.raises(JobParametersError, match="'other' is not a parameter of this job"):
        launcher.run(job, {"day": date(2026, 11, 30), "other": 1})
    # The incrementer's key needs no listing.
    params = launcher.next_parameters(job, {"day": date(2026, 11, 30)})
    assert launcher.run(job, params).status is BatchStatus.COMPLETED
    assert JobParameters.parse(["day(date)=2026-11-30"])["day"] == date(2026, 11, 30)
    with pytest.raises(JobParametersError, match="unknown job parameter type"):
        ParametersValidator(required={"x": list})


def test_equal_parameters_hash_alike_in_any_order() -> None:
    """Equality ignores the order parameters were read in (a database's collation orders
    them), so the hash must too."""
    one = JobParameters({"b": 1, "a": "x", "_z": 2})
    other = JobParameters({"_z": 2, "a": "x", "b": 1})
    assert one == other and hash(one) == hash(other)
    assert len({one, other}) == 1
