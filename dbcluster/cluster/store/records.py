"""What the store reads back: the rows of nodes, partitions and stranded jobs, as records."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import RowMapping


class NodeRemovedError(RuntimeError):
    """The node's registry row is gone: it was declared dead and must fence itself."""


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    host: str
    status: str
    current_load: int
    capacity: int
    last_heartbeat: datetime | None = None


@dataclass(frozen=True)
class PendingPartition:
    step_execution_id: int
    job_execution_id: int
    master_step_execution_id: int
    partition_name: str
    attempt: int
    transferable: bool
    worker_step_name: str
    max_attempts: int = 1


@dataclass(frozen=True)
class ClaimedPartition:
    """A partition a claim won, with its step execution's row as the claim left it (STARTED)."""

    partition: PendingPartition
    row: RowMapping


@dataclass(frozen=True)
class OrphanedPartition:
    step_execution_id: int
    partition_name: str
    assigned_node: str | None
    attempt: int
    status: str
    transferable: bool
    #: When it was put back for another try (None: not a retry), and the database clock now.
    retried_at: datetime | None = None
    db_now: datetime | None = None

    def due(self, backoff_ms: int) -> bool:
        """Whether it may be placed now (a retry waits out its backoff)."""
        if self.retried_at is None or self.db_now is None:
            return True
        return (self.db_now - self.retried_at).total_seconds() * 1000 >= backoff_ms


@dataclass(frozen=True)
class StalledPartition:
    step_execution_id: int
    partition_name: str
    assigned_node: str
    attempt: int
    max_attempts: int
    transferable: bool


@dataclass(frozen=True)
class StrandedJob:
    job_execution_id: int
    master_node: str
    master_epoch: int
    master_step_execution_id: int
    status: str
