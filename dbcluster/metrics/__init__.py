"""Prometheus metrics of one node, from its events (the ``metrics`` extra: ``prometheus_client``).

``NodeMetrics`` is a :class:`~dbcluster.cluster.events.ClusterEvents` subscriber with a registry
of its own: ``node.events.subscribe(metrics)``, then serve ``metrics.exposition()`` (``dbcluster
worker --metrics-port N`` does both). Labels stay low-cardinality: a step's name (never a
partition's or an execution's id), an outcome, an error kind. The gauges of the whole cluster
(nodes by status, partitions in flight, ...) come from the database, on the dashboard's
``/metrics`` (:mod:`dbcluster.web.gauges`), not from here.
"""

from __future__ import annotations

import threading
import time

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
except ImportError as missing:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "dbcluster metrics need prometheus_client: pip install 'dbcluster[metrics]'"
    ) from missing

from dbcluster.cluster.events import ClusterEvents

#: Seconds: chunks and heartbeats are short; partitions run for seconds to hours.
SHORT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LONG_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0)

#: Every metric of a node: name (as exposed) -> what it means. docs/observability.md lists these.
NODE_METRICS: dict[str, str] = {
    "dbcluster_partitions_claimed_total": "Partitions this node claimed (the claim committed).",
    "dbcluster_partitions_completed_total": "Partitions this node completed.",
    "dbcluster_partitions_failed_total": "Partitions that failed on this node (no try left).",
    "dbcluster_partitions_retried_total": "Failed tries this node put back for another try.",
    "dbcluster_partitions_released_total": "Partitions this node handed back (graceful stop).",
    "dbcluster_partitions_fenced_total": "Running partitions this node lost: their fence "
    "broke (moved, timed out, node fenced), so nothing more of them committed here.",
    "dbcluster_partitions_reassigned_total": "Orphaned partitions this node, as a master, "
    "moved to another node.",
    "dbcluster_partitions_timed_out_total": "Partitions this node, as a master, fenced for "
    "making no progress within their step's timeout.",
    "dbcluster_partitions_running": "Partitions claimed here and not yet ended.",
    "dbcluster_partition_duration_seconds": "From claim to outcome of a partition on this node, "
    "by outcome (completed, failed, retried, released, fenced).",
    "dbcluster_chunk_duration_seconds": "Time per committed chunk or tasklet call (read, "
    "process and write), by step.",
    "dbcluster_items_read_total": "Items read by committed chunks, by step.",
    "dbcluster_items_written_total": "Items written by committed chunks, by step.",
    "dbcluster_items_skipped_total": "Items skipped (read, process and write skips) by "
    "committed chunks, by step.",
    "dbcluster_heartbeat_round_trip_seconds": "Round trip of this node's heartbeats.",
    "dbcluster_heartbeat_age_seconds": "Time since this node's last successful heartbeat.",
    "dbcluster_coordination_errors_total": "Failed statements on the coordination connections, "
    "by kind: connection, contention (deadlock, lock wait, serialization), other.",
    "dbcluster_master_takeovers_total": "Jobs this node took over from a lost master.",
    "dbcluster_jobs_abandoned_total": "Jobs whose master was lost that this node failed "
    "(master_failover = abandon).",
    "dbcluster_node_fenced_total": "Times this node fenced itself (row removed, or no "
    "heartbeat for too long) and rejoined under a new id.",
    "dbcluster_pruned_rows_total": "Rows this node deleted pruning old executions "
    "(--prune-after), by table.",
}


def _help(name: str) -> str:
    return NODE_METRICS[name]


def _base(name: str) -> str:
    """prometheus_client adds the ``_total`` of a counter itself."""
    return name.removesuffix("_total")


