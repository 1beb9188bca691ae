"""Automatic restarts: a node restarts, as its master, an execution that ended FAILED for a
cluster reason (abandoned, or a partition lost with its node) when its job asks for it
(:class:`~dbcluster.batch.job.AutoRestart`), so an unattended job recovers without a cron script.

Two nodes may decide to restart the same execution at once; the launcher creates executions under
the instance's row lock and the relauncher checks, in that transaction, that the execution it
restarts is still the newest, so one restart runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from dbcluster.batch.domain import JobExecution, utcnow
from dbcluster.batch.job import AUTO_RESTARTS_KEY, AutoRestart
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import CLUSTER_EXIT_CODES
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings

log = logging.getLogger("dbcluster.recovery")


class Relauncher(Protocol):
    """How a node restarts an execution (the cluster provides it)."""

    def auto_restart_policies(self) -> dict[str, AutoRestart]:
        """Job name -> its policy, for the jobs of this node's registry that have one."""
        ...

    def relaunch(self, execution: JobExecution, restarts: int) -> None:
        """Start restarting ``execution`` (its ``restarts``-th restart in a row) in the
        background, as its master; returns at once."""
        ...


class AutoRestarts(Service):
    name = "restarter"

    def __init__(
        self,
        repository: JobRepository,
        settings: ClusterSettings,
        usable_identity: Callable[[], Identity | None],
        relauncher: Relauncher,
    ) -> None:
        super().__init__(settings.stranded_master_scan_interval)
        self.repository = repository
        self.usable_identity = usable_identity
        self.relauncher = relauncher

    def run_once(self) -> None:
        if self.usable_identity() is None:
            return
        for job_name, policy in self.relauncher.auto_restart_policies().items():
            for execution in self.repository.find_failed_for(job_name, CLUSTER_EXIT_CODES):
                restarts = int(execution.execution_context.get(AUTO_RESTARTS_KEY, 0))
                if restarts >= policy.max_restarts:
                    continue
                wait_s = policy.backoff_s * 2**restarts
                ended = execution.end_time
                if ended is not None and (utcnow() - ended).total_seconds() < wait_s:
                    continue
                log.warning(
                    "restarting job %s execution %s (%s; automatic restart %d of %d)",
                    job_name,
                    execution.id,
                    execution.exit_status.code,
                    restarts + 1,
                    policy.max_restarts,
                )
                self.relauncher.relaunch(execution, restarts + 1)
