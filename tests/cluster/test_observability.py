"""Spans, metrics and health probes of nodes in one process, on every reachable backend."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import Cluster
from dbcluster.cluster.health import EndpointServer, probe_routes
from dbcluster.testing.app import FAST_SETTINGS, runs
from dbcluster.testing.backends import Backend
from dbcluster.testing.control import cut_node, freeze, hold_services, record_events
from dbcluster.testing.waiting import in_thread, wait_for

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from dbcluster.metrics import NodeMetrics  # noqa: E402
from dbcluster.tracing import Tracing  # noqa: E402


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def test_a_two_node_job_is_one_trace_with_partition_spans_under_the_job(
    backend: Backend, make_cluster: Any, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    a: Cluster = make_cluster()
    b: Cluster = make_cluster()
    tracers = [Tracing(c.node, provider).start() for c in (a, b)]
    try:
        execution = a.launch("ledger", {"run": 1, "delay_ms": 60})
    finally:
        for tracer in tracers:
            tracer.stop()
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    finished = exporter.get_finished_spans()
    (job,) = [s for s in finished if s.name == "job ledger"]
    (step,) = [s for s in finished if s.name == "step ledger.master"]
    parts = [s for s in finished if s.name == "partition ledger.worker"]
    chunks = [s for s in finished if s.name == "chunk ledger.worker"]
    assert len(parts) == 8, [s.name for s in finished]
    assert {s.context.trace_id for s in finished} == {job.context.trace_id}
    assert job.parent is None and _parent_id(step) == job.context.span_id
    # Placed by the master with its step's context, read back by whichever node ran them.
    assert {_parent_id(p) for p in parts} == {step.context.span_id}
    assert {p.attributes["dbcluster.node.id"] for p in parts} == {a.node.node_id, b.node.node_id}
    assert {p.attributes["dbcluster.partition.attempt"] for p in parts} == {1}
    assert {p.attributes["dbcluster.master.epoch"] for p in parts} == {1}
    assert job.attributes["dbcluster.master.epoch"] == 1
    by_id = {p.context.span_id for p in parts}
    assert chunks and {_parent_id(c) for c in chunks} <= by_id
    assert all(c.start_time <= c.end_time for c in chunks)


@pytest.mark.backends("sqlite")
def test_a_master_that_takes_a_job_over_continues_its_trace(
    backend: Backend, make_cluster: Any, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    settings = FAST_SETTINGS.with_overrides(unreachable_threshold=2000, cleanup_threshold=4000)
    master: Cluster = make_cluster(settings, work=False)
    workers: list[Cluster] = [make_cluster(settings), make_cluster(settings)]
    tracers = [Tracing(c.node, provider).start() for c in (master, *workers)]
    recorders = [record_events(w.node) for w in workers]
    run = in_thread(lambda: master.launch("ledger", {"run": 1, "delay_ms": 3000, "tick_ms": 50}))
    try:
        wait_for(lambda: _started(backend) >= 4, 20, "the partitions to start")
        with freeze(master.node):
            wait_for(
                lambda: any(r.named("took_over") for r in recorders), 30, "a survivor's takeover"
            )
            wait_for(
                lambda: [s for s in exporter.get_finished_spans() if s.name == "job ledger"],
                30,
                "the job to end under its new master",
            )
        run["thread"].join(30)
    finally:
        for tracer in tracers:
            tracer.stop()
    jobs = [s for s in exporter.get_finished_spans() if s.name == "job ledger"]
    first = next(s for s in jobs if s.attributes["dbcluster.master.epoch"] == 1)
    second = next(s for s in jobs if s.attributes["dbcluster.master.epoch"] == 2)
    assert second.context.trace_id == first.context.trace_id
    assert second.attributes["dbcluster.node.id"] in {w.node.ids[0] for w in workers}
    assert second.status.is_ok and not first.status.is_ok  # the old master lost the job
    parts = [s for s in exporter.get_finished_spans() if s.name == "partition ledger.worker"]
    assert len(parts) == 8 and {p.context.trace_id for p in parts} == {first.context.trace_id}


def _metric(metrics: NodeMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def test_node_metrics_follow_a_job_and_a_cut(backend: Backend, make_cluster: Any) -> None:
    a: Cluster = make_cluster()
    b: Cluster = make_cluster()
    metrics = {c: NodeMetrics() for c in (a, b)}
    for cluster, m in metrics.items():
        cluster.node.events.subscribe(m)
    execution = a.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED

    def counted() -> tuple[float, float]:
        claimed = sum(_metric(m, "dbcluster_partitions_claimed_total") for m in metrics.values())
        done = sum(_metric(m, "dbcluster_partitions_completed_total") for m in metrics.values())
        return claimed, done

    # A worker counts its partition after its COMMIT, which the master may see first.
    wait_for(lambda: counted() == (8, 8), 10, "8 claims and 8 completions to be counted")
    assert all(_metric(m, "dbcluster_partitions_running") == 0 for m in metrics.values())
    for m in metrics.values():
        count = _metric(m, "dbcluster_partition_duration_seconds_count", outcome="completed")
        assert count == _metric(m, "dbcluster_partitions_completed_total")
        assert _metric(m, "dbcluster_chunk_duration_seconds_count", step="ledger.worker") > 0
        # Heartbeats since the subscription (every 100 ms; a short job may end before one).
        wait_for(
            lambda m=m: _metric(m, "dbcluster_heartbeat_round_trip_seconds_count") > 0,
            10,
            "a heartbeat to be observed",
        )
        assert 0 <= _metric(m, "dbcluster_heartbeat_age_seconds") < 5
    # A chunk step the master runs itself: 1,000 items in chunks of 50.
    assert a.launch("ledger-chunks", {"run": 2}).status is BatchStatus.COMPLETED
    step = {"step": "ledger-chunks.items"}
    assert _metric(metrics[a], "dbcluster_items_read_total", **step) == 1000
    assert _metric(metrics[a], "dbcluster_items_written_total", **step) == 1000
    assert _metric(metrics[a], "dbcluster_chunk_duration_seconds_count", **step) >= 20
    assert _metric(metrics[b], "dbcluster_items_read_total", **step) == 0
    # A cut network (every connection of the node) is counted by kind.
    with cut_node(b.node):
        wait_for(
            lambda: _metric(metrics[b], "dbcluster_coordination_errors_total", kind="connection"),
            5,
            "a connection error to be counted",
        )
    assert _metric(metrics[a], "dbcluster_coordination_errors_total", kind="connection") == 0


def _started(backend: Backend) -> int:
    """Partitions of the test app that committed their first call (the ledger's runs)."""
    with backend.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_probes_say_when_a_node_is_fenced_draining_or_takes_no_work(
    backend: Backend, make_cluster: Any
) -> None:
    # Thresholds a loaded machine cannot trip: a late heartbeat must not fence either node here.
    steady = FAST_SETTINGS.with_overrides(unreachable_threshold=3000, cleanup_threshold=6000)
    worker: Cluster = make_cluster(steady)
    master: Cluster = make_cluster(steady, work=False)
    servers = [
        EndpointServer("127.0.0.1", 0, probe_routes(c.node)).start() for c in (worker, master)
    ]
    port, master_port = (s.port for s in servers)
    try:
        status, body = _get(port, "/healthz")
        assert status == 200 and body["node_id"] == worker.node.node_id, body
        assert _get(port, "/readyz")[0] == 200
        assert _get(master_port, "/healthz")[0] == 200
        status, body = _get(master_port, "/readyz")
        assert status == 503 and "capacity 0" in body["status"]

        # Draining: a graceful stop waits for the running partition; meanwhile 503.
        run = in_thread(lambda: master.launch("ledger", {"run": 3, "delay_ms": 1500}))
        wait_for(lambda: _started(backend) >= 4, 20, "the worker to start the 4 partitions")
        stopping = in_thread(lambda: worker.stop(drain_timeout_ms=10_000))
        status, body = wait_for(
            lambda: (found := _get(port, "/healthz"))[0] == 503 and found, 5, "a 503"
        )
        assert body["draining"] and "draining" in body["status"]
        assert _get(port, "/readyz")[0] == 503
        stopping["thread"].join(20)
        run["thread"].join(30)
        assert run["result"].status is BatchStatus.COMPLETED
    finally:
        for server in servers:
            server.stop()

    # Fenced: its row is gone or its heartbeat too old; held services keep it from rejoining.
    node: Cluster = make_cluster()
    server = EndpointServer("127.0.0.1", 0, probe_routes(node.node)).start()
    try:
        with hold_services(node.node):
            node.node.fence(node.node.identity, "its registry row was removed")
            status, body = _get(server.port, "/healthz")
            assert status == 503 and body["fenced"], body
            assert "registry row was removed" in body["status"]
            assert _get(server.port, "/readyz")[0] == 503
        wait_for(lambda: _get(server.port, "/healthz")[0] == 200, 10, "the node to rejoin")
    finally:
        server.stop()
