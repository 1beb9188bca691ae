"""The cluster's gauges, read from the database at scrape time: the dashboard's ``/metrics``.

Each scrape runs the bounded reads of :func:`dbcluster.monitor.cluster_gauges` (the node
registry, the running executions and their partitions), at most once per ``min_interval_s``
however many scrapers ask.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from dbcluster.monitor import ClusterGauges, cluster_gauges
from dbcluster.states import NODE_STATUSES, PARTITION_STATUSES

#: Every gauge of the dashboard's ``/metrics``: name -> what it means. The README lists these.
CLUSTER_METRICS: dict[str, str] = {
    "dbcluster_cluster_nodes": "Registered nodes, by status (ACTIVE, UNREACHABLE).",
    "dbcluster_cluster_oldest_heartbeat_age_seconds": "Age of the oldest last heartbeat of a "
    "registered node (database clock).",
    "dbcluster_cluster_partitions": "Partitions of running job executions, by status.",
    "dbcluster_cluster_oldest_claimed_partition_age_seconds": "Time since the least recent "
    "progress (claim or committed chunk) of a CLAIMED partition of a running execution.",
    "dbcluster_cluster_jobs_in_flight": "Job executions STARTING, STARTED or STOPPING.",
    "dbcluster_cluster_load": "Partitions running on all nodes (their published load).",
    "dbcluster_cluster_capacity": "Partitions all nodes can run at once.",
}


def _gauge(name: str, value: float | None, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, CLUSTER_METRICS[name], labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


class ClusterCollector(Collector):
    def __init__(self, engine: Engine, min_interval_s: float = 1.0) -> None:
        self.engine = engine
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._cached: tuple[float, ClusterGauges] | None = None

    def _read(self) -> ClusterGauges:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= self.min_interval_s:
                self._cached = (now, cluster_gauges(self.engine))
            return self._cached[1]

    def collect(self) -> Iterator[Metric]:
        g = self._read()
        nodes = GaugeMetricFamily(
            "dbcluster_cluster_nodes", CLUSTER_METRICS["dbcluster_cluster_nodes"], labels=["status"]
        )
        for status in sorted({*NODE_STATUSES, *g.nodes}):
            nodes.add_metric([status], g.nodes.get(status, 0))
        yield nodes
        yield _gauge(
            "dbcluster_cluster_oldest_heartbeat_age_seconds",
            g.oldest_heartbeat_age_s,
        )
        parts = GaugeMetricFamily(
            "dbcluster_cluster_partitions",
            CLUSTER_METRICS["dbcluster_cluster_partitions"],
            labels=["status"],
        )
        for status in sorted({*PARTITION_STATUSES, *g.partitions}):
            parts.add_metric([status], g.partitions.get(status, 0))
        yield parts
        yield _gauge(
            "dbcluster_cluster_oldest_claimed_partition_age_seconds",
            0.0 if g.oldest_claimed_age_s is None else g.oldest_claimed_age_s,
        )
        yield _gauge("dbcluster_cluster_jobs_in_flight", g.jobs_in_flight)
        yield _gauge("dbcluster_cluster_load", g.load)
        yield _gauge("dbcluster_cluster_capacity", g.capacity)


def cluster_registry(engine: Engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(engine))
    return registry
