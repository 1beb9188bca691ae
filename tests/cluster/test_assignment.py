from __future__ import annotations

from collections import Counter

import pytest

from dbcluster.cluster import FixedNodeCount, LeastLoaded, NodeInfo, RoundRobin, strategy_named
from dbcluster.errors import ConfigurationError


def nodes(*loads: int, capacity: int = 10) -> list[NodeInfo]:
    return [NodeInfo(f"n{i}", "h", "ACTIVE", load, capacity) for i, load in enumerate(loads)]


NAMES = [f"p{i:02d}" for i in range(12)]


def test_round_robin_spreads_evenly() -> None:
    placed = RoundRobin().assign(NAMES, nodes(0, 0, 0))
    assert Counter(placed.values()) == {"n0": 4, "n1": 4, "n2": 4}


def test_fixed_node_count_confines_the_job() -> None:
    placed = FixedNodeCount(2).assign(NAMES, nodes(5, 0, 1))
    assert set(placed.values()) == {"n1", "n2"}
    assert Counter(placed.values()) == {"n1": 6, "n2": 6}


def test_least_loaded_avoids_a_busy_node() -> None:
    placed = LeastLoaded().assign(NAMES, nodes(9, 0, 0))
    counts = Counter(placed.values())
    assert counts["n0"] == 0
    assert counts["n1"] == counts["n2"] == 6
    # It counts what it already placed: from equal loads it alternates.
    placed = LeastLoaded().assign(NAMES[:6], nodes(0, 0, 0))
    assert Counter(placed.values()) == {"n0": 2, "n1": 2, "n2": 2}


def test_user_strategy_plugs_in_and_unknown_names_are_refused() -> None:
    class FirstNode:
        def assign(self, partition_names, nodes):
            return {name: nodes[0].node_id for name in partition_names}

    from dbcluster.cluster import register_strategy

    register_strategy("first", FirstNode)
    assert set(strategy_named("first").assign(NAMES, nodes(0, 0)).values()) == {"n0"}
    with pytest.raises(ConfigurationError, match="unknown assignment strategy"):
        strategy_named("nope")


def test_settings_refuse_what_cannot_work() -> None:
    from dbcluster.cluster import ClusterSettings

    with pytest.raises(ConfigurationError, match="unreachable_threshold"):
        ClusterSettings(heartbeat_interval=3000, unreachable_threshold=2000)
    with pytest.raises(ConfigurationError, match="cleanup_threshold"):
        ClusterSettings(unreachable_threshold=10000, cleanup_threshold=10000)
    s = ClusterSettings.from_env({"DBCLUSTER_HEARTBEAT_INTERVAL": "200"})
    assert s.heartbeat_interval == 200 and s.cleanup_threshold == 30000
    with pytest.raises(ConfigurationError, match="invalid DBCLUSTER_HEARTBEAT_INTERVAL 'fast'"):
        ClusterSettings.from_env({"DBCLUSTER_HEARTBEAT_INTERVAL": "fast"})
