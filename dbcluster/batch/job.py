"""Jobs: a flow of steps (an ordered list of steps is the simplest); see :mod:`.flow`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from dbcluster.batch.domain import JobExecution, utcnow
from dbcluster.batch.fence import FencedError
from dbcluster.batch.flow import Flow
from dbcluster.batch.flowrun import FlowRun
from dbcluster.batch.listeners import call_listeners
from dbcluster.batch.observe import observers
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step, describe_failure
from dbcluster.retry import brief

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)


def commit_job(
    job_execution: JobExecution,
    runtime: BatchRuntime,
    *,
    final: bool = False,
) -> None:
    """Write the job execution (and, when ``final``, its context) in one transaction that holds
    the job's fence, repeated on transient errors; an unclear commit is judged from the row's
    version. The final write records the job's end with its fence (``finish``)."""
    je = job_execution
    repository = runtime.repository
    version, updated = je.version, je.last_updated

    def body(conn: Connection) -> None:
        je.version, je.last_updated = version, updated
        if je.fence is not None:
            if final:
                je.fence.finish(conn, je)
            else:
                je.fence.hold(conn)
        if final:
            repository.update_job_execution_context(je, conn)
        repository.update_job_execution(je, conn)

    try:
        repository.transactions.run(
            body,
            verify=repository.job_version_is(je, version + 1),
            point="job.before_commit",
            what=f"job execution {je.id}",
            job_execution=je,
        )
    except BaseException:
        je.version, je.last_updated = version, updated
        raise


@dataclass(frozen=True)
class AutoRestart:
    """Restart, with nobody at the keyboard, an execution that ended FAILED for a cluster reason
    (exit code ``ABANDONED``: its master was lost and it was abandoned; ``NODE_LOST``: a
    partition was lost with its node): up to ``max_restarts`` times in a row per job instance,
    ``backoff`` seconds (or a timedelta) after it ended, doubled after each restart. A cluster
    node restarts it, as its master; a failure of the job's own never triggers it."""

    max_restarts: int = 3
    backoff: float | timedelta = 30.0

    @property
    def backoff_s(self) -> float:
        backoff = self.backoff
        return backoff.total_seconds() if isinstance(backoff, timedelta) else float(backoff)


#: Job-context key counting an execution's automatic restarts in a row.
AUTO_RESTARTS_KEY = "dbcluster.auto_restarts"


