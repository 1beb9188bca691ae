"""Failure paths found in review: each must end with nothing stuck and nothing run twice."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import select, update

from dbcluster.batch import Job, PartitionStep, RepeatStatus, TaskletStep
from dbcluster.batch.exceptions import JobRestartError
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import job_coordination, partitions
from dbcluster.testing.app import RangePartitioner, build_registry, ledger, ledger_tasklet
from dbcluster.testing.backends import Backend
from dbcluster.testing.waiting import in_thread, wait_for


def _coordination(backend: Backend) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(select(job_coordination)).all()


def test_master_lost_before_its_partitioned_step_is_abandoned(
    backend: Backend, make_cluster
) -> None:
    gate = threading.Event()

    def prelude(ctx: Any) -> RepeatStatus:
        gate.wait(20)
        return RepeatStatus.FINISHED

    registry = build_registry()
    worker = TaskletStep("prelude.worker", ledger_tasklet)
    registry.register(
        Job(
            "prelude",
            [
                TaskletStep("prelude.wait", prelude),
                PartitionStep("prelude.master", worker, RangePartitioner(True)),
            ],
        )
    )
    master = make_cluster(registry=registry)
    survivor = make_cluster(registry=registry)
    abandoned: list[int] = []
    survivor.node.listeners.append(
        lambda e, d: abandoned.append(d["job_execution_id"]) if e == "abandoned" else None
    )
    run = in_thread(lambda: master.launch("prelude", {"run": 1}))
    wait_for(lambda: _coordination(backend), what="the CREATED coordination row")
    assert _coordination(backend)[0].status == "CREATED"
    master.node.pause()  # dies (as far as the cluster can tell) inside its first step
    wait_for(lambda: abandoned, timeout=20, what="a survivor to abandon the job")
    row = _coordination(backend)[0]
    assert row.status == "ABANDONED" and row.master_node == survivor.node.node_id
    execution = survivor.repository.get_job_execution(row.job_execution_id)
    assert execution.status is BatchStatus.FAILED
    gate.set()
    master.node.resume()
    run["thread"].join(timeout=20)
    assert not run["thread"].is_alive()
    # The woken master wrote nothing over the abandonment and ran no partition.
    assert survivor.repository.get_job_execution(row.job_execution_id).status is BatchStatus.FAILED
    with backend.engine.connect() as conn:
        assert conn.execute(select(partitions)).all() == []


def test_restart_is_refused_while_old_partitions_are_in_flight(
    backend: Backend, make_cluster
) -> None:
    cluster = make_cluster()
    failed = cluster.launch("ledger", {"run": 2, "fail": "*"})
    assert failed.status is BatchStatus.FAILED
    with backend.engine.connect() as conn:
        one = (
            conn.execute(
                select(partitions.c.step_execution_id).where(
                    partitions.c.job_execution_id == failed.id
                )
            )
            .scalars()
            .first()
        )
    # As if a worker still ran it when the job ended (its master's monitor broke). (A separate
    # write transaction: on SQLite a deferred one that read first cannot take the write lock
    # once another writer committed.)
    with backend.engine.begin() as conn:
        conn.execute(
            update(partitions).where(partitions.c.step_execution_id == one).values(status="CLAIMED")
        )
    with pytest.raises(JobRestartError, match="still in flight"):
        cluster.restart(failed.id)
    with backend.engine.begin() as conn:
        conn.execute(
            update(partitions).where(partitions.c.step_execution_id == one).values(status="FAILED")
        )
    restarted = cluster.restart(failed.id)  # the same parameters: it fails again, but it runs
    assert restarted.id > failed.id and restarted.status is BatchStatus.FAILED


def test_a_claim_that_raises_after_committing_is_still_run(backend: Backend, make_cluster) -> None:
    cluster = make_cluster()
    store = cluster.node.store
    real_claim = store.claim
    raised: list[int] = []

    def flaky_claim(step_execution_id: int, node_id: str, attempt: int) -> bool:
        won = real_claim(step_execution_id, node_id, attempt)
        if not raised:
            raised.append(step_execution_id)
            raise ConnectionError("the acknowledgement of the claim was lost")
        return won

    store.claim = flaky_claim  # type: ignore[method-assign]
    execution = cluster.launch("ledger", {"run": 3})
    assert raised, "the fault was not injected"
    assert execution.status is BatchStatus.COMPLETED
    with backend.engine.connect() as conn:
        names = Counter(
            r.partition_name
            for r in conn.execute(
                select(ledger.c.partition_name).where(ledger.c.job_execution_id == execution.id)
            )
        )
    assert len(names) == 4 and set(names.values()) == {1}


def test_a_job_whose_end_cannot_be_recorded_is_failed_when_the_database_answers(
    backend: Backend, make_cluster
) -> None:
    cluster = make_cluster()
    real_update = cluster.repository.update_job_execution
    calls: list[str] = []

    def flaky_update(execution: Any, conn: Any = None) -> None:
        if execution.status is BatchStatus.COMPLETED and not calls:
            calls.append("refused")
            raise ConnectionError("the database went away as the job ended")
        real_update(execution, conn)

    cluster.repository.update_job_execution = flaky_update  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        cluster.launch("ledger", {"run": 4})
    assert calls == ["refused"]
    with backend.engine.connect() as conn:
        row = conn.execute(select(job_coordination)).one()
    execution = cluster.repository.get_job_execution(row.job_execution_id)
    assert execution.status is BatchStatus.FAILED, "left STARTED under a live master"
    assert "failed" in execution.exit_status.description
    assert row.status == "FAILED"
