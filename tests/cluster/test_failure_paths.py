"""Failure paths found in review: each must end with nothing stuck and nothing run twice."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import select, update

from dbcluster.batch import Job, PartitionStep, RepeatStatus, TaskletStep
from dbcluster.batch.exceptions import JobRestartError
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import job_coordination, partitions, step_execution
from dbcluster.testing.app import (
    FAST_SETTINGS,
    RangePartitioner,
    build_registry,
    ledger,
    ledger_tasklet,
)
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import (
    fail_statements,
    freeze,
    lose_commit_acks,
    lose_results,
    record_events,
    refuse_statements,
)
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
    abandon = FAST_SETTINGS.with_overrides(master_failover="abandon")
    master = make_cluster(abandon, registry=registry)
    survivor = make_cluster(abandon, registry=registry)
    recorder = record_events(survivor.node)
    run = in_thread(lambda: master.launch("prelude", {"run": 1}))
    wait_for(lambda: _coordination(backend), what="the CREATED coordination row")
    assert _coordination(backend)[0].status == "CREATED"
    frozen = freeze(master.node)  # dies (as far as the cluster can tell) inside its first step
    wait_for(lambda: recorder.named("abandoned"), timeout=20, what="a survivor to abandon it")
    row = _coordination(backend)[0]
    assert row.status == "ABANDONED" and row.master_node == survivor.node.node_id
    execution = survivor.repository.get_job_execution(row.job_execution_id)
    assert execution.status is BatchStatus.FAILED
    gate.set()
    frozen.thaw()
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


def test_a_claim_whose_commit_acknowledgement_is_lost_is_still_run(
    backend: Backend, make_cluster
) -> None:
    """Whether the claim is a transaction (its COMMIT's acknowledgement lost) or one statement
    committing on its own (its result lost), the node reads back what it won and runs it."""
    cluster = make_cluster()
    store = cluster.node.store
    if store.autocommit is not None and store.provider.claim_and_start(1, [1], None, 0) is not None:
        lost = lose_results(store.autocommit, times=1, when=lambda sql: _claiming([sql]))
    else:
        lost = lose_commit_acks(cluster.node.coordination_engine, times=1, when=_claiming)
    execution = cluster.launch("ledger", {"run": 3})
    assert lost.count == 1, "the fault was not injected"
    assert execution.status is BatchStatus.COMPLETED
    with backend.engine.connect() as conn:
        names = Counter(
            r.partition_name
            for r in conn.execute(
                select(ledger.c.partition_name).where(ledger.c.job_execution_id == execution.id)
            )
        )
    assert len(names) == 4 and set(names.values()) == {1}


def _claiming(statements: list[str]) -> bool:
    """A claim's transaction: it touches the node's row, then claims partitions."""
    return any("UPDATE batch_nodes SET current_load" in s for s in statements)


def test_a_job_whose_last_write_fails_once_still_completes(backend: Backend, make_cluster) -> None:
    cluster = make_cluster()
    failed = fail_statements(
        cluster.node.work_engine,
        times=1,
        when=lambda sql, params: "UPDATE batch_job_execution" in sql and "COMPLETED" in str(params),
    )
    execution = cluster.launch("ledger", {"run": 4})
    assert failed.count == 1, "the fault was not injected"
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        row = conn.execute(select(job_coordination)).one()
    assert (
        cluster.repository.get_job_execution(row.job_execution_id).status is BatchStatus.COMPLETED
    )
    assert row.status == "COMPLETED"


#: Liveness thresholds a loaded machine cannot trip (the outage below hits only the worker's
#: step transactions, never its heartbeat); the retry budget of a step transaction is the
#: unreachable threshold.
PATIENT = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)


class _Logged(logging.Handler):
    """Sets ``seen`` once a record of the node's logger contains ``text`` (at INFO: the
    database's passing trouble is the node's outage's one WARNING, not each partition's)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


@contextmanager
def _outage(engine: Any, starts_with: str) -> Iterator[tuple[Any, _Logged]]:
    """Every statement of ``engine`` fails, as a dropped connection, from the first one that
    contains ``starts_with`` until the node says it cannot record a partition's end yet (it is
    then in the loop that writes that end once the database answers)."""
    logged = _Logged("cannot record partition")
    node_log = logging.getLogger("dbcluster.node")
    level = node_log.level
    node_log.setLevel(logging.INFO)
    node_log.addHandler(logged)
    began: list[float] = []
    lock = threading.Lock()

    def in_outage(sql: str, _params: Any) -> bool:
        with lock:
            if not began:
                if starts_with not in sql:
                    return False
                began.append(time.monotonic())
            return not logged.seen.is_set() and time.monotonic() - began[0] < 60

    failed = fail_statements(engine, times=10**9, when=in_outage)
    try:
        yield failed, logged
    finally:
        failed.remove()
        node_log.removeHandler(logged)
        node_log.setLevel(level)


