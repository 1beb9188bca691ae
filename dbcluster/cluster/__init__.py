"""The coordination engine: nodes, workers, the per-job master, maintainers and strategies."""

from __future__ import annotations

from dbcluster.cluster.app import Cluster
from dbcluster.cluster.assignment import (
    AssignmentStrategy,
    FixedNodeCount,
    LeastLoaded,
    RoundRobin,
    register_strategy,
    strategy_named,
)
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.handler import ClusterPartitionHandler, NoLiveNodeError
from dbcluster.cluster.mastership import MastershipLostError
from dbcluster.cluster.node import Node
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore, NodeInfo

__all__ = [
    "AssignmentStrategy",
    "Cluster",
    "ClusterEvents",
    "ClusterPartitionHandler",
    "ClusterSettings",
    "CoordinationStore",
    "FixedNodeCount",
    "LeastLoaded",
    "MastershipLostError",
    "NoLiveNodeError",
    "Node",
    "NodeInfo",
    "RoundRobin",
    "register_strategy",
    "strategy_named",
]