class Job:
    """A named flow of steps: ``Job(name, [a, b, c])`` runs them in order and stops at the first
    that does not complete; ``Job(name, flow)`` follows a :class:`~dbcluster.batch.flow.Flow`
    (transitions on exit status, deciders, splits).

    ``restartable``: a FAILED/STOPPED execution may be restarted. ``allow_start_if_complete``: a
    COMPLETED instance may run again (every step runs afresh). ``start_limit``: at most that many
    executions per job instance. ``auto_restart``: see :class:`AutoRestart` (off by default).
    ``incrementer``: makes the next run's parameters (``JobLauncher.next_parameters``,
    ``dbcluster launch --next``). ``validator``: checks the parameters of every launch
    (a :class:`~dbcluster.batch.parameters.ParametersValidator`, or any callable that raises
    :class:`~dbcluster.batch.exceptions.JobParametersError`).
    """

    def __init__(
        self,
        name: str,
        steps: Sequence[Step] | Flow,
        *,
        restartable: bool = True,
        allow_start_if_complete: bool = False,
        start_limit: int | None = None,
        listeners: Sequence[Any] = (),
        auto_restart: AutoRestart | None = None,
        incrementer: Any = None,
        validator: Any = None,
    ) -> None:
        if not name:
            raise ValueError("a job needs a name")
        if isinstance(steps, Flow):
            flow = steps
        else:
            if not steps:
                raise ValueError(f"job {name!r} needs at least one step")
            flow = Flow(name).start(steps[0])
            for step in steps[1:]:
                flow.next(step)
        flow.validate()
        seen: set[str] = set()
        for nested in flow.steps():
            if nested.name in seen:
                raise ValueError(f"job {name!r} has two steps named {nested.name!r}")
            seen.add(nested.name)
        self.name = name
        self.flow = flow
        #: The steps of a plain job, in order (every step of the flow, for a flow job).
        self.steps = list(steps) if not isinstance(steps, Flow) else flow.steps()
        self.restartable = restartable
        self.allow_start_if_complete = allow_start_if_complete
        self.start_limit = start_limit
        self.listeners = list(listeners)
        self.auto_restart = auto_restart
        self.incrementer = incrementer
        self.validator = validator

    def __repr__(self) -> str:
        return f"Job({self.name!r}, steps={[s.name for s in self.steps]!r})"

    def all_steps(self) -> list[Step]:
        return self.flow.steps()

    def validate_parameters(self, params: Any) -> None:
        """Run the job's validator, if it has one (raises JobParametersError)."""
        if self.validator is None:
            return
        key = getattr(self.incrementer, "key", None)
        if hasattr(self.validator, "validate"):
            # The incrementer's key is the job's own: no validator needs to list it.
            self.validator.validate(params, also_allowed=[key] if key else [])
        else:
            self.validator(params)

    def first_step(self) -> Step | None:
        """The step a first execution of this job starts with (None when its flow starts with a
        decision or a split): the launcher creates its execution with the job's, in one
        transaction."""
        start = self.flow.start_state
        if isinstance(start, Step) and start.start_limit != 0:
            return start
        return None

    def execute(
        self, job_execution: JobExecution, runtime: BatchRuntime, *, resume: bool = False
    ) -> None:
        """Run the flow, skipping what a previous (not COMPLETED) execution of the same instance
        completed and resuming on the path it took; record the outcome.

        ``resume``: the execution was started elsewhere (a cluster master that took over a job
        whose master was lost): the path this execution took is replayed, a step it left running
        goes on from its last commit (a partitioned step adopts the partitions in flight), and
        the rest of the flow runs, all in this same execution."""
        je = job_execution
        repository = runtime.repository
        if je.earlier is not None and not resume:
            previous = je.earlier  # read by the launcher when it created this execution
        else:
            previous = [e for e in repository.get_job_executions(je.job_instance) if e.id != je.id]
        restarting = bool(previous) and previous[0].status is not BatchStatus.COMPLETED
        own = repository.get_step_executions(je) if resume else []
        if je.status is BatchStatus.STOPPING:
            # Asked to stop before this process ran it (a master that took it over): it stays
            # STOPPING, and every step ends STOPPED at once.
            je.stop_requested = True
        if not (je.start_recorded and not resume):
            if je.start_time is None or not resume:
                je.start_time = utcnow()
            je.status = BatchStatus.STOPPING if je.stop_requested else BatchStatus.STARTED
            je.exit_status = ExitStatus.EXECUTING
            commit_job(je, runtime)
        observers.job_started(je)
        run = FlowRun(
            je,
            runtime,
            restarting=restarting,
            resume=resume,
            previous=previous[0] if restarting else None,
            own=own,
        )
        try:
            call_listeners(self.listeners, "before_job", je)
            result = run.run(self.flow)
            je.status, je.exit_status = result.status, result.exit_status
        except FencedError as lost:
            observers.job_ended(je, lost)
            raise  # this process no longer owns the job: it writes nothing more for it
        except Exception as error:
            log.warning("job %s (execution %s) failed: %s", self.name, je.id, brief(error))
            je.failure_exceptions.append(error)
            je.status = BatchStatus.FAILED
            je.exit_status = ExitStatus.FAILED.with_description(describe_failure(error))
        try:
            call_listeners(self.listeners, "after_job", je)
        except Exception as error:
            log.warning("after_job listener of %s failed: %s", self.name, error)
            je.failure_exceptions.append(error)
            je.status = BatchStatus.FAILED
            je.exit_status = je.exit_status.and_(
                ExitStatus.FAILED.with_description(describe_failure(error))
            )
        je.end_time = utcnow()
        with run.lock:
            run.save_path()
        try:
            commit_job(je, runtime, final=True)
        except BaseException as error:
            observers.job_ended(je, error)
            raise
        observers.job_ended(je, None)