def _partitions_of(backend: Backend, job_execution_id: int) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(partitions.c.status, partitions.c.attempt).where(
                partitions.c.job_execution_id == job_execution_id
            )
        ).all()


def test_a_partition_that_an_outage_kept_from_writing_its_end_is_tried_again(
    backend: Backend, make_cluster
) -> None:
    """A worker's step transactions fail from the first write that holds a partition (a
    database outage of its work connections, longer than a step transaction's retry budget):
    each partition's one transaction fails, and so does the write of its failed end. Once the
    database answers, the node records each transferable partition as a failed try with tries
    left, not as a final failure: they run again and the job completes."""
    master = make_cluster(PATIENT, work=False)
    worker = make_cluster(PATIENT)
    with _outage(worker.node.work_engine, "UPDATE batch_partitions") as (failed, logged):
        execution = master.launch("ledger", {"run": 6})
    assert failed.count > 1 and logged.seen.is_set(), "the outage did not outlast the retries"
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = ledger_rows_of(backend, execution.id)
    assert len(rows) == 4 and set(Counter(rows).values()) == {1}
    parts = _partitions_of(backend, execution.id)
    assert {p.status for p in parts} == {"COMPLETED"}
    assert max(p.attempt for p in parts) == 2, parts  # the tries the outage failed ran again


class _AfterStep:
    """An ``after_step`` listener: the tasklet's last call and the step's end are then two
    transactions."""

    def after_step(self, step_execution: Any) -> None:
        return None


def _effect_each_call(ctx: Any) -> RepeatStatus:
    """One ledger row on every call, remembering nothing: run twice, it writes twice."""
    se = ctx.step_execution
    ctx.connection.execute(
        ledger.insert().values(
            job_execution_id=se.job_execution.id,
            step_execution_id=se.id,
            partition_name=se.step_name.split(":", 1)[1],
            transferable=True,
            lo=0,
            hi=0,
            total=0,
        )
    )
    return RepeatStatus.FINISHED


def test_a_completed_partition_whose_end_an_outage_kept_from_being_written_is_not_run_again(
    backend: Backend, make_cluster
) -> None:
    """The tasklet's effect committed; the step's separate final write then fails through an
    outage longer than its retry budget. Once the database answers, the node writes that end
    as it was (COMPLETED, attempt 1): the partition is not tried again, so its effect (which
    this tasklet would repeat) happens once."""
    registry = build_registry()
    worker_step = TaskletStep("once.worker", _effect_each_call, listeners=[_AfterStep()])
    registry.register(
        Job("once", [PartitionStep("once.master", worker_step, RangePartitioner(True))])
    )
    master = make_cluster(PATIENT, work=False, registry=registry)
    # One partition at a time: the outage then hits only the first one's final write.
    worker = make_cluster(PATIENT.with_overrides(concurrency_limit=1), registry=registry)
    # The final write is the first to change a partition's status from the work connection.
    with _outage(worker.node.work_engine, "UPDATE batch_partitions SET status") as (failed, logged):
        execution = master.launch("once", {"run": 7})
    assert failed.count > 1 and logged.seen.is_set(), "the outage did not outlast the retries"
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = ledger_rows_of(backend, execution.id)
    assert len(rows) == 4 and set(Counter(rows).values()) == {1}, Counter(rows)
    parts = _partitions_of(backend, execution.id)
    assert {(p.status, p.attempt) for p in parts} == {("COMPLETED", 1)}, parts


