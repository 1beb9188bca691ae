"""The entry point: a node for a job registry and a URL, and ``launch`` to be a job's master.

:class:`Cluster` builds the node (:mod:`dbcluster.cluster.node`, which wires the node's own
services) and the master's parts on the node's context: the partition handler, the launcher and
the background runs that the node's services hand work to."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from sqlalchemy import Connection, Engine

from dbcluster import points
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution
from dbcluster.batch.exceptions import (
    NoSuchJobExecutionError,
)
from dbcluster.batch.fence import FencedError
from dbcluster.batch.job import Job, commit_job
from dbcluster.batch.launcher import JobLauncher
from dbcluster.batch.parameters import JobParameters, as_job_parameters
from dbcluster.batch.registry import JobRegistry
from dbcluster.cluster.assignment import AssignmentStrategy
from dbcluster.cluster.background import BackgroundRuns
from dbcluster.cluster.creation import ExecutionCreation, placed_at_launch
from dbcluster.cluster.handler import ClusterPartitionHandler
from dbcluster.cluster.mastership import Mastership
from dbcluster.cluster.node import Node
from dbcluster.cluster.patience import is_connectivity_error
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.stopping import request_stop
from dbcluster.dialects import make_engine
from dbcluster.migrations import require_current_schema
from dbcluster.retry import Retry, brief, quietly, warn_once
from dbcluster.states import COORD_MASTERED

log = logging.getLogger("dbcluster.cluster")


class Cluster:
    """This process's membership of the cluster.

    ``with Cluster(url, registry) as cluster: cluster.launch("job", {"date": "..."})`` joins as
    a node (running partitions unless ``work=False``), launches the job with this node as its
    master, and leaves gracefully at the end. Unless ``take_over=False``, the node also becomes
    the master of jobs whose master was lost (``master_failover = takeover``).
    """

    def __init__(
        self,
        url_or_engine: str | Engine,
        registry: JobRegistry,
        settings: ClusterSettings | None = None,
        *,
        work: bool = True,
        strategy: AssignmentStrategy | None = None,
        take_over: bool = True,
        accept_launches: bool = False,
        max_launches: int = 16,
    ) -> None:
        self.engine = (
            make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
        )
        self._owns_engine = isinstance(url_or_engine, str)
        self.registry = registry
        self._holds_resources = False
        self.settings = settings or ClusterSettings.from_env()
        self.node = Node(
            self.engine,
            registry,
            self.settings,
            capacity=self.settings.concurrency_limit if work else 0,
        )
        #: The node's repository: its transactions ride out transient errors and give up once
        #: the node is fenced.
        self.repository = self.node.repository
        self.context = self.node.context
        self.handler = ClusterPartitionHandler(
            self.context, self.repository, strategy, offer=self.node.offer
        )
        # A job step's child job is a job of its own on the cluster: its coordination row names
        # this node its master, so a survivor takes it over like any other.
        self.launcher = JobLauncher(
            self.repository, self.handler, registry, child_executions=self._create_child_execution
        )
        self.launches = self.node.launches
        #: Launch requests, automatic restarts and takeovers this node runs as their master.
        self.background = BackgroundRuns(
            self.context, registry, self.repository, self.launcher, self.launches, self
        )
        #: Whether this node becomes the master of jobs whose master was lost (a process that
        #: ends with its own job, such as ``dbcluster launch``, does not).
        self.node.takeover = self.background if take_over else None
        self.node.relauncher = self.background if take_over else None
        #: Whether this node claims launch requests and fires the registry's schedules.
        self.accept_launches = accept_launches
        if accept_launches:
            self.node.launcher = self.background
            self.node.max_launches = max_launches

    def start(self) -> Cluster:
        # Once, before joining: a node on another schema version would fail later, mid-job.
        require_current_schema(self.engine)
        self.node.start()
        if not self._holds_resources:
            self.registry.resources.hold()
            self._holds_resources = True
        return self

    def stop(self, drain_timeout_ms: int | None = None) -> None:
        self.node.stop(drain_timeout_ms)
        if self._holds_resources:  # the application's resources, once no step runs here
            self._holds_resources = False
            self.registry.resources.release()
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

    def submit(
        self,
        job: Job | str,
        params: JobParameters | Mapping[str, Any] | None = None,
        *,
        next_run: bool = False,
    ) -> int:
        """Ask the cluster to run the job: a launch request that a node accepting launches
        claims and runs as its master (this one too, if it accepts them). Returns the request's
        id (``dbcluster submit``). The parameters are validated here unless ``next_run`` (then
        the accepting node makes them from the job's last run, as ``launch --next`` does)."""
        job = self._job(job)
        parameters = as_job_parameters(params)
        if not next_run:
            job.validate_parameters(parameters)
        elif job.incrementer is None:
            self.launcher.next_parameters(job, parameters)  # raises the one-line reason
        return self.launches.submit(job.name, parameters, next_run=next_run)

    def _create_child_execution(
        self, job: Job, params: JobParameters, context: ExecutionContext | None
    ) -> JobExecution:
        return self.create_execution(job, params, context=context)

    def restart(self, execution_id: int) -> JobExecution:
        """Run a FAILED or ABANDONED execution's instance again (only unfinished partitions)."""
        old = self.repository.get_job_execution(execution_id)
        if old is None:
            raise NoSuchJobExecutionError(f"there is no job execution with id {execution_id}")
        job = self.registry.get_job(old.job_name)
        return self.run_execution(job, self.create_execution(job, old.parameters, existing=True))

    def create_execution(
        self,
        job: Job,
        params: JobParameters,
        *,
        context: ExecutionContext | None = None,
        after: int | None = None,
        on_created: Callable[[Connection, JobExecution], None] | None = None,
        existing: bool = False,
    ) -> JobExecution:
        """The launcher's checks, plus one of the cluster's: an instance whose last execution
        still has partitions in flight (PENDING or CLAIMED on some node) cannot run again yet,
        or a partition could run in both executions at once.

        The execution and its coordination row (this node its master, epoch 1) are created in
        one transaction, so no execution ever exists without an owner that survivors can see.
        ``after``: the execution is created only if that one is still the instance's newest
        (an automatic restart, which another node may have made first). ``on_created(conn,
        execution)`` runs last in the creating transaction (a launch request is marked there).
        ``existing``: the instance exists (a restart; implied by ``after``).
        """
        creation = ExecutionCreation(
            self.node.store,
            self.node.identity,
            self.launcher,
            self.handler.placer,
            job,
            params,
            placing=placed_at_launch(job, self.node.store, self.handler, self.launcher),
            context=context,
            after=after,
            on_created=on_created,
            existing=existing,
        )
        execution = creation.create()
        points.reach("master.after_create_execution", job_execution=execution)
        return execution

    def run_execution(
        self, job: Job, execution: JobExecution, *, resume: bool = False
    ) -> JobExecution:
        """Run an execution made by :meth:`create_execution` with this node as master (lets a
        caller learn the execution id before the job runs). Returns the execution once it has
        ended: if this node loses the mastership on the way (fenced, paused past the cleanup
        threshold), it follows the job to its end under its new master."""
        mastership = execution.fence
        assert isinstance(mastership, Mastership), "made by Cluster.create_execution"
        log.info(
            "node %s is master of job %s, execution %s (epoch %d)",
            mastership.node_id,
            job.name,
            execution.id,
            mastership.epoch,
        )
        stop_requests = self.node.stop_requests
        stop_requests.watch(execution)
        try:
            job.execute(execution, self.launcher.runtime, resume=resume)
        except FencedError as lost:
            return self._after_losing(execution, mastership, lost)
        except Exception as error:
            if mastership.fenced:
                return self._after_losing(execution, mastership, error)
            if not execution.status.is_running and is_connectivity_error(error):
                # The job ended but its last write did not land within the retry budget: keep
                # writing it while this node is the master.
                return self._finish_patiently(execution, mastership)
            raise
        finally:
            stop_requests.unwatch(execution)
        return execution

    def stop_execution(self, execution_id: int) -> JobExecution:
        """Stop a running job execution cluster-wide (see :mod:`dbcluster.cluster.stopping`):
        it becomes STOPPING at once, in the database; every partition of it, on every node,
        stops at its next chunk boundary or tasklet call with its position committed, and its
        master ends it STOPPED (wait with :meth:`follow`). Returns the execution as read after
        the request. Raises ``NoSuchJobExecutionError`` for an unknown id and
        ``NothingToStopError`` for an execution that already ended."""
        execution = request_stop(self.node.store, self.repository, execution_id)
        # This node learns of it now rather than at its next check.
        self.node.stop_requests.mark(execution_id)
        return execution

    def _finish_patiently(self, execution: JobExecution, mastership: Mastership) -> JobExecution:
        """Write the job's end until it lands (every heartbeat interval, one WARNING), while
        this node is its master; once it is not, follow the job under its new master."""
        writing = Retry.every(
            self.settings.heartbeat_interval / 1000,
            is_connectivity_error,
            give_up=lambda: mastership.fenced,
            on_retry=warn_once(log),
        )
        try:
            writing.call(
                lambda: commit_job(execution, self.launcher.runtime, final=True),
                f"cannot record the end of execution {execution.id}",
            )
            return execution
        except FencedError as lost:
            return self._after_losing(execution, mastership, lost)
        except Exception as error:
            if mastership.fenced:
                return self._after_losing(execution, mastership, error)
            raise

    def _after_losing(
        self, execution: JobExecution, mastership: Mastership, why: BaseException
    ) -> JobExecution:
        """This node is no longer the master (fenced, or a survivor took the row): it wrote
        nothing after that. It follows the job to its end under whoever owns it now."""
        log.warning(
            "node %s lost the mastership of execution %s: %s",
            mastership.node_id,
            execution.id,
            brief(why),
        )
        return self.follow(execution.id, mastership)

    def follow(self, execution_id: int, mastership: Mastership | None = None) -> JobExecution:
        """Wait for an execution to end, reporting progress (``handler.progress``) and the
        master that runs it now; returns it as recorded at its end."""
        store, interval = self.node.store, self.settings.master_check_interval / 1000
        announced: tuple[str, int] | None = (
            None if mastership is None else (mastership.node_id, mastership.epoch)
        )

        def waits_out(error: BaseException) -> bool:
            return is_connectivity_error(error) or store.provider.is_transient(error)

        # A look that fails on the database is simply taken again at the next interval.
        looking = Retry.every(interval, waits_out, on_retry=quietly)
        while True:
            execution, row = looking.call(lambda: self._look_at(execution_id), "follow")
            master = None if row is None else (str(row.master_node), int(row.master_epoch))
            if master is not None and master != announced and row.status in COORD_MASTERED:
                log.warning(
                    "the mastership of execution %s moved to node %s (epoch %d)",
                    execution_id,
                    *master,
                )
                announced = master
            if not execution.status.is_running:
                return execution
            if row is not None and row.master_step_execution_id and self.handler.progress:
                step_id = int(row.master_step_execution_id)
                counts = looking.call(partial(store.counts, step_id), "follow")
                self.handler.progress(step_id, counts)
            time.sleep(interval)

    def _look_at(self, execution_id: int) -> tuple[JobExecution, Any]:
        """An execution and its coordination row (None once it is gone), as read now."""
        execution = self.repository.get_job_execution(execution_id)
        row = self.node.store.coordination(execution_id)
        if execution is None:
            raise NoSuchJobExecutionError(f"job execution {execution_id} is gone")
        return execution, row
