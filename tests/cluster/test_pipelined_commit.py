"""A partition's final write sent with its COMMIT in one round trip (PostgreSQL on psycopg's
pipeline): a refused guard fails the statement, so the COMMIT behind it never runs; a lost
acknowledgement is judged only once the session that sent it is gone (it is ended by pid and
client port), so a COMMIT still held by the server behind a lock wait cannot land after the node
judged it; the fence learns its outcome only from a commit that landed; the refusal is read in
any language the server speaks."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from sqlalchemy import select, text

from dbcluster.batch import Job, PartitionStep, TaskletStep
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import partitions
from dbcluster.testing import points
from dbcluster.testing.app import (
    FAST_SETTINGS,
    RangePartitioner,
    build_registry,
    ledger,
    one_row_tasklet,
)
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import lose_sent_commit_acks, record_events
from dbcluster.testing.waiting import in_thread, wait_for

PIPELINES = pytest.mark.backends("postgresql")
SETTINGS = FAST_SETTINGS.with_overrides(concurrency_limit=2)


def _registry(count: int = 1) -> Any:
    registry = build_registry()
    worker = TaskletStep("moved.worker", one_row_tasklet)
    registry.register(
        Job("moved", [PartitionStep("moved.master", worker, RangePartitioner(True, count, 10))])
    )
    return registry


def _written(backend: Backend, job_execution_id: int) -> list[Any]:
    with backend.engine.connect() as conn:
        return list(
            conn.execute(
                select(ledger.c.step_execution_id).where(
                    ledger.c.job_execution_id == job_execution_id
                )
            ).all()
        )


def _on_final(**details: Any) -> bool:
    se = details.get("step_execution")
    return se is not None and se.step_name.startswith("moved.worker:")


@PIPELINES
def test_a_final_write_sent_with_its_commit_is_refused_after_a_transfer(
    backend: Backend, make_cluster: Any
) -> None:
    """The partition row is taken in the very flight that commits: a transfer made while the
    transaction waits for its COMMIT goes first, the final write behind it is refused by its
    own statement and the COMMIT behind that never runs: nothing of the partition commits (its
    user write included), the node reports it lost, and its fence has no outcome."""
    registry = _registry()
    master = make_cluster(SETTINGS, registry=registry, work=False)
    worker = make_cluster(SETTINGS, registry=registry)
    assert worker.repository.commits_with_final_write
    recorder = record_events(worker.node)
    with points.parked("step.before_final_commit", _on_final) as park:
        run = in_thread(lambda: master.launch("moved", {"run": 1}))
        se = park.wait()[0]["step_execution"]
        job_id = int(se.job_execution.id)

        def fail() -> int:
            with backend.engine.begin() as conn:
                return int(conn.execute(backend.provider.fail_job_partitions(job_id)).rowcount)

        transfer = in_thread(fail)
        transfer["thread"].join(10)
        held = transfer["thread"].is_alive()
    transfer["thread"].join(30)
    assert not held and transfer["result"] == 1, "the parked transaction held its partition"
    run["thread"].join(30)
    assert not run["thread"].is_alive(), "the job did not end"
    assert run["result"].status is BatchStatus.FAILED
    assert _written(backend, job_id) == [], "a final write refused at its COMMIT committed"
    lost = recorder.named("lost")
    assert len(lost) == 1 and "it moved" in lost[0]["reason"], recorder.names()
    assert se.fence.outcome is None, "a refused final write left its outcome on the fence"


@PIPELINES
def test_a_final_write_sent_with_its_commit_whose_ack_is_lost_runs_what_it_claimed(
    backend: Backend, make_cluster: Any
) -> None:
    """Where the final write and its COMMIT went out together, the row that names the
    partition it claimed is lost with the acknowledgement: the node judges the commit (once its
    session is gone) from the step's version, reads back the partition it asked to claim, and
    runs it."""
    settings = FAST_SETTINGS.with_overrides(concurrency_limit=1)
    registry = build_registry(per_node=6)
    master = make_cluster(settings, work=False, registry=registry)
    worker = make_cluster(settings, registry=registry)
    assert worker.repository.commits_with_final_write
    lost = lose_sent_commit_acks(worker.node.work_engine, times=2, when=lambda sql: "dbc_nn" in sql)
    try:
        run = in_thread(lambda: master.launch("ledger", {"run": 2}))
        run["thread"].join(60)
    finally:
        lost.remove()
    assert not run["thread"].is_alive(), "the job did not end"
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert lost.count == 2
    with backend.engine.connect() as conn:
        written = conn.execute(
            select(ledger.c.partition_name).where(ledger.c.job_execution_id == execution.id)
        ).all()
    assert len(written) == 6 and len({r.partition_name for r in written}) == 6


@PIPELINES
def test_a_commit_held_behind_a_lock_wait_cannot_land_after_it_was_judged(
    backend: Backend, make_cluster: Any
) -> None:
    """The late commit: the final write and its COMMIT sit in the server behind the partition
    row's lock (another transaction holds it) when the client's connection drops. The node ends
    that session (by pid and port) and waits until it is gone before it reads whether the
    commit landed: it did not, the transaction is tried again and commits once the lock frees.
    Without the settling, the old session's COMMIT would run once the lock freed, after the
    node had judged it lost and tried again: its retry would then find the partition ended and
    report it lost."""
    settings = SETTINGS.with_overrides(
        unreachable_threshold=30000, cleanup_threshold=60000, idle_transaction_timeout=20000
    )
    registry = _registry()
    master = make_cluster(settings, registry=registry, work=False)
    worker = make_cluster(settings, registry=registry)
    assert worker.repository.commits_with_final_write
    recorder = record_events(worker.node)
    locker = backend.engine.connect()
    try:
        with points.parked("step.before_final_commit", _on_final) as park:
            run = in_thread(lambda: master.launch("moved", {"run": 3}))
            details = park.wait()[0]
            se, conn = details["step_execution"], details["conn"]
            dbapi_connection = conn.connection.dbapi_connection
            old_pid = dbapi_connection.info.backend_pid
            fd = os.dup(dbapi_connection.pgconn.socket)
            locker.begin()
            locker.execute(
                select(partitions.c.status)
                .where(partitions.c.step_execution_id == se.id)
                .with_for_update()
            ).all()

        def waiting_on_lock(pid: int | None = None) -> list[int]:
            with backend.engine.connect() as c:
                rows = c.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    )
                ).all()
            return [r[0] for r in rows if pid is None or r[0] == pid]

        wait_for(lambda: waiting_on_lock(old_pid), 15, "the final write to wait on the lock")
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)  # the client's connection drops
        # The node settles the old session and tries again: the retry waits on the lock too.
        wait_for(
            lambda: [p for p in waiting_on_lock() if p != old_pid],
            30,
            "the retried final write to wait on the lock",
        )
        locker.rollback()
    finally:
        locker.close()
    run["thread"].join(60)
    assert not run["thread"].is_alive(), "the job did not end"
    assert run["result"].status is BatchStatus.COMPLETED, run["result"].exit_status
    assert len(_written(backend, run["result"].id)) == 1
    assert recorder.named("lost") == [], "the old session's commit landed after it was judged"


@PIPELINES
def test_a_refusal_is_read_in_any_language(backend: Backend) -> None:
    import psycopg

    provider = backend.provider
    german = psycopg.errors.InvalidTextRepresentation(
        "ungültige Eingabesyntax für Typ integer: »dbcluster refused 1 0«"
    )
    assert provider.refusal_of(german) == (1, 0)
    terse = psycopg.errors.InvalidTextRepresentation("invalid input")
    assert provider.refusal_of(terse) == (0, 0)  # a refused guard: the safe reading
    assert provider.refusal_of(psycopg.errors.DivisionByZero("division by zero")) is None