def test_a_partition_whose_end_the_database_refuses_is_recorded_failed_not_tried_forever(
    backend: Backend, make_cluster
) -> None:
    """The step's work committed, then its final write is refused as it is (a value too long
    for its column, say), not by the database's passing trouble: writing it again every
    heartbeat would leave the partition CLAIMED on a live node for good, and the job hanging.
    The node records the partition FAILED from what the database holds, with the reason, and
    the job ends."""
    registry = build_registry()
    worker_step = TaskletStep("refused.worker", _effect_each_call, listeners=[_AfterStep()])
    registry.register(
        Job("refused", [PartitionStep("refused.master", worker_step, RangePartitioner(True))])
    )
    master = make_cluster(PATIENT, work=False, registry=registry)
    worker = make_cluster(PATIENT, registry=registry)
    # The step's end (its work is committed by then: the listener parts the two), not the
    # FAILED end recorded instead (its exit description names what was refused).
    refused = refuse_statements(
        worker.node.work_engine,
        times=10**9,
        when=lambda sql, params: (
            "batch_step_execution" in sql
            and "COMPLETED" in str(params)
            and "could not be written" not in str(params)
        ),
    )
    try:
        run = in_thread(lambda: master.launch("refused", {"run": 1}))
        run["thread"].join(30)
        assert not run["thread"].is_alive(), "the job hangs: the refused end is tried forever"
    finally:
        refused.remove()
    assert refused.count >= 1, "the fault was not injected"
    execution = run["result"]
    assert execution.status is BatchStatus.FAILED, execution.exit_status
    assert len(ledger_rows_of(backend, execution.id)) == 4  # the work committed, once
    parts = _partitions_of(backend, execution.id)
    assert {(p.status, p.attempt) for p in parts} == {("FAILED", 1)}, parts
    with backend.engine.connect() as conn:
        described = conn.execute(
            select(step_execution.c.exit_message).where(
                step_execution.c.job_execution_id == execution.id,
                step_execution.c.step_name.like("refused.worker:%"),
            )
        ).scalars()
        assert all("could not be written" in (d or "") for d in described), described


def test_a_partition_whose_step_execution_cannot_be_read_back_is_failed_where_it_is(
    backend: Backend, make_cluster
) -> None:
    """As above, and the step execution's read that would judge the refused end is refused
    as well (a row this node cannot read): the node cannot tell how the step ended, but the
    partition is still its own (CLAIMED under its attempt). It records it FAILED with one
    guarded write that needs no read, rather than give its id up: a transferable partition
    would be placed (at the same attempt) on a node that is refused the same way, which would
    give its own id up in turn, without end, each time fencing every partition it held."""
    registry = build_registry()
    worker_step = TaskletStep("unread.worker", _effect_each_call, listeners=[_AfterStep()])
    registry.register(
        Job("unread", [PartitionStep("unread.master", worker_step, RangePartitioner(True))])
    )
    master = make_cluster(PATIENT, work=False, registry=registry)
    workers = [make_cluster(PATIENT, registry=registry) for _ in range(2)]
    injected = []
    for worker in workers:
        injected.append(
            refuse_statements(
                worker.node.work_engine,
                times=10**9,
                when=lambda sql, params: (
                    "batch_step_execution" in sql and "COMPLETED" in str(params)
                ),
            )
        )
        # The read that judges it (the repository reads outside a transaction on the reader).
        reader = worker.node.repository.reader
        injected.append(
            refuse_statements(
                reader,
                times=10**9,
                when=lambda sql, params: sql.lstrip().startswith(
                    "SELECT batch_step_execution.job_execution_id"
                ),
            )
        )
    given_up = _Logged("gives this id up")
    logging.getLogger("dbcluster.node").addHandler(given_up)
    try:
        run = in_thread(lambda: master.launch("unread", {"run": 1}))
        run["thread"].join(30)
        assert not given_up.seen.is_set(), "a node gave its id up over one partition"
        assert not run["thread"].is_alive(), "the job hangs"
    finally:
        logging.getLogger("dbcluster.node").removeHandler(given_up)
        for one in injected:
            one.remove()
    assert all(one.count >= 1 for one in injected[:2]), "the fault was not injected"
    execution = run["result"]
    assert execution.status is BatchStatus.FAILED, execution.exit_status
    parts = _partitions_of(backend, execution.id)
    assert {(p.status, p.attempt) for p in parts} == {("FAILED", 1)}, parts
    rows = ledger_rows_of(backend, execution.id)
    assert len(rows) == len(parts) and set(Counter(rows).values()) == {1}, rows  # each ran once


def ledger_rows_of(backend: Backend, job_execution_id: int) -> list[str]:
    with backend.engine.connect() as conn:
        return [
            r[0]
            for r in conn.execute(
                select(ledger.c.partition_name).where(ledger.c.job_execution_id == job_execution_id)
            )
        ]
