"""The short partition lifecycle: batched claims that record STARTED, a one-call tasklet's single
transaction, work stealing, and push wake-ups (issue 12)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import event, select, text

from dbcluster.batch.status import BatchStatus
from dbcluster.schema import partitions, step_execution
from dbcluster.testing.app import FAST_SETTINGS, ledger
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import hold_services, poll_sizes, record_events, result_sizes
from dbcluster.testing.waiting import in_thread, wait_for

#: Nodes are not removed during these tests: what moves a partition is a steal, never the
#: master's recovery of a removed node's orphans.
NO_REMOVAL = FAST_SETTINGS.with_overrides(cleanup_threshold=60_000)


class _Gate:
    """Holds one service of a node at its next turn (the rest of the node goes on)."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.released = threading.Event()
        service.gate = self.released.wait

    def release(self) -> None:
        self.service.gate = None
        self.released.set()


def _commits(engine: Any) -> Counter[str]:
    counted: Counter[str] = Counter()
    event.listen(engine, "commit", lambda conn: counted.update(["commit"]))
    return counted


def ledger_rows(backend: Backend) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(select(ledger)).all()


def _rows(backend: Backend) -> list[Any]:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(partitions, step_execution.c.status.label("step_status")).join(
                step_execution,
                step_execution.c.step_execution_id == partitions.c.step_execution_id,
            )
        ).all()


def test_a_partition_whose_tasklet_finishes_in_one_call_commits_once(
    backend: Backend, make_cluster: Any
) -> None:
    """The claim records STARTED and the tasklet's one call records its end: one commit of the
    step per partition, beside its claim."""
    master = make_cluster(work=False)
    worker = make_cluster()
    work_commits = _commits(worker.node.work_engine)
    execution = master.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = _rows(backend)
    assert len(rows) == 4 and all(r.status == "COMPLETED" for r in rows)
    assert all(r.step_status == "COMPLETED" for r in rows)
    assert work_commits["commit"] == len(rows), "a partition took more than one transaction"
    executions = [worker.repository.get_step_execution(r.step_execution_id) for r in rows]
    assert all(se.commit_count == 1 and se.start_time and se.end_time for se in executions)


def test_one_claim_takes_as_many_partitions_as_the_node_has_room_for(
    backend: Backend, make_cluster: Any
) -> None:
    master = make_cluster(work=False)
    worker = make_cluster()
    claims = result_sizes(worker.node, "claim")
    assert worker.node.worker is not None
    gate = _Gate(worker.node.worker)
    run = in_thread(lambda: master.launch("ledger", {"run": 2, "delay_ms": 200}))
    wait_for(lambda: len(_rows(backend)) == 4, what="the placement")
    gate.release()
    run["thread"].join(30)
    assert run["result"].status is BatchStatus.COMPLETED, run["result"].exit_status
    assert claims[0] == 4, f"claims took {claims} partitions"
    assert sum(claims) == 4


def test_a_live_node_that_does_not_claim_its_partitions_has_them_stolen(
    backend: Backend, make_cluster: Any
) -> None:
    """A node that heartbeats but does not claim (its poller is stuck) keeps nothing: once its
    partitions waited the stealing delay, another node runs them, under their first attempt."""
    settings = NO_REMOVAL.with_overrides(work_stealing_delay=300)
    master = make_cluster(settings, work=False)
    slow, fast = make_cluster(settings), make_cluster(settings)
    assert slow.node.worker is not None
    gate = _Gate(slow.node.worker)
    try:
        execution = _launch(master, {"run": 3}, within=15)
    finally:
        gate.release()
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = _rows(backend)
    assert len(rows) == 8
    assert {r.assigned_node for r in rows} == {fast.node.node_id}
    assert {r.attempt for r in rows} == {1}
    assert not slow.node.is_fenced
    ledger = ledger_rows(backend)
    assert len(ledger) == 8 and {r.node_id for r in ledger} == {fast.node.node_id}


def test_a_silent_nodes_unstarted_partitions_start_elsewhere_at_once(
    backend: Backend, make_cluster: Any
) -> None:
    """A node silent past the unreachable threshold loses its unstarted partitions to any live
    node at once (long before it could be removed, and without waiting for the stealing
    delay)."""
    # Long enough that the silent node is still ACTIVE (and given partitions) at placement.
    settings = NO_REMOVAL.with_overrides(work_stealing_delay=60_000, unreachable_threshold=2000)
    master = make_cluster(settings, work=False)
    silent, alive = make_cluster(settings), make_cluster(settings)
    events = record_events(alive.node)
    with hold_services(silent.node):  # heartbeat and poller stop, as a stopped process's would
        bound = (settings.unreachable_threshold + 1000) / 1000 + 2.0  # + the job's own run time
        execution = _launch(master, {"run": 4}, within=bound)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = _rows(backend)
    assert len(rows) == 8, "the silent node was not given partitions"
    assert {r.assigned_node for r in rows} == {alive.node.node_id}
    assert {r.attempt for r in rows} == {1}
    assert len(events.named("claimed")) == 8


