"""The entry point: a node for a job registry and a URL, and ``launch`` to be a job's master."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from dbcluster.batch.domain import JobExecution
from dbcluster.batch.exceptions import (
    JobRestartError,
    NoSuchJobExecutionError,
    OptimisticLockingFailureError,
)
from dbcluster.batch.job import Job
from dbcluster.batch.launcher import JobLauncher
from dbcluster.batch.parameters import JobParameters, as_job_parameters
from dbcluster.batch.registry import JobRegistry
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.assignment import AssignmentStrategy
from dbcluster.cluster.handler import ClusterPartitionHandler
from dbcluster.cluster.node import Node
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.dialects.base import (
    COORD_COMPLETED,
    COORD_CREATED,
    COORD_FAILED,
    COORD_STARTED,
)

log = logging.getLogger("dbcluster.cluster")


class Cluster:
    """This process's membership of the cluster.

    ``with Cluster(url, registry) as cluster: cluster.launch("job", {"date": "..."})`` joins as
    a node (running partitions unless ``work=False``), launches the job with this node as its
    master, and leaves gracefully at the end.
    """

    def __init__(
        self,
        url_or_engine: str | Engine,
        registry: JobRegistry,
        settings: ClusterSettings | None = None,
        *,
        work: bool = True,
        strategy: AssignmentStrategy | None = None,
    ) -> None:
        self.engine = (
            make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
        )
        self._owns_engine = isinstance(url_or_engine, str)
        self.registry = registry
        self.settings = settings or ClusterSettings.from_env()
        self.repository = JobRepository(self.engine)
        self.node = Node(
            self.engine,
            registry,
            self.settings,
            capacity=self.settings.concurrency_limit if work else 0,
            repository=self.repository,
        )
        self.handler = ClusterPartitionHandler(self.node, strategy)
        self.launcher = JobLauncher(self.repository, self.handler, registry)

    def start(self) -> Cluster:
        self.node.start()
        return self

    def stop(self, drain_timeout_ms: int | None = None) -> None:
        self.node.stop(drain_timeout_ms)
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _job(self, job: Job | str) -> Job:
        return self.registry.get_job(job) if isinstance(job, str) else job

    def launch(
        self, job: Job | str, params: JobParameters | Mapping[str, Any] | None = None
    ) -> JobExecution:
        """Run the job with this node as its master; returns the finished execution."""
        job = self._job(job)
        return self.run_execution(job, self.create_execution(job, as_job_parameters(params)))

    def restart(self, execution_id: int) -> JobExecution:
        """Run a FAILED or ABANDONED execution's instance again (only unfinished partitions)."""
        old = self.repository.get_job_execution(execution_id)
        if old is None:
            raise NoSuchJobExecutionError(f"there is no job execution with id {execution_id}")
        job = self.registry.get_job(old.job_name)
        return self.run_execution(job, self.create_execution(job, old.parameters))

    def create_execution(self, job: Job, params: JobParameters) -> JobExecution:
        """The launcher's checks, plus one of the cluster's: an instance whose last execution
        still has partitions in flight (PENDING or CLAIMED on some node) cannot run again yet,
        or a partition could run in both executions at once."""
        instance = self.repository.get_job_instance(job.name, params)
        if instance is not None:
            executions = self.repository.get_job_executions(instance)
            if executions:
                last = executions[0]
                in_flight = self.node.store.in_flight(last.id)
                if in_flight and not last.status.is_running:
                    raise JobRestartError(
                        f"job {job.name!r} execution {last.id} ended {last.status.value} but "
                        f"{in_flight} of its partition(s) are still in flight; restart it once "
                        f"they finish or their nodes are removed from the cluster"
                    )
        return self.launcher.create_execution(job, params)

    def run_execution(self, job: Job, execution: JobExecution) -> JobExecution:
        """Run an execution made by :meth:`create_execution` with this node as master (lets a
        caller learn the execution id before the job runs)."""
        log.info(
            "node %s is master of job %s, execution %s", self.node.node_id, job.name, execution.id
        )
        try:
            self.node.store.insert_coordination(execution.id, self.node.node_id, COORD_CREATED)
        except Exception as exc:  # noqa: BLE001 - the partition step writes it then
            log.warning("could not record mastership of execution %s: %s", execution.id, exc)
        try:
            job.execute(execution, self.launcher.runtime)
        except OptimisticLockingFailureError:
            # A survivor abandoned the job while this master was away; its record stands.
            reloaded = self.repository.get_job_execution(execution.id)
            if reloaded is None:
                raise
            log.warning("job execution %s was abandoned by a survivor", execution.id)
            return reloaded
        except Exception as exc:
            # The job could not record its end (the database stopped answering): fail it once
            # the database answers, so it is not left STARTED under a master that lives on.
            log.error("job execution %s could not finish: %s", execution.id, exc)
            self._fail_when_possible(execution.id, f"master {self.node.node_id} failed: {exc}")
            raise
        return self._finish(execution)

    def _fail_when_possible(self, execution_id: int, message: str) -> None:
        from dbcluster.cluster.recovery import fail_job

        identity = self.node.identity
        while not identity.fenced.is_set():
            try:
                fail_job(self.node, execution_id, message[:2000])
                reloaded = self.repository.get_job_execution(execution_id)
                if reloaded is not None:
                    self._finish(reloaded)
                return
            except Exception as exc:  # noqa: BLE001 - wait for the database
                log.warning("cannot record the failure of execution %s yet: %s", execution_id, exc)
                time.sleep(self.settings.heartbeat_interval / 1000)

    def _finish(self, execution: JobExecution) -> JobExecution:
        """Close the coordination row once the job has ended (not when its partitioned step
        ends), so a master lost between steps still leaves a row that a survivor recovers."""
        status = COORD_COMPLETED if execution.status is BatchStatus.COMPLETED else COORD_FAILED
        if self.node.is_fenced:
            # A fenced master writes nothing more under its id. Closing the row here would hide
            # partitions still CLAIMED on other nodes from every survivor; left in flight, it is
            # abandoned (and they are failed) once this id is removed from the registry.
            log.warning(
                "master fenced: coordination of execution %s left to a survivor", execution.id
            )
            return execution
        try:
            if self.node.store.in_flight(execution.id):
                # Partitions still run under this execution (its monitor broke before they
                # ended); the row stays in flight so that, should this node go, a survivor fails
                # them. A restart is refused until they are gone.
                log.warning(
                    "execution %s ended with partitions in flight; coordination left open",
                    execution.id,
                )
                return execution
            self.node.store.set_coordination_status(
                execution.id, self.node.node_id, [COORD_CREATED, COORD_STARTED], status
            )
        except Exception as exc:  # noqa: BLE001 - a survivor closes it if we cannot
            log.warning("could not close coordination of execution %s: %s", execution.id, exc)
        return execution
