"""Launch requests and schedule fires: the statements of ``submit``, of the nodes that accept
launches, and of the scheduler, each one short transaction judged by its row counts.

A request is PENDING until one accepting node wins the guarded claim (PENDING -> CLAIMED by
it). That node marks it LAUNCHED in the transaction that creates the job's execution (guarded by
its claim), so an execution exists exactly when its request says LAUNCHED: a claimer that died
before creating it leaves the request CLAIMED by a node gone from the registry, and any
accepting node puts it back to PENDING. A launch that fails records FAILED with the error.

A schedule's tick fires through one insert into ``batch_schedule_fires`` (primary key: schedule,
tick), in the transaction that inserts its launch request: the one insert the database accepts
in the whole cluster is the tick's only request.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from dbcluster.batch.parameters import JobParameters
from dbcluster.cluster.store import CoordinationStore
from dbcluster.errors import DbclusterError
from dbcluster.states import LAUNCH_FAILED, LAUNCH_LAUNCHED

log = logging.getLogger("dbcluster.launches")


class LaunchClaimLostError(DbclusterError):
    """The request is no longer claimed by this node (it was put back and taken by another)."""


@dataclass(frozen=True)
class LaunchRequest:
    request_id: int
    job_name: str
    parameters: JobParameters
    next_run: bool


def encode_parameters(params: JobParameters) -> str:
    """Parameters as JSON text: a list in the syntax :meth:`JobParameters.parse` reads."""
    return json.dumps(params.to_strings())


def decode_parameters(text: str) -> JobParameters:
    return JobParameters.parse(json.loads(text))


class LaunchStore:
    """Launch requests and schedule fires on a :class:`CoordinationStore`'s engines."""

    def __init__(self, store: CoordinationStore) -> None:
        self.store = store
        self.provider = store.provider

    def db_now(self) -> datetime:
        now = self.store.db_now()
        return now.replace(tzinfo=None)

    # --- submit ---------------------------------------------------------------------------------

    def _insert(
        self, conn: Connection, job_name: str, params: JobParameters, next_run: bool
    ) -> int:
        stmt = self.store.prepared("launch insert", self.provider.insert_launch_request)
        result = conn.execute(
            stmt, {"b_job": job_name, "b_params": encode_parameters(params), "b_next": next_run}
        )
        return int(result.inserted_primary_key[0])

    def submit(self, job_name: str, params: JobParameters, *, next_run: bool = False) -> int:
        """Insert a PENDING request; its id. (Not repeated on a transient error: a repeat could
        submit twice.)"""
        with self.store.engine.begin() as conn:
            return self._insert(conn, job_name, params, next_run)

    def request(self, request_id: int) -> Any | None:
        rows = self.store.rows(self.provider.select_launch_request(request_id), "launch request")
        return rows[0] if rows else None

    # --- accepting nodes ------------------------------------------------------------------------

    def claim(self, node_id: str, job_names: list[str], limit: int) -> list[LaunchRequest]:
        """Claim up to ``limit`` PENDING requests for these jobs: a poll, then one transaction
        that locks those still PENDING (skipping rows another claimer holds, where the database
        can), moves them to CLAIMED by this node with a guarded UPDATE and reads back what it
        won. A claim whose commit's outcome is unclear is judged from the rows."""
        provider, store = self.provider, self.store
        if not job_names or limit < 1:
            return []
        poll = store.prepared(
            ("launch poll", limit),
            lambda: provider.select_pending_launches(bindparam("b_jobs", expanding=True), limit),
        )
        ids = [int(r[0]) for r in store.rows(poll, "launch poll", {"b_jobs": job_names})]
        if not ids:
            return []
        lock = store.prepared(
            "launch lock",
            lambda: provider.lock_pending_launches(bindparam("b_ids", expanding=True)),
        )
        won = store.prepared(
            "launch won",
            lambda: provider.select_claimed_launches(
                bindparam("b_node"), bindparam("b_ids", expanding=True)
            ),
        )
        params = {"b_node": node_id, "b_ids": ids}

        def read_won(conn: Connection) -> list[LaunchRequest]:
            return [
                LaunchRequest(
                    int(r.request_id),
                    str(r.job_name),
                    decode_parameters(r.parameters),
                    bool(r.next_run),
                )
                for r in conn.execute(won, params)
            ]

        def work(conn: Connection) -> list[LaunchRequest]:
            free = [int(r[0]) for r in conn.execute(lock, {"b_ids": ids})]
            if not free:
                return []
            store.run(
                conn,
                "launch claim",
                lambda: provider.claim_launches(
                    bindparam("b_node"), bindparam("b_ids", expanding=True)
                ),
                {"b_node": node_id, "b_ids": free},
            )
            return read_won(conn)

        return store.transaction(work, "claim launches", lambda conn: read_won(conn) or None)

    def release_lost(self) -> int:
        """Put back to PENDING the requests claimed by nodes gone from the registry (a read
        first: with none, one cheap statement)."""
        provider, store = self.provider, self.store
        check = store.prepared("launch lost check", provider.select_lost_launch)
        if not store.rows(check, "lost launches"):
            return 0
        return store.transaction(
            lambda conn: store.execute(conn, provider.release_lost_launches()), "release launches"
        )

    def mark_launched(
        self, conn: Connection, request_id: int, node_id: str, job_execution_id: int
    ) -> None:
        """In the execution's creating transaction: the request is LAUNCHED with it, or
        :class:`LaunchClaimLostError` rolls the creation back."""
        stmt = self.provider.end_launch(request_id, node_id, LAUNCH_LAUNCHED)
        if conn.execute(stmt, {"b_execution": job_execution_id}).rowcount != 1:
            raise LaunchClaimLostError(
                f"launch request {request_id} is no longer claimed by node {node_id}"
            )

    def mark_failed(self, request_id: int, node_id: str, error: str) -> bool:
        stmt = self.provider.end_launch(request_id, node_id, LAUNCH_FAILED)
        clipped = self.provider.clip_text(error, 2500)
        return self.store.transaction(
            lambda conn: conn.execute(stmt, {"b_error": clipped}).rowcount == 1, "launch failed"
        )

    # --- schedules ------------------------------------------------------------------------------

    def last_fires(self, schedule_names: list[str]) -> dict[str, datetime]:
        """Each schedule's latest tick fired (naive UTC); one indexed read per schedule."""
        stmt = self.store.prepared(
            "last fire", lambda: self.provider.select_last_fire(bindparam("b_name"))
        )
        found: dict[str, datetime] = {}
        for name in schedule_names:
            rows = self.store.rows(stmt, "last fire", {"b_name": name})
            if rows and rows[0][0] is not None:
                found[name] = rows[0][0].replace(tzinfo=None)
        return found

    def fire(
        self,
        schedule_name: str,
        fire_time: datetime,
        node_id: str,
        job_name: str,
        params: JobParameters,
        next_run: bool,
    ) -> int | None:
        """Fire one tick: its launch request and its fire row in one transaction. The request's
        id, or None when the tick was fired already (by any node)."""
        fire = self.store.prepared("fire insert", self.provider.insert_schedule_fire)

        def work(conn: Connection) -> int:
            request_id = self._insert(conn, job_name, params, next_run)
            conn.execute(
                fire,
                {
                    "b_name": schedule_name,
                    "b_time": fire_time,
                    "b_request": request_id,
                    "b_node": node_id,
                },
            )
            return request_id

        try:
            return self.store.transaction(work, "fire schedule")
        except IntegrityError:
            return None
