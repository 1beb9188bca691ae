from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine

from dbcluster.cluster import Cluster, ClusterSettings  # noqa: F401
from dbcluster.testing.app import FAST_SETTINGS, build_registry
from dbcluster.testing.backends import Backend

FAST = FAST_SETTINGS


@pytest.fixture
def make_cluster(backend: Backend, ledger_engine: Engine) -> Iterator[Callable[..., Cluster]]:
    started: list[Cluster] = []
    registry = build_registry()

    def make(settings: ClusterSettings = FAST, **kwargs) -> Cluster:
        cluster = Cluster(backend.url, kwargs.pop("registry", registry), settings, **kwargs)
        cluster.start()
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop(drain_timeout_ms=2000)
