"""A partition a node's claim won, as its executor holds it until it ends."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dbcluster.batch.domain import StepExecution
from dbcluster.cluster.fencing import PartitionFence
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.store import PendingPartition

#: A task's states: claimed (waiting for a slot), running, being handed back, ended.
CLAIMED, RUNNING, RELEASING, DONE = "claimed", "running", "releasing", "done"


@dataclass
class Task:
    """A claimed partition under the identity that claimed it, through its states."""

    partition: PendingPartition
    identity: Identity
    state: str = CLAIMED
    step_execution: StepExecution | None = None
    #: The step execution as the claim left it (STARTED), when it could be built from the row.
    preloaded: StepExecution | None = None
    claimed_at: float = field(default_factory=time.monotonic)
    #: The fence its run holds (once it began).
    fence: PartitionFence | None = None
    #: Run before it was claimed (a wake-up carried its execution): its first transaction
    #: claims it (see :mod:`dbcluster.cluster.offers`).
    placed: bool = False
