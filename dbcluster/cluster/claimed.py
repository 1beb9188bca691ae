"""The batch model's objects for what a claim won: each partition's step execution as the claim
left it (STARTED), built from the row it read back, with its job execution, read once per node
and shared by its partitions (a worker step reads its parameters and job context, which do not
change while it runs)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from dbcluster.batch.domain import JobExecution, StepExecution
from dbcluster.cluster.store import ClaimedPartition
from dbcluster.dialects.base import CLAIMED_JOB_PREFIX

if TYPE_CHECKING:
    from dbcluster.batch.repository import JobRepository

log = logging.getLogger("dbcluster.node")

#: Job executions kept per node (their parameters and context, read once and shared).
JOB_CACHE = 64


class ClaimedExecutions:
    """Step and job executions of claimed partitions, on ``repository``."""

    def __init__(self, repository: JobRepository) -> None:
        self.repository = repository
        self._lock = threading.Lock()
        self._jobs: dict[int, JobExecution] = {}

    def knows_job(self, job_execution_id: int) -> bool:
        """Whether this node has the job execution (its partitions need no read of it)."""
        with self._lock:
            return job_execution_id in self._jobs

    def step_execution(self, won: ClaimedPartition) -> StepExecution | None:
        """The partition's step execution from the claim's row (None when it cannot be built:
        the task reads its own instead)."""
        try:
            job_execution = self._job_execution(won.partition.job_execution_id, won.row)
            if job_execution is None:
                return None
            se = self.repository.step_execution_from_row(won.row, job_execution)
        except Exception as exc:  # noqa: BLE001 - the task loads its own instead
            log.warning(
                "could not build step execution %s: %s", won.partition.step_execution_id, exc
            )
            return None
        se.start_recorded = True
        return se

    def _job_execution(self, job_execution_id: int, claimed: Any = None) -> JobExecution | None:
        """From the row ``claimed`` where the claim read the job back with the partition, else
        by a read; kept for the job's next partitions."""
        with self._lock:
            cached = self._jobs.get(job_execution_id)
        if cached is not None:
            return cached
        loaded = None
        if claimed is not None:
            loaded = self.repository.job_execution_from_row(claimed, CLAIMED_JOB_PREFIX)
        if loaded is None:
            loaded = self.repository.get_job_execution(job_execution_id)
        if loaded is not None:
            with self._lock:
                if len(self._jobs) >= JOB_CACHE:
                    self._jobs.pop(next(iter(self._jobs)))
                self._jobs[job_execution_id] = loaded
        return loaded
