"""Claiming ahead (``prefetch_multiplier``): a node whose recent partitions were short and
transferable holds more partitions than it has slots, so that one claim serves several; one
whose partitions are non-transferable or long claims only for its free slots; and what it
claimed ahead is handed over whole when it stops."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import func, select

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.worker import PREFETCH_BELOW_MS
from dbcluster.testing.app import FAST_SETTINGS, build_registry, ledger
from dbcluster.testing.backends import Backend
from dbcluster.testing.waiting import in_thread, wait_for

SLOTS = 2
#: One worker node of two slots holding up to three partitions a slot.
#: Grouped commits off: they claim a group per slot (DBCLUSTER_TEST_GROUPED=1 makes the test
#: application's steps groupable), which is not what these tests pin.
AHEAD = FAST_SETTINGS.with_overrides(
    concurrency_limit=SLOTS, prefetch_multiplier=3, commit_group_size=1
)


def _held(cluster: Any) -> list[int]:
    """The partitions the node held (running or waiting) right after each claim it ran."""
    worker = cluster.node.worker
    held: list[int] = []
    original = worker.executor.submit

    def submit(identity: Any, claimed: Any) -> None:
        original(identity, claimed)
        held.append(worker.load)

    worker.executor.submit = submit
    return held


def _ledger(backend: Backend, execution_id: int) -> Counter[str]:
    with backend.engine.connect() as conn:
        rows = conn.execute(
            select(ledger.c.partition_name, func.count())
            .where(ledger.c.job_execution_id == execution_id)
            .group_by(ledger.c.partition_name)
        ).all()
    return Counter({name: n for name, n in rows})


def test_a_node_with_short_transferable_partitions_claims_ahead(
    backend: Backend, make_cluster: Any
) -> None:
    registry = build_registry(per_node=24)
    master = make_cluster(AHEAD, work=False, registry=registry)
    worker = make_cluster(AHEAD, registry=registry)
    held = _held(worker)
    execution = master.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert held[0] <= SLOTS  # nothing ran yet: only the free slots
    assert max(held) > SLOTS, f"the node never claimed ahead: held {held}"
    assert max(held) <= SLOTS * 3
    assert len(held) < 24 / SLOTS, f"{len(held)} claims for 24 partitions"
    effects = _ledger(backend, execution.id)
    assert len(effects) == 24 and set(effects.values()) == {1}, effects


@pytest.mark.parametrize(
    ("job", "per_node", "params"),
    [
        ("ledger-fixed", 12, {}),  # non-transferable
        ("ledger", 6, {"delay_ms": PREFETCH_BELOW_MS + 100}),  # long
    ],
    ids=["non-transferable", "long"],
)
def test_a_node_claims_only_for_free_slots_when_it_should_not_claim_ahead(
    backend: Backend, make_cluster: Any, job: str, per_node: int, params: dict[str, Any]
) -> None:
    registry = build_registry(per_node=per_node)
    master = make_cluster(AHEAD, work=False, registry=registry)
    worker = make_cluster(AHEAD, registry=registry)
    held = _held(worker)
    execution = master.launch(job, {"run": 1, **params})
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert held and max(held) <= SLOTS, f"held {held}"


def test_a_node_that_stops_hands_back_what_it_claimed_ahead(
    backend: Backend, make_cluster: Any
) -> None:
    """Stopped while it holds partitions it has not begun: they run on the other node, and
    every partition takes effect once."""
    registry = build_registry(per_node=30)
    master = make_cluster(AHEAD, work=False, registry=registry)
    leaving = make_cluster(AHEAD, registry=registry)
    held = _held(leaving)
    run = in_thread(lambda: master.launch("ledger", {"run": 1, "delay_ms": 40}))
    wait_for(lambda: any(h > SLOTS for h in held), timeout=30, what="a claim ahead")
    make_cluster(AHEAD, registry=registry)
    leaving.stop(drain_timeout_ms=5000)
    run["thread"].join(60)
    execution = run["result"]
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    effects = _ledger(backend, execution.id)
    assert len(effects) == 30 and set(effects.values()) == {1}, effects
