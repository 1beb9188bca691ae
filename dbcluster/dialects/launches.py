"""Launch requests and schedules (``batch_launch_requests``, ``batch_schedule_fires``): a job
submitted to the cluster waits PENDING until a node that accepts launches claims it (one node
wins each) and creates its execution; a schedule's tick fires once in the whole cluster, by the
primary key of its fire row.

Everything here is portable Core; a provider overrides one only if its database cannot run it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Insert, Select, Update, bindparam, func, insert, select, update

from dbcluster.dialects.family import StatementFamily
from dbcluster.schema import launch_requests, schedule_fires
from dbcluster.states import LAUNCH_CLAIMED, LAUNCH_LAUNCHED, LAUNCH_PENDING


class LaunchStatements(StatementFamily):
    """The launch requests' and schedules' statements."""

    # --- launch requests (``dbcluster submit``) -------------------------------------------------

    def insert_launch_request(self) -> Insert:
        """A PENDING launch request (bound ``job_name``, ``parameters``, ``next_run``)."""
        return insert(launch_requests).values(
            job_name=bindparam("b_job"),
            parameters=bindparam("b_params"),
            next_run=bindparam("b_next"),
            status=LAUNCH_PENDING,
            created_time=self.now(),
        )

    def select_pending_launches(self, job_names: Any, limit: int) -> Select[Any]:
        """The accepting node's poll: ids of PENDING requests for jobs it knows, oldest first."""
        return (
            select(launch_requests.c.request_id)
            .where(
                launch_requests.c.status == LAUNCH_PENDING,
                launch_requests.c.job_name.in_(job_names),
            )
            .order_by(launch_requests.c.request_id)
            .limit(limit)
        )

    def lock_pending_launches(self, request_ids: Any) -> Select[Any]:
        """In a claim's transaction: the polled requests still PENDING, locked where the database
        can skip rows another claimer holds (else a plain read; the guarded claim decides)."""
        stmt = select(launch_requests.c.request_id).where(
            launch_requests.c.request_id.in_(request_ids),
            launch_requests.c.status == LAUNCH_PENDING,
        )
        if self.skip_locked():
            return self.locked(stmt, skip_locked=True)
        return stmt

    def claim_launches(self, node_id: Any, request_ids: Any) -> Update:
        """PENDING -> CLAIMED by ``node_id``: a request changes state once, so one node wins it."""
        return (
            update(launch_requests)
            .where(
                launch_requests.c.request_id.in_(request_ids),
                launch_requests.c.status == LAUNCH_PENDING,
            )
            .values(status=LAUNCH_CLAIMED, claimed_by=node_id, claimed_time=self.now())
        )

    def select_claimed_launches(self, node_id: Any, request_ids: Any) -> Select[Any]:
        """What a claim won (read back in its transaction)."""
        return (
            select(
                launch_requests.c.request_id,
                launch_requests.c.job_name,
                launch_requests.c.parameters,
                launch_requests.c.next_run,
            )
            .where(
                launch_requests.c.request_id.in_(request_ids),
                launch_requests.c.claimed_by == node_id,
                launch_requests.c.status == LAUNCH_CLAIMED,
            )
            .order_by(launch_requests.c.request_id)
        )

    def end_launch(self, request_id: Any, node_id: Any, status: str) -> Update:
        """CLAIMED by ``node_id`` -> LAUNCHED (bound ``b_execution``, in the execution's creating
        transaction) or FAILED (bound ``b_error``); no row changes when the claim was lost."""
        values: dict[str, Any] = {"status": status}
        if status == LAUNCH_LAUNCHED:
            values["job_execution_id"] = bindparam("b_execution")
        else:
            values["error_message"] = bindparam("b_error")
        return (
            update(launch_requests)
            .where(
                launch_requests.c.request_id == request_id,
                launch_requests.c.claimed_by == node_id,
                launch_requests.c.status == LAUNCH_CLAIMED,
            )
            .values(**values)
        )

    def release_lost_launches(self) -> Update:
        """CLAIMED requests whose node is gone from the registry go back to PENDING: their claimer
        died before creating the execution (creating it marks the request LAUNCHED)."""
        return (
            update(launch_requests)
            .where(
                launch_requests.c.status == LAUNCH_CLAIMED,
                self._node_gone(launch_requests.c.claimed_by),
            )
            .values(status=LAUNCH_PENDING, claimed_by=None, claimed_time=None)
        )

    def select_lost_launch(self) -> Select[Any]:
        """Whether any request is CLAIMED by a node gone from the registry (one cheap read)."""
        return (
            select(launch_requests.c.request_id)
            .where(
                launch_requests.c.status == LAUNCH_CLAIMED,
                self._node_gone(launch_requests.c.claimed_by),
            )
            .limit(1)
        )

    def select_launch_request(self, request_id: Any) -> Select[Any]:
        return select(launch_requests).where(launch_requests.c.request_id == request_id)

    # --- schedules ------------------------------------------------------------------------------

    def insert_schedule_fire(self) -> Insert:
        """A tick's fire (bound ``b_name``, ``b_time``, ``b_request``, ``b_node``): its primary
        key (schedule, tick) lets one insert in the whole cluster succeed."""
        return insert(schedule_fires).values(
            schedule_name=bindparam("b_name"),
            fire_time=bindparam("b_time"),
            request_id=bindparam("b_request"),
            fired_by=bindparam("b_node"),
            fired_at=self.now(),
        )

    def select_last_fire(self, schedule_name: Any) -> Select[Any]:
        """A schedule's latest tick fired: one descent of the primary key (schedule, tick),
        however long its history."""
        return select(func.max(schedule_fires.c.fire_time).label("last")).where(
            schedule_fires.c.schedule_name == schedule_name
        )
