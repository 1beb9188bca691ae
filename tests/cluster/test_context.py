"""A node's services are built from a NodeContext (settings, store, events, membership), never
from a Node: a worker and a heartbeat assembled by hand, with no Node in sight, run a master's
partitions."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import replace

from sqlalchemy import select

from dbcluster.batch.local import LocalPartitionHandler
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.runtime import BatchRuntime
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.context import NodeContext
from dbcluster.cluster.events import EventHub
from dbcluster.cluster.membership import Heartbeat, Membership
from dbcluster.cluster.stopping import StopRequests
from dbcluster.cluster.store import CoordinationStore
from dbcluster.cluster.worker import Worker
from dbcluster.schema import partitions
from dbcluster.testing.app import FAST_SETTINGS, build_registry, expected_total, ledger
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import EventRecorder

#: Liveness thresholds a loaded machine cannot trip (this tests assembly, not fencing).
STEADY = replace(FAST_SETTINGS, unreachable_threshold=5000, cleanup_threshold=10000)


def test_a_worker_built_without_a_node_runs_a_masters_partitions(
    backend: Backend, make_cluster
) -> None:
    settings = STEADY
    store = CoordinationStore(backend.engine)
    events = EventHub()
    recorder = EventRecorder()
    events.subscribe(recorder)
    membership = Membership(settings, events)
    context = NodeContext(settings, store, events, membership)
    stop_requests = StopRequests(store, settings)
    runtime = BatchRuntime(JobRepository(backend.engine), LocalPartitionHandler(), build_registry())
    worker = Worker(context, runtime, capacity=4, stop_requests=stop_requests)
    membership.on_fenced = worker.on_fenced

    def join() -> None:
        node_id = f"bare-{uuid.uuid4().hex}"
        store.register(node_id, "bare-host", worker.capacity)
        membership.joined(node_id, worker.capacity)

    join()
    services = [Heartbeat(membership, store, lambda: worker.load, join), stop_requests, worker]
    for service in services:
        service.start()
    try:
        master = make_cluster(settings, work=False)
        execution = master.launch("ledger", {"run": 1})
    finally:
        membership.stop()
        worker.drain(0)
        for service in reversed(services):
            service.stop()
        store.deregister(membership.identity.node_id)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    with backend.engine.connect() as conn:
        rows = conn.execute(select(ledger).where(ledger.c.job_execution_id == execution.id)).all()
        placed = conn.execute(
            select(partitions.c.assigned_node, partitions.c.status).where(
                partitions.c.job_execution_id == execution.id
            )
        ).all()
    assert len(rows) == 4 and sum(r.total for r in rows) == expected_total()
    assert Counter(placed) == {(membership.identity.node_id, "COMPLETED"): 4}, placed
    assert {"joined", "claimed", "completed"} <= set(recorder.names())
