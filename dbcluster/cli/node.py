"""What a command that joins the cluster as a node (``worker``, ``launch``, ``restart``) sets up:
its settings from options and the environment, and what watches it (spans, metrics, probes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dbcluster.cli.engines import ride_out
from dbcluster.cli.output import announce
from dbcluster.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from dbcluster.cluster import Cluster


def cluster_settings(
    concurrency: int | None, node_prefix: str | None, prune_after: str | None = None
) -> Any:
    """``ClusterSettings`` from the ``DBCLUSTER_*`` variables, the options given on top."""
    from dbcluster.cluster import ClusterSettings
    from dbcluster.cluster.settings import parse_age

    return ClusterSettings.from_env(
        concurrency_limit=concurrency,
        node_id_prefix=node_prefix,
        prune_after=None if prune_after is None else parse_age(prune_after),
    )


def join(
    engine: Engine,
    make: Callable[[], Cluster],
    attach: Callable[[Cluster], Callable[[], None]],
) -> tuple[Cluster, Callable[[], None]]:
    """A cluster made by ``make()``, watched by ``attach(cluster)`` (which returns what detaches
    it) and started: its node has joined. A start that fails on a passing database error (an
    outage that began after the command connected) is made again from scratch, for what is
    left of the command's connect timeout (see :func:`~dbcluster.cli.engines.ride_out`); the
    node that failed half-way leaves first, so nothing of it lingers."""

    def attempt() -> tuple[Cluster, Callable[[], None]]:
        cluster = make()
        detach = attach(cluster)
        try:
            cluster.start()
        except BaseException:
            try:
                cluster.stop()
            finally:
                detach()
            raise
        return cluster, detach

    return ride_out(engine, attempt, "join the cluster")


def observe(
    cluster: Any,
    *,
    otel: bool = False,
    metrics_port: int | None = None,
    health_port: int | None = None,
    host: str = "0.0.0.0",
    log_format: str = "text",
) -> Callable[[], None]:
    """Attach what was asked for to the cluster's node before it starts (spans, metrics, probe
    endpoints); returns what detaches it all. A missing extra or a port in use is the user's
    to fix: one line, exit status 2."""
    stops: list[Callable[[], None]] = []
    node = cluster.node
    try:
        if otel:
            from dbcluster.tracing import Tracing, configure_otlp

            provider = configure_otlp()
            stops += [provider.shutdown, Tracing(node).start().stop]
        routes: dict[int, dict[str, Any]] = {}
        if metrics_port is not None:
            from dbcluster.metrics import NodeMetrics

            metrics = NodeMetrics()
            node.events.subscribe(metrics)
            routes.setdefault(metrics_port, {})["/metrics"] = lambda: (200, *metrics.exposition())
        if health_port is not None:
            from dbcluster.cluster.health import probe_routes

            routes.setdefault(health_port, {}).update(probe_routes(node))
    except ImportError as missing:
        raise ConfigurationError(str(missing)) from None
    from dbcluster.cluster.health import EndpointServer

    for port, served in routes.items():
        try:
            server = EndpointServer(host, port, served).start()
        except OSError as exc:
            for stop in reversed(stops):
                stop()
            raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        stops.append(server.stop)
        announce(f"serving {', '.join(sorted(served))} on http://{host}:{server.port}", log_format)

    def stop_all() -> None:
        for stop in reversed(stops):
            stop()

    return stop_all
