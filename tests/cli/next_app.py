"""A job with a run-id incrementer and a parameter validator, for ``launch --next``."""

from __future__ import annotations

from dbcluster.batch import Job, JobRegistry, ParametersValidator, RunIdIncrementer, TaskletStep

registry = JobRegistry(
    [
        Job(
            "daily",
            [TaskletStep("noop", lambda ctx: None)],
            incrementer=RunIdIncrementer(),
            validator=ParametersValidator(required={"region": str}, optional=["note"]),
        )
    ]
)
