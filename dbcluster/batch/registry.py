"""The registry of job and step definitions, so a worker can find a step by name."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from dbcluster.batch.exceptions import NoSuchJobError, NoSuchStepError, RegistryLoadError
from dbcluster.batch.job import Job
from dbcluster.batch.step import Step


class JobRegistry:
    """Maps job names to jobs and step names (nested partition workers included) to steps."""

    def __init__(self, jobs: Iterable[Job] = (), steps: Iterable[Step] = ()) -> None:
        self._jobs: dict[str, Job] = {}
        self._steps: dict[str, Step] = {}
        for job in jobs:
            self.register(job)
        for step in steps:
            self.register_step(step)

    def register(self, job: Job) -> Job:
        if job.name in self._jobs and self._jobs[job.name] is not job:
            raise ValueError(f"a different job named {job.name!r} is already registered")
        for step in job.all_steps():
            self.register_step(step)
        self._jobs[job.name] = job
        return job

    def register_step(self, step: Step) -> Step:
        for nested in step.steps():
            known = self._steps.get(nested.name)
            if known is not None and known is not nested:
                raise ValueError(f"a different step named {nested.name!r} is already registered")
            self._steps[nested.name] = nested
        return step

    def get_job(self, name: str) -> Job:
        try:
            return self._jobs[name]
        except KeyError:
            raise NoSuchJobError(
                f"no job named {name!r} is registered "
                f"(known: {', '.join(sorted(self._jobs)) or 'none'})"
            ) from None

    def get_step(self, name: str) -> Step:
        try:
            return self._steps[name]
        except KeyError:
            raise NoSuchStepError(
                f"no step named {name!r} is registered "
                f"(known: {', '.join(sorted(self._steps)) or 'none'})"
            ) from None

    def job_names(self) -> list[str]:
        return sorted(self._jobs)

    def step_names(self) -> list[str]:
        return sorted(self._steps)


def load_registry(reference: str) -> JobRegistry:
    """Load ``"package.module:attribute"``: a JobRegistry, a Job, a list of jobs, or a callable
    without arguments returning one of those."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise RegistryLoadError(
            f"registry reference {reference!r} must look like 'package.module:attribute'"
        )
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as error:
        raise RegistryLoadError(
            f"cannot import module {module_name!r} of registry {reference!r}: {error}"
        ) from error
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise RegistryLoadError(
                f"{module_name!r} has no attribute {attribute!r} (registry {reference!r})"
            ) from None
    if callable(target) and not isinstance(target, (JobRegistry, Job)):
        target = target()
    if isinstance(target, JobRegistry):
        return target
    if isinstance(target, Job):
        return JobRegistry([target])
    if isinstance(target, (list, tuple)) and all(isinstance(j, Job) for j in target):
        return JobRegistry(target)
    raise RegistryLoadError(
        f"{reference!r} is a {type(target).__name__}, not a JobRegistry, a Job or a list of jobs"
    )
