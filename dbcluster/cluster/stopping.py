"""Stopping a job execution cluster-wide: the durable request, and how each node learns of it.

**The request** (:func:`request_stop`, ``Cluster.stop_execution``, ``dbcluster stop``) is one
guarded ``UPDATE`` of the job execution row: STARTING or STARTED becomes STOPPING; anything
else is refused (an unknown id, an execution that already ended). Its version is left alone, so
nobody's optimistic lock breaks; the master's own writes of a running status keep STOPPING (the
job repository's ``_UPDATE_RUNNING_JOB``), and its final write replaces it with the outcome.

**Learning of it** costs no round trip on the hot path: a chunk's transaction reads nothing
new. Each node runs :class:`StopRequests`, one service that every ``master_check_interval``
asks, with one read, which of the job executions it *watches* are STOPPING: those it runs
partitions of (the executor watches a partition's job while it runs) and those it is master of
(``Cluster.run_execution``). An idle node watches nothing and reads nothing. A job found
STOPPING gets ``JobExecution.stop_requested``; its steps (``StepExecution.should_stop``) end
STOPPED at their next chunk or tasklet boundary, committing their position with their end.

**Ending it.** A stopped partition's final transaction records the partition FAILED with its
step execution STOPPED (exit code STOPPED) under its fence, like any end. The master of a
partitioned step, once it sees the request, ends every partition no node claimed (PENDING:
partition FAILED, step execution STOPPED, one transaction under its mastership) and, instead
of moving a partition whose node was lost, ends it the same way. When nothing is in flight the
step aggregates STOPPED, no further step does work, and the job ends STOPPED (exit code
STOPPED). A master that takes a STOPPING job over reads the status and honours it. ``restart``
then runs every partition that did not complete from its last committed position.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from dbcluster.batch.domain import JobExecution
from dbcluster.batch.exceptions import NoSuchJobExecutionError
from dbcluster.cluster.service import Service
from dbcluster.errors import DbclusterError

if TYPE_CHECKING:
    from dbcluster.batch.repository import JobRepository
    from dbcluster.cluster.settings import ClusterSettings
    from dbcluster.cluster.store import CoordinationStore

log = logging.getLogger("dbcluster.stop")


class NothingToStopError(DbclusterError):
    """The execution has already ended: there is nothing to stop."""


def request_stop(
    store: CoordinationStore, repository: JobRepository, execution_id: int
) -> JobExecution:
    """Make a running job execution STOPPING (see the module doc); returns it as read after
    the request. Raises :class:`NoSuchJobExecutionError` for an unknown id and
    :class:`NothingToStopError` for an execution that already ended. Stopping a STOPPING
    execution again changes nothing and is not an error."""
    made = store.request_stop(execution_id)
    execution = repository.get_job_execution(execution_id)
    if execution is None:
        raise NoSuchJobExecutionError(f"there is no job execution with id {execution_id}")
    if not made and not execution.status.is_running:
        raise NothingToStopError(
            f"execution {execution_id} of job {execution.job_name!r} already ended "
            f"{execution.status.value}; there is nothing to stop (dbcluster restart "
            f"{execution_id} runs it again if it did not complete)"
        )
    if made:
        log.info("execution %s of job %s is STOPPING", execution_id, execution.job_name)
    return execution


class StopRequests(Service):
    """The node's watch over the job executions it works for (see the module doc)."""

    name = "stop-requests"

    def __init__(self, store: CoordinationStore, settings: ClusterSettings) -> None:
        super().__init__(settings.master_check_interval)
        self.store = store
        self._lock = threading.Lock()
        #: Watched executions by id; the same id may have several objects on one node (the
        #: master's and the one its partitions share), each listed once per watcher.
        self._watched: dict[int, list[JobExecution]] = {}
        self._warned = False

    def watch(self, execution: JobExecution) -> None:
        with self._lock:
            self._watched.setdefault(execution.id, []).append(execution)

    def unwatch(self, execution: JobExecution) -> None:
        with self._lock:
            watchers = self._watched.get(execution.id)
            if watchers is None:
                return
            for i, watched in enumerate(watchers):
                if watched is execution:
                    del watchers[i]
                    break
            if not watchers:
                del self._watched[execution.id]

    def watched(self) -> list[int]:
        with self._lock:
            return list(self._watched)

    def mark(self, execution_id: int) -> None:
        """Tell every watched object of ``execution_id`` that it is being stopped."""
        with self._lock:
            executions = list(self._watched.get(execution_id, ()))
        for execution in executions:
            if not execution.stop_requested:
                execution.stop_requested = True
                log.info("execution %s is being stopped: its steps here stop", execution_id)

    def run_once(self) -> None:
        ids = self.watched()
        if not ids:
            return
        try:
            stopping = self.store.stopping(ids)
        except Exception as error:  # noqa: BLE001 - the next turn asks again
            if self.unavailable(error):  # an outage: one WARNING for all of it
                return
            if not self._warned:
                log.warning("cannot read stop requests yet: %s", error)
                self._warned = True
            return
        self._warned = False
        for execution_id in stopping:
            self.mark(execution_id)
