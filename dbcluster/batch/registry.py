"""The registry of job and step definitions, so a worker can find a step by name."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar, Unpack, overload

from dbcluster.batch.exceptions import NoSuchJobError, NoSuchStepError, RegistryLoadError
from dbcluster.batch.job import Job
from dbcluster.batch.partition import PartitionStep
from dbcluster.batch.partitioned import IdsFunction, PartitionedJobOptions, partitioned_job
from dbcluster.batch.resources import Resource, Resources
from dbcluster.batch.schedule import Schedule
from dbcluster.batch.step import Step

T = TypeVar("T")


class JobRegistry:
    """Maps job names to jobs and step names (nested partition workers included) to steps, and
    holds the schedules of recurring jobs and the application's resources.

    A worker finds everything it runs here: ``dbcluster worker --app myjobs:registry`` imports
    ``myjobs`` (from the current directory too) and takes its ``registry``."""

    def __init__(
        self,
        jobs: Iterable[Job] = (),
        steps: Iterable[Step] = (),
        schedules: Iterable[Schedule] = (),
    ) -> None:
        self._jobs: dict[str, Job] = {}
        self._steps: dict[str, Step] = {}
        self._partition_steps: dict[str, PartitionStep] = {}
        self._schedules: dict[str, Schedule] = {}
        #: The application's resources (:meth:`resource`), closed when this process's nodes stop.
        self.resources = Resources()
        for job in jobs:
            self.register(job)
        for step in steps:
            self.register_step(step)
        for schedule in schedules:
            self.schedule(schedule)

    def partitioned_job(
        self, **options: Unpack[PartitionedJobOptions]
    ) -> Callable[[IdsFunction], Job]:
        """Decorator: the job :func:`~dbcluster.batch.partitioned_job` makes of the function
        (``ids`` and the same options), registered here::

            @registry.partitioned_job(ids=range(1, 1_000_001), partitions=8)
            def recompute(ids: range, ctx: ChunkContext) -> None: ...
        """

        def wrap(function: IdsFunction) -> Job:
            return self.register(partitioned_job(function, **options))

        return wrap

    @overload
    def resource(self, factory: Callable[[], Iterator[T]], /) -> Resource[T]: ...

    @overload
    def resource(self, factory: Callable[[], T], /) -> Resource[T]: ...

    def resource(self, factory: Callable[[], Any], /) -> Resource[Any]:
        """Decorator: an application resource (an engine, a session factory, settings) made by
        ``factory`` once per process, when first called, and closed when the process's nodes
        stop (see :class:`~dbcluster.batch.resources.Resource`)::

            @registry.resource
            def shop() -> Engine:
                return create_engine(os.environ["SHOP_DATABASE_URL"])

            ...  # in a step: with shop().begin() as conn: ...
        """
        return self.resources.add(Resource(factory))

    def schedule(self, schedule: Schedule) -> Schedule:
        """Register a recurring run of a registered job (see :class:`Schedule`). Its
        ``next_run`` left None becomes whether the job has an incrementer."""
        job = self.get_job(schedule.job)
        known = self._schedules.get(schedule.name)
        if known is not None and replace(known, next_run=schedule.next_run) != schedule:
            raise ValueError(f"a different schedule named {schedule.name!r} is already registered")
        if schedule.next_run is None:
            schedule = replace(schedule, next_run=job.incrementer is not None)
        self._schedules[schedule.name] = schedule
        return schedule

    def schedules(self) -> list[Schedule]:
        """The registered schedules, by name."""
        return [self._schedules[name] for name in sorted(self._schedules)]

    def register(self, job: Job) -> Job:
        if job.name in self._jobs and self._jobs[job.name] is not job:
            raise ValueError(f"a different job named {job.name!r} is already registered")
        for step in job.all_steps():
            self.register_step(step)
        self._jobs[job.name] = job
        for step in job.all_steps():
            child = getattr(step, "job", None)  # a JobStep's job: a node may take it over
            if isinstance(child, Job) and child.name not in self._jobs:
                self.register(child)
        return job

    def register_step(self, step: Step) -> Step:
        for nested in step.steps():
            known = self._steps.get(nested.name)
            if known is not None and known is not nested:
                raise ValueError(f"a different step named {nested.name!r} is already registered")
            self._steps[nested.name] = nested
            if isinstance(nested, PartitionStep):
                self._partition_steps[nested.worker_step.name] = nested
        return step

    def partition_step_of(self, worker_step_name: str) -> PartitionStep | None:
        """The partitioned step whose worker step this is (its retry and timeout policy)."""
        return self._partition_steps.get(worker_step_name)

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
    without arguments returning one of those.

    The current directory is put on ``sys.path`` first (as ``python -m`` and Celery's ``-A``
    do), so ``myjobs:registry`` finds ``./myjobs.py`` without installing it."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise RegistryLoadError(
            f"registry reference {reference!r} must look like 'package.module:attribute'"
        )
    _current_directory_on_path()
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
        if not _callable_without_arguments(target):
            raise RegistryLoadError(
                f"{reference!r} is a {'class' if isinstance(target, type) else 'function'} "
                "that takes arguments; --app names a "
                "JobRegistry, a Job, a list of jobs or a callable without arguments returning "
                "one (e.g. myjobs:registry)"
            )
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


def _callable_without_arguments(target: Callable[..., object]) -> bool:
    """Whether ``target()`` binds: a job function or a class that needs arguments is named by
    mistake, and calling it would end in a TypeError from deep inside."""
    try:
        inspect.signature(target).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): let the call decide
        return True
    return True


def _current_directory_on_path() -> None:
    """Make modules of the current directory importable, for good: the application may import
    more of its own modules later, from a step."""
    here = os.getcwd()
    if not any(entry in ("", ".", here) for entry in sys.path):
        sys.path.insert(0, here)