def _idle_listening_pair(backend: Backend, make_cluster: Any) -> tuple[Any, Any]:
    """A master that does not work and a worker whose poll has relaxed to ten seconds and that
    listens for wake-ups: what starts its partitions sooner is a wake-up."""
    settings = FAST_SETTINGS.with_overrides(task_polling_interval=10_000)
    master = make_cluster(settings, work=False)
    worker = make_cluster(settings)
    assert worker.node.worker is not None
    wait_for(lambda: worker.node.worker.interval_ms == 10_000, what="the worker's poll to relax")
    wait_for(lambda: _listening(backend) >= 1, what="the worker to listen")
    return master, worker


@pytest.mark.backends("postgresql")
def test_a_placement_wakes_the_node_it_placed_on(backend: Backend, make_cluster: Any) -> None:
    """With LISTEN/NOTIFY the placement's commit wakes the worker: it does not wait for its
    (here ten-second) poll."""
    master, worker = _idle_listening_pair(backend, make_cluster)
    execution = _launch(master, {"run": 5}, within=3.0)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status


@pytest.mark.backends("postgresql")
def test_a_wake_up_names_what_it_placed_and_the_node_claims_it_without_polling(
    backend: Backend, make_cluster: Any
) -> None:
    """The placement's notification carries the ids it put on the node: the woken node claims
    them at once; no poll finds them (a poll after a freed slot may still look for more)."""
    master, worker = _idle_listening_pair(backend, make_cluster)
    # The worker's own polls: an idle poll its heartbeat carries (free, every beat) may find
    # them first, which is no poll of its own.
    polls = result_sizes(worker.node, "poll_jobs")
    execution = _launch(master, {"run": 7}, within=5.0)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert len(_rows(backend)) == 4
    assert sum(polls) == 0, f"a poll found ({polls}) what the wake-up named"


def test_a_master_that_is_also_a_worker_claims_what_it_placed_on_itself_without_polling(
    backend: Backend, make_cluster: Any
) -> None:
    settings = FAST_SETTINGS.with_overrides(task_polling_interval=10_000)
    master = make_cluster(settings)
    assert master.node.worker is not None
    wait_for(lambda: master.node.worker.interval_ms == 10_000, what="the node's poll to relax")
    polls = result_sizes(master.node, "poll_jobs")  # its own polls, as above
    execution = _launch(master, {"run": 8}, within=5.0)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    rows = _rows(backend)
    assert len(rows) == 4 and {r.assigned_node for r in rows} == {master.node.node_id}
    assert sum(polls) == 0, f"a poll found ({polls}) what the master had placed on itself"


def test_an_offer_another_node_took_is_not_won_and_the_node_polls_for_the_rest(
    backend: Backend, make_cluster: Any
) -> None:
    """An offer is a hint, not a claim: one already taken wins nothing, and the node then polls
    for what else waits."""
    master = make_cluster(NO_REMOVAL, work=False)
    worker = make_cluster(NO_REMOVAL)
    assert worker.node.worker is not None
    polls = poll_sizes(worker.node)
    execution = _launch(master, {"run": 9}, within=15.0)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    done = [r.step_execution_id for r in _rows(backend)]
    polls.clear()
    worker.node.offer(worker.node.node_id, done)
    wait_for(lambda: polls, what="a poll after offers that won nothing")
    assert {r.status for r in _rows(backend)} == {"COMPLETED"}
    assert len(ledger_rows(backend)) == 4, "an offered partition ran again"


@pytest.mark.backends("postgresql")
def test_a_dropped_listener_reconnects_and_wakes_again(backend: Backend, make_cluster: Any) -> None:
    settings = FAST_SETTINGS.with_overrides(task_polling_interval=10_000)
    master = make_cluster(settings, work=False)
    worker = make_cluster(settings)
    wait_for(lambda: _listening(backend) >= 1, what="the worker to listen")
    with backend.engine.begin() as conn:
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN dbcluster_%' AND datname = current_database()"
            )
        ).scalar_one()
    assert killed >= 1
    wait_for(lambda: _listening(backend) >= 1, what="the worker to listen again", timeout=10)
    assert worker.node.worker is not None
    wait_for(lambda: worker.node.worker.interval_ms == 10_000, what="the worker's poll to relax")
    execution = _launch(master, {"run": 6}, within=3.0)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status


def _launch(master: Any, params: dict[str, Any], within: float) -> Any:
    """Launch ``ledger``; the execution, which must have ended within ``within`` seconds."""
    run = in_thread(lambda: master.launch("ledger", params))
    run["thread"].join(within)
    assert not run["thread"].is_alive(), f"the job did not end within {within} s"
    if "error" in run:
        raise run["error"]
    return run["result"]


def _listening(backend: Backend) -> int:
    with backend.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                    "'LISTEN dbcluster_%' AND datname = current_database()"
                )
            ).scalar_one()
        )
