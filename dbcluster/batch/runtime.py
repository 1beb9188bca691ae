"""What a running step needs from its surroundings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dbcluster.batch.context import ExecutionContext
    from dbcluster.batch.domain import JobExecution
    from dbcluster.batch.job import Job
    from dbcluster.batch.parameters import JobParameters
    from dbcluster.batch.partition import PartitionHandler
    from dbcluster.batch.registry import JobRegistry
    from dbcluster.batch.repository import JobRepository


@dataclass
class BatchRuntime:
    """The repository, the default partition handler and (optionally) the registry of a run.

    ``create_execution(job, params, context)`` makes a new execution of a job (what a
    :class:`~dbcluster.batch.jobstep.JobStep` runs): the launcher's checks, plus, on a cluster,
    the execution's coordination row with this node as its master and its fence.
    """

    repository: JobRepository
    partition_handler: PartitionHandler
    registry: JobRegistry | None = None
    create_execution: (
        Callable[[Job, JobParameters, ExecutionContext | None], JobExecution] | None
    ) = None
