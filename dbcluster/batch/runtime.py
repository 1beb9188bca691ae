"""What a running step needs from its surroundings.

Every step and job module takes a :class:`BatchRuntime`, so this module imports none of them:
what the runtime holds beside the repository is named by what it does (the protocols below), and
a job or a partitioned step passed through it is typed ``Any`` here (the modules that define
those classes type them fully).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, PartitionsEnded, StepExecution
from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.repository import JobRepository


class PartitionHandler(Protocol):
    """Runs a partitioned step's partitions and returns their step executions (any final status).

    ``step`` is the :class:`~dbcluster.batch.partition.PartitionStep`. A handler whose class sets
    ``returns_stored = True`` returns them as read from the repository after the last one ended,
    or what the step aggregates of them (:class:`PartitionsEnded`), and the step aggregates that
    as it is; otherwise the step reads them again."""

    def handle(
        self, step: Any, master: StepExecution, runtime: BatchRuntime
    ) -> list[StepExecution] | PartitionsEnded: ...


class JobLookup(Protocol):
    """Finds a job by name (a :class:`~dbcluster.batch.registry.JobRegistry` is one)."""

    def get_job(self, name: str) -> Any: ...


#: ``create_execution(job, params, context)``: a new execution of a
#: :class:`~dbcluster.batch.job.Job`.
ExecutionFactory = Callable[[Any, JobParameters, ExecutionContext | None], JobExecution]


@dataclass
class BatchRuntime:
    """The repository, the default partition handler and (optionally) the registry of a run.

    ``create_execution(job, params, context)`` makes a new execution of a job (what a
    :class:`~dbcluster.batch.jobstep.JobStep` runs): the launcher's checks, plus, on a cluster,
    the execution's coordination row with this node as its master and its fence.
    """

    repository: JobRepository
    partition_handler: PartitionHandler
    registry: JobLookup | None = None
    create_execution: ExecutionFactory | None = None