class NodeMetrics(ClusterEvents):
    """A node's metrics, fed by its events; ``exposition()`` is the ``/metrics`` body."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry

        def counter(name: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(_base(name), _help(name), labels, registry=r)

        self.claims = counter("dbcluster_partitions_claimed_total")
        self.completions = counter("dbcluster_partitions_completed_total")
        self.failures = counter("dbcluster_partitions_failed_total")
        self.retries = counter("dbcluster_partitions_retried_total")
        self.releases = counter("dbcluster_partitions_released_total")
        self.fenced_partitions = counter("dbcluster_partitions_fenced_total")
        self.reassignments = counter("dbcluster_partitions_reassigned_total")
        self.timeouts = counter("dbcluster_partitions_timed_out_total")
        self.partition_seconds = Histogram(
            "dbcluster_partition_duration_seconds",
            _help("dbcluster_partition_duration_seconds"),
            ("outcome",),
            buckets=LONG_BUCKETS,
            registry=r,
        )
        self.chunk_seconds = Histogram(
            "dbcluster_chunk_duration_seconds",
            _help("dbcluster_chunk_duration_seconds"),
            ("step",),
            buckets=SHORT_BUCKETS,
            registry=r,
        )
        self.items_read = counter("dbcluster_items_read_total", ("step",))
        self.items_written = counter("dbcluster_items_written_total", ("step",))
        self.items_skipped = counter("dbcluster_items_skipped_total", ("step",))
        self.heartbeat_seconds = Histogram(
            "dbcluster_heartbeat_round_trip_seconds",
            _help("dbcluster_heartbeat_round_trip_seconds"),
            buckets=SHORT_BUCKETS,
            registry=r,
        )
        self.errors = counter("dbcluster_coordination_errors_total", ("kind",))
        self.takeovers = counter("dbcluster_master_takeovers_total")
        self.abandonments = counter("dbcluster_jobs_abandoned_total")
        self.node_fenced = counter("dbcluster_node_fenced_total")
        self.pruned_rows = counter("dbcluster_pruned_rows_total", ("table",))
        for kind in ("connection", "contention", "other"):
            self.errors.labels(kind)  # every kind is exposed, at 0 until it happens

        self._lock = threading.Lock()
        #: Step execution id -> monotonic time of its claim, while it runs here.
        self._running: dict[int, float] = {}
        self._last_heartbeat: float | None = None
        Gauge(
            "dbcluster_partitions_running",
            _help("dbcluster_partitions_running"),
            registry=r,
        ).set_function(lambda: len(self._running))
        Gauge(
            "dbcluster_heartbeat_age_seconds",
            _help("dbcluster_heartbeat_age_seconds"),
            registry=r,
        ).set_function(self._heartbeat_age)

    def exposition(self) -> tuple[bytes, str]:
        """The text format body and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _heartbeat_age(self) -> float:
        last = self._last_heartbeat
        return float("nan") if last is None else time.monotonic() - last

    def _ended(self, step_execution_id: int, outcome: str) -> None:
        with self._lock:
            began = self._running.pop(step_execution_id, None)
        if began is not None:
            self.partition_seconds.labels(outcome).observe(time.monotonic() - began)

    # --- events ---------------------------------------------------------------------------------

    def joined(self, node_id: str) -> None:
        self._last_heartbeat = time.monotonic()

    def heartbeat(self, node_id: str, seconds: float) -> None:
        self._last_heartbeat = time.monotonic()
        self.heartbeat_seconds.observe(seconds)

    def fenced(self, node_id: str, reason: str) -> None:
        self.node_fenced.inc()

    def coordination_error(self, node_id: str, kind: str) -> None:
        self.errors.labels(kind).inc()

    def claimed(self, node_id: str, partition: str, step_execution_id: int, attempt: int) -> None:
        with self._lock:
            self._running[step_execution_id] = time.monotonic()
        self.claims.inc()

    def completed(self, node_id: str, partition: str, step_execution_id: int) -> None:
        self.completions.inc()
        self._ended(step_execution_id, "completed")

    def failed(self, node_id: str, partition: str, step_execution_id: int) -> None:
        self.failures.inc()
        self._ended(step_execution_id, "failed")

    def retried(self, node_id: str, partition: str, step_execution_id: int, attempt: int) -> None:
        self.retries.inc()
        self._ended(step_execution_id, "retried")

    def released(self, node_id: str, partition: str | None, step_execution_id: int | None) -> None:
        if step_execution_id is not None:  # None: unclaimed ones, never counted as running
            self.releases.inc()
            self._ended(step_execution_id, "released")

    def lost(self, node_id: str, partition: str, step_execution_id: int, reason: str) -> None:
        self.fenced_partitions.inc()
        self._ended(step_execution_id, "fenced")

    def chunk_committed(
        self, node_id: str, step: str, read: int, written: int, skipped: int, seconds: float
    ) -> None:
        self.chunk_seconds.labels(step).observe(seconds)
        self.items_read.labels(step).inc(read)
        self.items_written.labels(step).inc(written)
        self.items_skipped.labels(step).inc(skipped)

    def reassigned(
        self, master: str, step_execution_id: int, partition: str, from_node: str | None, to: str
    ) -> None:
        self.reassignments.inc()

    def timed_out(
        self, master: str, step_execution_id: int, partition: str, node: str, retried: bool
    ) -> None:
        self.timeouts.inc()

    def took_over(self, node_id: str, job_execution_id: int, lost_master: str, epoch: int) -> None:
        self.takeovers.inc()

    def abandoned(self, node_id: str, job_execution_id: int, lost_master: str) -> None:
        self.abandonments.inc()

    def pruned(self, node_id: str, counts: dict[str, int], seconds: float) -> None:
        for table, rows in counts.items():
            if rows:
                self.pruned_rows.labels(table).inc(rows)
