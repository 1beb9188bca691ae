"""The in-process partition handler: a thread pool."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from dbcluster.batch.domain import StepExecution

if TYPE_CHECKING:
    from dbcluster.batch.partition import PartitionStep
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)


class LocalPartitionHandler:
    """Runs a partition step's partitions on ``max_workers`` threads of this process.

    ``grid_size`` (default ``max_workers``) is the worker count the partitioner is told.
    """

    #: Seconds between checks of the master's ``terminate_only`` flag.
    poll_interval: float = 0.2

    def __init__(self, max_workers: int = 4, grid_size: int | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, not {max_workers}")
        self.max_workers = max_workers
        self.grid_size = grid_size

    def handle(
        self, step: PartitionStep, master: StepExecution, runtime: BatchRuntime
    ) -> list[StepExecution]:
        works = step.split(master, self.grid_size or self.max_workers, runtime)
        if not works:
            return []
        for work in works:
            # In-process partitions are the master's own work: they write under its fence.
            work.step_execution.fence = master.fence
        workers = min(self.max_workers, len(works))
        with ThreadPoolExecutor(workers, thread_name_prefix=f"dbcluster-{step.name}") as pool:
            futures = {
                pool.submit(step.worker_step.execute, work.step_execution, runtime): work
                for work in works
            }
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=self.poll_interval)
                if master.should_stop:
                    # A stop of the master reaches every partition at its next chunk boundary.
                    for work in works:
                        work.step_execution.terminate_only = True
            for future, work in futures.items():
                error = future.exception()
                if error is not None:
                    log.error(
                        "partition %s of step %s could not record its outcome: %s",
                        work.name,
                        step.name,
                        error,
                    )
        return [work.step_execution for work in works]
