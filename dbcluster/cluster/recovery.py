"""Master failure: a survivor abandons a job whose master is gone, so it can be restarted.

Exactly one survivor wins the guarded claim of the coordination row (RECOVERING, owned by the
winner). Recovery is idempotent: if the winner dies mid-way, the row is RECOVERING with a master
that is gone, so another survivor claims it and starts over.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dbcluster.batch.domain import utcnow
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.cluster.handler import fail_step_execution
from dbcluster.cluster.store import StrandedJob
from dbcluster.dialects.base import (
    COORD_ABANDONED,
    COORD_COMPLETED,
    COORD_RECOVERING,
)

if TYPE_CHECKING:
    from dbcluster.cluster.node import Node

log = logging.getLogger("dbcluster.recovery")


def recover_stranded_jobs(node: Node) -> list[int]:
    """Abandon every in-flight job whose master is gone; returns the job execution ids this
    node abandoned."""
    abandoned: list[int] = []
    # A recovery this node started and could not finish (a transient error part-way) is its own
    # to finish: it is alive, so no survivor will pick the row up.
    for job in node.store.unfinished_recoveries(node.node_id):
        if node.is_fenced:
            return abandoned
        if _abandon_logged(node, job):
            abandoned.append(job.job_execution_id)
    for job in node.store.stranded_jobs():
        if node.is_fenced:
            break
        if not node.store.claim_stranded(job, node.node_id):
            continue
        if _abandon_logged(node, job):
            abandoned.append(job.job_execution_id)
    return abandoned


def _abandon_logged(node: Node, job: StrandedJob) -> bool:
    try:
        return abandon(node, job)
    except Exception as exc:  # noqa: BLE001 - the row stays RECOVERING; the next scan resumes it
        log.warning("recovery of job execution %s failed part-way: %s", job.job_execution_id, exc)
        return False


def fail_job(node: Node, job_execution_id: int, message: str) -> tuple[bool, int]:
    """Fail everything of a job execution that is still in flight: its partitions (so no late
    worker commits beside a restart), its running step executions and the execution itself.
    Returns (whether the execution was still running, how many partitions were failed)."""
    repository, provider = node.repository, node.store.provider
    execution = repository.get_job_execution(job_execution_id)
    if execution is None:
        return False, 0
    with node.coordination_engine.begin() as conn:
        failed_partitions = conn.execute(provider.fail_job_partitions(job_execution_id)).rowcount
    for se in repository.get_step_executions(execution):
        if se.status.is_running:
            fail_step_execution(repository, se.id, message)
    was_running = execution.status.is_running
    for _ in range(5):
        execution = repository.get_job_execution(job_execution_id)
        if execution is None or not execution.status.is_running:
            break
        execution.status = BatchStatus.FAILED
        execution.exit_status = ExitStatus.FAILED.with_description(message)  # type: ignore[attr-defined]
        execution.end_time = utcnow()
        try:
            repository.update_job_execution(execution)
            break
        except OptimisticLockingFailureError:
            continue
    return was_running, failed_partitions


def abandon(node: Node, job: StrandedJob) -> bool:
    store = node.store
    me = node.node_id
    lost = job.master_node if job.master_node != me else "(lost before this recovery resumed)"
    message = f"master node {lost} was lost; job abandoned by node {me}"
    # Whether or not the job already ended (a master that lost its row ends its job FAILED with
    # partitions still in flight), nothing may go on running under it: a late worker of this
    # execution would otherwise commit beside the restarted one.
    was_running, failed_partitions = fail_job(node, job.job_execution_id, message)
    if not was_running:
        # The job ended but its master left before closing the coordination row.
        store.set_coordination_status(job.job_execution_id, me, [COORD_RECOVERING], COORD_COMPLETED)
        return False
    if not store.set_coordination_status(
        job.job_execution_id, me, [COORD_RECOVERING], COORD_ABANDONED
    ):
        log.warning("node %s lost the recovery of job execution %s", me, job.job_execution_id)
        return False
    log.warning(
        "node %s abandoned job execution %s (master %s lost; %d partition(s) failed)",
        me,
        job.job_execution_id,
        lost,
        failed_partitions,
    )
    node._emit("abandoned", job_execution_id=job.job_execution_id, lost_master=lost)
    return True
