"""Assignment strategies: which live node each partition is placed on.

A strategy is any object with ``assign(partition_names, nodes) -> {name: node_id}``; placement is
fixed at launch (only node failure moves work). Users plug their own in by passing an instance,
or register it by name with :func:`register_strategy`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from dbcluster.cluster.store import NodeInfo
from dbcluster.errors import ConfigurationError


@runtime_checkable
class AssignmentStrategy(Protocol):
    def assign(self, partition_names: Sequence[str], nodes: Sequence[NodeInfo]) -> dict[str, str]:
        """Map every partition name to one of ``nodes`` (never empty)."""
        ...


def _ordered(nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
    if not nodes:
        raise ConfigurationError("no live node to assign partitions to")
    return sorted(nodes, key=lambda n: n.node_id)


class RoundRobin:
    """Even spread: partition i goes to node i mod N."""

    def assign(self, partition_names: Sequence[str], nodes: Sequence[NodeInfo]) -> dict[str, str]:
        ordered = _ordered(nodes)
        return {name: ordered[i % len(ordered)].node_id for i, name in enumerate(partition_names)}


class FixedNodeCount:
    """Confine the job to ``count`` nodes (the least loaded), round-robin among them."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ConfigurationError(f"FixedNodeCount needs at least 1 node, not {count}")
        self.count = count

    def assign(self, partition_names: Sequence[str], nodes: Sequence[NodeInfo]) -> dict[str, str]:
        chosen = sorted(_ordered(nodes), key=lambda n: n.current_load)[: self.count]
        return RoundRobin().assign(partition_names, chosen)


class LeastLoaded:
    """Each partition to the node with the lowest load: its published load plus what this
    assignment already placed on it, relative to its capacity."""

    def assign(self, partition_names: Sequence[str], nodes: Sequence[NodeInfo]) -> dict[str, str]:
        ordered = _ordered(nodes)
        load = {n.node_id: n.current_load for n in ordered}
        capacity = {n.node_id: max(1, n.capacity) for n in ordered}
        out: dict[str, str] = {}
        for name in partition_names:
            target = min(
                ordered, key=lambda n: (load[n.node_id] / capacity[n.node_id], load[n.node_id])
            )
            out[name] = target.node_id
            load[target.node_id] += 1
        return out


_STRATEGIES: dict[str, Callable[..., AssignmentStrategy]] = {
    "round-robin": RoundRobin,
    "fixed-node-count": FixedNodeCount,
    "least-loaded": LeastLoaded,
}


def register_strategy(name: str, factory: Callable[..., AssignmentStrategy]) -> None:
    _STRATEGIES[name] = factory


def strategy_named(name: str, *args: object) -> AssignmentStrategy:
    try:
        factory = _STRATEGIES[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown assignment strategy {name!r}; known: {', '.join(sorted(_STRATEGIES))}"
        ) from None
    return factory(*args)
