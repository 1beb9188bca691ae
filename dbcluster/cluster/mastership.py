"""Mastership of one job execution: the coordination row, held at commit time under an epoch.

The node that launches a job is its master under epoch 1. Every transaction the master commits for
the job (its job-execution writes, the steps it runs itself, placing a partitioned step's
partitions, moving or failing orphans) first holds the coordination row with a guarded
``UPDATE`` on (execution, master node, epoch, in flight) that must change exactly one row. A
survivor that claims a stranded job moves the row to its own node under the next epoch in one
guarded ``UPDATE`` of the same row, so an old master that wakes up either committed before the
claim or commits nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam

from dbcluster.batch.domain import JobExecution
from dbcluster.batch.fence import FencedError
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.identity import Identity
from dbcluster.states import COORD_COMPLETED, COORD_FAILED

if TYPE_CHECKING:
    from dbcluster.cluster.store import CoordinationStore


class MastershipLostError(FencedError):
    """This node is no longer the master of the job execution (its identity was fenced, or the
    coordination row moved to another node or epoch)."""


class Mastership:
    """This node's mastership of ``job_execution_id`` under ``epoch``: a
    :class:`~dbcluster.batch.fence.Fence` for every master write."""

    def __init__(
        self,
        store: CoordinationStore,
        job_execution_id: int,
        identity: Identity,
        epoch: int = 1,
    ) -> None:
        self.store = store
        self.provider = store.provider
        self.job_execution_id = job_execution_id
        self.identity = identity
        self.epoch = epoch

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def fenced(self) -> bool:
        return self.identity.is_fenced

    def lost(self, why: str) -> MastershipLostError:
        return MastershipLostError(
            f"node {self.node_id} is no longer the master of job execution "
            f"{self.job_execution_id} (epoch {self.epoch}): {why}"
        )

    def check(self) -> None:
        """Refuse at once, without the database, once this node's identity is fenced."""
        if self.identity.is_fenced:
            raise self.lost(f"the node is fenced ({self.identity.fence_reason})")

    def _guard(self) -> dict[str, Any]:
        return {"b_id": self.job_execution_id, "b_node": self.node_id, "b_epoch": self.epoch}

    def hold(self, conn: Connection) -> None:
        self.check()
        provider = self.provider
        held = self.store.run(
            conn,
            "hold mastership",
            lambda: provider.hold_mastership(
                bindparam("b_id"), bindparam("b_node"), bindparam("b_epoch")
            ),
            self._guard(),
        )
        if held != 1:
            raise self.lost("its coordination row moved")

    def finish(self, conn: Connection, execution: Any) -> None:
        """A job's final write closes the coordination row with the job's outcome; any other
        execution's final write only holds it."""
        if not isinstance(execution, JobExecution):
            self.hold(conn)
            return
        self.check()
        status = COORD_COMPLETED if execution.status is BatchStatus.COMPLETED else COORD_FAILED
        provider = self.provider
        finished = self.store.run(
            conn,
            ("finish mastership", status),
            lambda: provider.finish_mastership(
                bindparam("b_id"), bindparam("b_node"), bindparam("b_epoch"), status
            ),
            self._guard(),
        )
        if finished != 1:
            raise self.lost("its coordination row moved")

    def place(self, conn: Connection, master_step_execution_id: int, worker_step: str) -> None:
        """Hold the row while pointing it at the partitioned step being placed (STARTED)."""
        self.check()
        provider = self.provider
        placed = self.store.run(
            conn,
            "place coordination",
            lambda: provider.place_coordination(
                bindparam("b_id"),
                bindparam("b_node"),
                bindparam("b_epoch"),
                bindparam("b_master"),
                bindparam("b_worker_step"),
            ),
            {**self._guard(), "b_master": master_step_execution_id, "b_worker_step": worker_step},
        )
        if placed != 1:
            raise self.lost("its coordination row moved")
