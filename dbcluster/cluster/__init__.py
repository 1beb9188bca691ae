"""The coordination engine: nodes, the per-job master, assignment strategies and recovery."""

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
from dbcluster.cluster.handler import ClusterPartitionHandler, MastershipLostError, NoLiveNodeError
from dbcluster.cluster.node import Node
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore, NodeInfo

__all__ = [
    "AssignmentStrategy",
    "Cluster",
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
