"""What a node runs in the background, that no caller of ``launch`` waits for: launch requests it
accepted (``dbcluster submit``), automatic restarts of failed executions, and jobs it took over
from a lost master. Each runs on a thread of its own with this node as the job's master, through
the same ``create_execution`` and ``run_execution`` as a launch (:class:`Executions`: the
cluster); the node's services (:mod:`dbcluster.cluster.maintenance`) call these hooks."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution
from dbcluster.batch.exceptions import (
    JobExecutionAlreadyRunningError,
    JobInstanceAlreadyCompleteError,
    JobRestartError,
)
from dbcluster.batch.fence import FencedError
from dbcluster.batch.job import AUTO_RESTARTS_KEY, AutoRestart, Job
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.launches import LaunchClaimLostError, LaunchRequest
from dbcluster.cluster.mastership import Mastership
from dbcluster.cluster.patience import Patience
from dbcluster.cluster.store import StrandedJob

if TYPE_CHECKING:
    from dbcluster.batch.launcher import JobLauncher
    from dbcluster.batch.registry import JobRegistry
    from dbcluster.batch.repository import JobRepository
    from dbcluster.cluster.context import NodeContext
    from dbcluster.cluster.launches import LaunchStore

log = logging.getLogger("dbcluster.cluster")

#: How often a ``next_run`` launch makes its parameters again when another node's run took them.
NEXT_RUN_ATTEMPTS = 5


class Executions(Protocol):
    """How a job execution is made and run with this node as its master (the cluster)."""

    def create_execution(self, job: Job, params: Any, **kwargs: Any) -> JobExecution: ...

    def run_execution(
        self, job: Job, execution: JobExecution, *, resume: bool = False
    ) -> JobExecution: ...


class BackgroundRuns:
    """The node's hooks for runs in the background (a
    :class:`~dbcluster.cluster.maintenance.launches.Launcher`, a
    :class:`~dbcluster.cluster.maintenance.restarter.Relauncher` and a
    :class:`~dbcluster.cluster.maintenance.stranded.Takeover`): each run is made and run by
    ``executions``, on a thread of its own."""

    def __init__(
        self,
        context: NodeContext,
        registry: JobRegistry,
        repository: JobRepository,
        launcher: JobLauncher,
        launches: LaunchStore,
        executions: Executions,
    ) -> None:
        self.context = context
        self.membership = context.membership
        self.events = context.events
        self.registry = registry
        self.repository = repository
        self.launcher = launcher
        self.launches = launches
        self.executions = executions
        self._lock = threading.Lock()
        self._launching: set[int] = set()
        self._relaunching: set[int] = set()
        self._taking_over: set[int] = set()

    def _once_on_thread(
        self, running: set[int], key: int, name: str, target: Callable[..., None], *args: Any
    ) -> None:
        """Run ``target(*args)`` on a daemon thread of its own, unless one for ``key`` is
        still running (``running`` holds their keys until they end)."""
        with self._lock:
            if key in running:
                return
            running.add(key)

        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    running.discard(key)

        threading.Thread(target=run, name=name, daemon=True).start()

    # --- launch requests (dbcluster.cluster.maintenance.launches.LaunchAcceptor) ---------------

    def accepted_jobs(self) -> list[str]:
        return self.registry.job_names()

    def launches_running(self) -> int:
        with self._lock:
            return len(self._launching)

    def launch_request(self, request: LaunchRequest, identity: Identity) -> None:
        self._once_on_thread(
            self._launching,
            request.request_id,
            f"dbcluster-launch-{request.request_id}",
            self._launch_request,
            request,
            identity,
        )

    def _launch_request(self, request: LaunchRequest, identity: Identity) -> None:
        """Create the request's execution (marking the request LAUNCHED in that transaction,
        guarded by this node's claim), then run it as its master. A launch that fails before
        its execution exists marks the request FAILED; one whose claim was lost (this node was
        removed meanwhile) changes nothing."""
        node_id = identity.node_id
        execution: JobExecution | None = None
        try:
            with self.context.masters.mastering():
                if identity is not self.membership.current or identity.is_fenced:
                    return  # the claim goes back to PENDING once the old id is removed
                job = self.registry.get_job(request.job_name)
                execution = self._create_requested(job, request, node_id)
                self.events.launch_started(node_id, request.request_id, execution.id)
                log.info(
                    "launch request %d: node %s is master of execution %s",
                    request.request_id,
                    node_id,
                    execution.id,
                )
                ended = self.executions.run_execution(job, execution)
                log.info(
                    "launch request %d: execution %s ended %s",
                    request.request_id,
                    ended.id,
                    ended.status.value,
                )
        except LaunchClaimLostError as lost:
            log.warning("launch request %d: %s", request.request_id, lost)
        except Exception as error:  # noqa: BLE001 - recorded on the request (or the execution)
            if execution is not None:
                log.exception("launched execution %s failed", execution.id)
                return
            message = f"{type(error).__name__}: {error}"
            log.warning("launch request %d failed: %s", request.request_id, message)
            try:
                if self.launches.mark_failed(request.request_id, node_id, message):
                    self.events.launch_failed(node_id, request.request_id, message)
            except Exception:  # noqa: BLE001 - it stays CLAIMED; a removal puts it back
                log.exception(
                    "could not record the failure of launch request %d", request.request_id
                )

    def _create_requested(self, job: Job, request: LaunchRequest, node_id: str) -> JobExecution:
        def mark(conn: Connection, execution: JobExecution) -> None:
            self.launches.mark_launched(conn, request.request_id, node_id, execution.id)

        attempts = NEXT_RUN_ATTEMPTS if request.next_run else 1
        for attempt in range(attempts):
            params = request.parameters
            if request.next_run:
                params = self.launcher.next_parameters(job, params)
            try:
                return self.executions.create_execution(job, params, on_created=mark)
            except (JobExecutionAlreadyRunningError, JobInstanceAlreadyCompleteError):
                # Another node's next run took these parameters first: make them again.
                if attempt + 1 >= attempts:
                    raise
        raise AssertionError("unreachable")

    # --- automatic restarts (dbcluster.cluster.maintenance.restarter.Relauncher) --------------

    def auto_restart_policies(self) -> dict[str, AutoRestart]:
        return {
            name: job.auto_restart
            for name in self.registry.job_names()
            if (job := self.registry.get_job(name)).auto_restart is not None
        }

    def relaunch(self, execution: JobExecution, restarts: int) -> None:
        self._once_on_thread(
            self._relaunching,
            execution.id,
            f"dbcluster-restart-{execution.id}",
            self._relaunch,
            execution,
            restarts,
        )

    def _relaunch(self, old: JobExecution, restarts: int) -> None:
        try:
            job = self.registry.get_job(old.job_name)
            with self.context.masters.mastering():
                new = self.executions.create_execution(
                    job,
                    old.parameters,
                    context=ExecutionContext({AUTO_RESTARTS_KEY: restarts}),
                    after=old.id,
                )
                self.events.restarted(self.membership.identity.node_id, old.id, new.id)
                ended = self.executions.run_execution(job, new)
            log.info(
                "automatic restart %d of execution %s: execution %s ended %s",
                restarts,
                old.id,
                ended.id,
                ended.status.value,
            )
        except (JobRestartError, JobExecutionAlreadyRunningError, JobInstanceAlreadyCompleteError):
            log.info("execution %s was restarted by another node", old.id)
        except Exception:  # noqa: BLE001 - the next scan tries again
            log.exception("automatic restart of execution %s failed", old.id)

    # --- takeover (dbcluster.cluster.maintenance.stranded.Takeover) --------------------------

    def can_take_over(self, job_execution_id: int) -> bool:
        execution = self.repository.get_job_execution(job_execution_id)
        return (
            execution is not None
            and execution.status.is_running
            and execution.job_name in self.registry.job_names()
        )

    def taking_over(self, job_execution_id: int) -> bool:
        with self._lock:
            return job_execution_id in self._taking_over

    def take_over(self, job: StrandedJob, identity: Identity, lost_master: str) -> None:
        self._once_on_thread(
            self._taking_over,
            job.job_execution_id,
            f"dbcluster-takeover-{job.job_execution_id}",
            self._run_taken_over,
            job,
            identity,
            lost_master,
        )

    def _run_taken_over(self, job: StrandedJob, identity: Identity, lost_master: str) -> None:
        store = self.context.store
        mastership = Mastership(store, job.job_execution_id, identity, job.master_epoch)
        try:
            with self.context.masters.mastering():
                started = Patience.of(self.context).run(
                    mastership, lambda: store.start_mastership(job), "take over its job"
                )
                if not started:
                    log.warning("node %s lost the takeover of execution %s", identity.node_id, job)
                    return
                execution = self.repository.get_job_execution(job.job_execution_id)
                assert execution is not None
                execution.fence = mastership
                self.events.took_over(
                    identity.node_id, job.job_execution_id, lost_master, job.master_epoch
                )
                ended = self.executions.run_execution(
                    self.registry.get_job(execution.job_name), execution, resume=True
                )
                log.info(
                    "job execution %s, taken over by node %s, ended %s",
                    ended.id,
                    identity.node_id,
                    ended.status.value,
                )
        except FencedError:
            log.warning("node %s lost execution %s it was taking over", identity.node_id, job)
        except Exception:  # noqa: BLE001 - the row stays this node's; a survivor recovers it
            log.exception("takeover of job execution %s failed", job.job_execution_id)
