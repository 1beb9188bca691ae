"""Job coordination (``batch_job_coordination``, ``batch_job_masters``): the row that makes a node
the master of an execution under an epoch, the master's fence (every write it makes is guarded
by its node and epoch), survivors claiming a stranded master's job, and the durable stop
request.

Everything here is portable Core; a provider overrides one only if its database cannot run it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Insert, Select, Update, and_, bindparam, select, update
from sqlalchemy.sql.elements import ColumnElement

from dbcluster import schema
from dbcluster.dialects.family import StatementFamily, insert_from
from dbcluster.schema import job_coordination, job_masters
from dbcluster.states import (
    COORD_CREATED,
    COORD_IN_FLIGHT,
    COORD_MASTERED,
    COORD_RECOVERING,
    COORD_STARTED,
    JOB_STARTED,
    JOB_STARTING,
    JOB_STOPPING,
)


class CoordinationStatements(StatementFamily):
    """The mastership's statements."""

    def insert_coordination(
        self,
        job_execution_id: Any,
        master_node: Any,
        status: str = COORD_CREATED,
        master_step_execution_id: Any = 0,
        worker_step_name: Any = "-",
        *,
        source: Any | None = None,
    ) -> Insert:
        """The row that makes a node the master of an execution, epoch 1. Written in the
        transaction that creates the execution, so no execution exists without an owner.
        ``source``: see :func:`insert_from`."""
        return insert_from(
            job_coordination,
            {
                "job_execution_id": job_execution_id,
                "master_node": master_node,
                "master_epoch": 1,
                "master_step_execution_id": master_step_execution_id,
                "worker_step_name": worker_step_name,
                "status": status,
                "created_time": self.now(),
                "updated_time": self.now(),
            },
            source,
        )

    def insert_master(
        self,
        job_execution_id: Any,
        epoch: int,
        master_node: Any,
        reason: str,
        *,
        source: Any | None = None,
    ) -> Insert:
        """One row of a job execution's master history (``source``: see
        :func:`insert_from`)."""
        return insert_from(
            job_masters,
            {
                "job_execution_id": job_execution_id,
                "master_epoch": epoch,
                "master_node": master_node,
                "reason": reason,
                "since": self.now(),
            },
            source,
        )

    # --- the master's fence ---------------------------------------------------------------------

    def _mastership(
        self, job_execution_id: int, master_node: str, epoch: int, statuses: Iterable[str]
    ) -> ColumnElement[bool]:
        return and_(
            job_coordination.c.job_execution_id == job_execution_id,
            job_coordination.c.master_node == master_node,
            job_coordination.c.master_epoch == epoch,
            job_coordination.c.status.in_(list(statuses)),
        )

    def hold_mastership(
        self,
        job_execution_id: int,
        master_node: str,
        epoch: int,
        statuses: Sequence[str] = COORD_MASTERED,
    ) -> Update:
        """The fence of a master's transaction (a job write, a step it runs itself, a placement,
        a reassignment): changes the coordination row only while this node is still the master
        of this epoch and the job is in flight. The master requires exactly one row; the lock
        then lasts until its ``COMMIT``, so a takeover or an abandonment (which update this row)
        is serialized with it."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, statuses))
            .values(updated_time=self.now())
        )

    def place_coordination(
        self,
        job_execution_id: int,
        master_node: str,
        epoch: int,
        master_step_execution_id: int,
        worker_step_name: str,
    ) -> Update:
        """Point the master's coordination row at the partitioned step it is placing (STARTED),
        under the same guard as :meth:`hold_mastership`."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, COORD_MASTERED))
            .values(
                master_step_execution_id=master_step_execution_id,
                worker_step_name=worker_step_name,
                status=COORD_STARTED,
                updated_time=self.now(),
            )
        )

    def finish_mastership(
        self, job_execution_id: int, master_node: str, epoch: int, status: str
    ) -> Update:
        """Close the coordination row (COMPLETED or FAILED) in the job's final transaction, under
        the mastership guard."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, COORD_MASTERED))
            .values(status=status, updated_time=self.now())
        )

    def set_coordination_status(
        self,
        job_execution_id: int,
        master_node: str,
        epoch: int,
        from_statuses: Sequence[str],
        to_status: str,
    ) -> Update:
        """Guarded on the master (and epoch) that owns the row, so one that lost it changes
        nothing."""
        return (
            update(job_coordination)
            .where(self._mastership(job_execution_id, master_node, epoch, from_statuses))
            .values(status=to_status, updated_time=self.now())
        )

    # --- stranded masters -----------------------------------------------------------------------

    def select_stranded_masters(self) -> Select[Any]:
        """Coordination rows in flight whose master node is gone from the registry."""
        return self._select_coordination(
            job_coordination.c.status.in_(COORD_IN_FLIGHT),
            self._node_gone(job_coordination.c.master_node),
        )

    def select_recovering_owned_by(self, node_id: str) -> Select[Any]:
        """Recoveries this node claimed but did not finish (it is alive, so no one else will)."""
        return self._select_coordination(
            job_coordination.c.status == COORD_RECOVERING,
            job_coordination.c.master_node == node_id,
        )

    @staticmethod
    def _select_coordination(*where: ColumnElement[bool]) -> Select[Any]:
        return (
            select(
                job_coordination.c.job_execution_id,
                job_coordination.c.master_node,
                job_coordination.c.master_epoch,
                job_coordination.c.master_step_execution_id,
                job_coordination.c.status,
            )
            .where(*where)
            .order_by(job_coordination.c.job_execution_id)
        )

    def claim_stranded_master(
        self, job_execution_id: int, lost_master: str, epoch: int, status: str, new_owner: str
    ) -> Update:
        """Exactly one survivor wins: the row still names the lost master, epoch and status
        read. The winner owns it RECOVERING under the next epoch, so anything the lost master
        still tries under its own epoch changes nothing."""
        return (
            update(job_coordination)
            .where(
                job_coordination.c.job_execution_id == job_execution_id,
                job_coordination.c.master_node == lost_master,
                job_coordination.c.master_epoch == epoch,
                job_coordination.c.status == status,
            )
            .values(
                status=COORD_RECOVERING,
                master_node=new_owner,
                master_epoch=job_coordination.c.master_epoch + 1,
                updated_time=self.now(),
            )
        )

    # --- stopping a job (dbcluster.cluster.stopping) --------------------------------------------

    def request_stop(self, job_execution_id: int, now: datetime) -> Update:
        """The durable stop request: a running job execution becomes STOPPING (from STARTING or
        STARTED only; the caller judges a row count of 0). Its version is left alone: the
        request is a flag every owner of the row honours, not a write that fences them (the
        master's own writes keep STOPPING, see the job repository)."""
        je = schema.job_execution
        return (
            update(je)
            .where(
                je.c.job_execution_id == job_execution_id,
                je.c.status.in_((JOB_STARTING, JOB_STARTED)),
            )
            .values(status=JOB_STOPPING, last_updated=now)
        )

    def select_stopping(self) -> Select[Any]:
        """Which of the job executions in the expanding parameter ``ids`` are STOPPING (a
        node's periodic check for the jobs it runs partitions of or masters)."""
        je = schema.job_execution
        return select(je.c.job_execution_id).where(
            je.c.job_execution_id.in_(bindparam("ids", expanding=True)),
            je.c.status == JOB_STOPPING,
        )
