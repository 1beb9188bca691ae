"""A node whose claims keep failing on something other than the database's passing trouble
(a schema this version cannot use, a bug) withdraws from taking partitions: its work runs
elsewhere, it takes work again once a claim works, and with no node left to run a job's
partitions the job ends instead of waiting for ever."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError, ProgrammingError

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import Cluster
from dbcluster.cluster.health import readiness
from dbcluster.cluster.worker import CLAIM_FAILURES_TO_WITHDRAW, is_passing
from dbcluster.schema import nodes, partitions, step_execution
from dbcluster.testing.app import FAST_SETTINGS, ledger
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import record_events
from dbcluster.testing.waiting import in_thread, wait_for


def _break_claims(cluster: Cluster, *, only_with_partitions: bool = False) -> dict[str, Any]:
    """Every claim of this node (with ``only_with_partitions``: every claim of at least one
    partition) fails as a schema it cannot use would, until ``broken`` is cleared."""
    store = cluster.node.store
    real = store.claim
    state: dict[str, Any] = {"broken": True, "failed": 0}

    def claim(node_id: str, load: int, ids: Any, *args: Any) -> Any:
        if state["broken"] and (ids or not only_with_partitions):
            state["failed"] += 1
            raise ProgrammingError(
                "UPDATE batch_partitions ...", {}, Exception('column "attempt" does not exist')
            )
        return real(node_id, load, ids, *args)

    store.claim = claim  # type: ignore[method-assign]
    return state


def _capacity(backend: Backend, cluster: Cluster) -> int | None:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(nodes.c.capacity).where(nodes.c.node_id == cluster.node.node_id)
        ).scalar_one_or_none()


def test_only_trouble_the_database_gets_over_is_passing(backend: Backend) -> None:
    provider = backend.provider
    assert is_passing(provider, OperationalError("SELECT 1", {}, Exception("server closed")))
    assert is_passing(provider, ConnectionError("refused"))
    assert not is_passing(provider, ProgrammingError("SELECT 1", {}, Exception("no column")))
    assert not is_passing(provider, KeyError("p_id"))


def test_a_node_whose_claims_keep_failing_withdraws_and_its_work_runs_elsewhere(
    backend: Backend, make_cluster
) -> None:
    broken = make_cluster()
    healthy = make_cluster()
    state = _break_claims(broken)
    recorder = record_events(broken.node)
    execution = healthy.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED
    assert state["failed"] >= CLAIM_FAILURES_TO_WITHDRAW, "the fault was not injected"
    withdrawn = recorder.named("withdrawn")
    assert len(withdrawn) == 1 and "ProgrammingError" in withdrawn[0]["reason"], withdrawn
    assert _capacity(backend, broken) == 0
    ready, body = readiness(broken.node)
    assert not ready and "claims failed" in body["status"], body
    with backend.engine.connect() as conn:
        ran_on = {
            r.assigned_node
            for r in conn.execute(
                select(partitions.c.assigned_node).where(
                    partitions.c.job_execution_id == execution.id
                )
            )
        }
        written = conn.execute(
            select(ledger.c.partition_name).where(ledger.c.job_execution_id == execution.id)
        ).all()
    assert ran_on == {healthy.node.node_id}
    assert len(written) == len({r.partition_name for r in written}) == 8
    # Mended: the next claim it tries works, and it takes work again.
    state["broken"] = False
    wait_for(
        lambda: _capacity(backend, broken) == FAST_SETTINGS.concurrency_limit,
        timeout=10,
        what="the mended node to give its capacity back",
    )
    assert readiness(broken.node)[0]
    assert healthy.launch("ledger", {"run": 2}).status is BatchStatus.COMPLETED


@pytest.mark.parametrize("only_with_partitions", [False, True])
def test_a_job_whose_only_node_cannot_claim_ends_instead_of_waiting(
    backend: Backend, make_cluster, only_with_partitions: bool
) -> None:
    """Also when a claim of nothing works (the node takes work again, fails again, and waits
    twice as long each time, until its master gives up on the job's partitions)."""
    settings = FAST_SETTINGS.with_overrides(no_node_timeout=1500)
    master = make_cluster(settings, work=False)
    worker = make_cluster(settings)
    state = _break_claims(worker, only_with_partitions=only_with_partitions)
    run = in_thread(lambda: master.launch("ledger", {"run": 3}))
    run["thread"].join(timeout=30)
    assert not run["thread"].is_alive(), "the job waits on a node that cannot claim"
    assert state["failed"] >= CLAIM_FAILURES_TO_WITHDRAW
    execution = run["result"]
    assert execution.status is BatchStatus.FAILED
    with backend.engine.connect() as conn:
        messages = [
            r.exit_message
            for r in conn.execute(
                select(step_execution.c.exit_message).where(
                    step_execution.c.job_execution_id == execution.id,
                    step_execution.c.step_name.like("ledger.worker:%"),
                )
            )
        ]
    assert messages and all("no live node" in m for m in messages), messages
