"""Reads that judge a guarded transition whose commit's outcome was unclear: does the row read
now as that transition leaves it? (Each is a ``verify`` for
:meth:`~dbcluster.cluster.store.connector.Connector.transaction`.)"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.engine import Connection

from dbcluster.schema import job_coordination, partitions


def partition_is(
    step_execution_id: int, status: str, node_id: str | None, attempt: int
) -> Callable[[Connection], bool]:
    """Whether the partition is ``status`` on ``node_id`` under ``attempt``."""

    def verify(conn: Connection) -> bool:
        row = conn.execute(
            select(partitions.c.status, partitions.c.assigned_node, partitions.c.attempt).where(
                partitions.c.step_execution_id == step_execution_id
            )
        ).first()
        return row is not None and tuple(row) == (status, node_id, attempt)

    return verify


def coordination_is(
    job_execution_id: int, status: str, master_node: str, master_epoch: int
) -> Callable[[Connection], bool]:
    """Whether the job's coordination row is ``status`` under ``master_node`` and its epoch."""

    def verify(conn: Connection) -> bool:
        row = conn.execute(
            select(
                job_coordination.c.status,
                job_coordination.c.master_node,
                job_coordination.c.master_epoch,
            ).where(job_coordination.c.job_execution_id == job_execution_id)
        ).first()
        return row is not None and tuple(row) == (status, master_node, master_epoch)

    return verify
