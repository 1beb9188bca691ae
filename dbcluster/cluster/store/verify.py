"""Reads that judge a guarded transition whose commit's outcome was unclear: does the row read
now as that transition leaves it? (Each is a ``verify`` for
:meth:`~dbcluster.cluster.store.connector.Connector.transaction`.) Each is a locking read
(``locked``: the provider's), so it waits for a transaction still committing the row and reads
the latest committed state, never a stale snapshot: behind a pooler, or on MySQL and MariaDB,
nothing ends the session that sent the unclear COMMIT before the read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.engine import Connection

from dbcluster.schema import job_coordination, partitions

#: A read made a locking read (a provider's ``locked``).
Locked = Callable[[Select[Any]], Select[Any]]


def partition_is(
    step_execution_id: int, status: str, node_id: str | None, attempt: int, locked: Locked
) -> Callable[[Connection], bool]:
    """Whether the partition is ``status`` on ``node_id`` under ``attempt``."""
    read = locked(
        select(partitions.c.status, partitions.c.assigned_node, partitions.c.attempt).where(
            partitions.c.step_execution_id == step_execution_id
        )
    )

    def verify(conn: Connection) -> bool:
        row = conn.execute(read).first()
        return row is not None and tuple(row) == (status, node_id, attempt)

    return verify


def coordination_is(
    job_execution_id: int, status: str, master_node: str, master_epoch: int, locked: Locked
) -> Callable[[Connection], bool]:
    """Whether the job's coordination row is ``status`` under ``master_node`` and its epoch."""
    read = locked(
        select(
            job_coordination.c.status,
            job_coordination.c.master_node,
            job_coordination.c.master_epoch,
        ).where(job_coordination.c.job_execution_id == job_execution_id)
    )

    def verify(conn: Connection) -> bool:
        row = conn.execute(read).first()
        return row is not None and tuple(row) == (status, master_node, master_epoch)

    return verify
