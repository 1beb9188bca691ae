"""What a node's services share, instead of the node: :class:`NodeContext`.

Every service of a node (the worker and its executor, the notifier, the observers, a master's
handler and placer, the runs it starts in the background, the health probes) is built from a
context: the settings, the coordination store, the events, the membership (the identity the node
acts under, fencing, the stop signal) and the count of masters running here. None of them sees
the node, so none can reach into another's parts; the node (:mod:`dbcluster.cluster.node`) is
what builds them and wires them together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.membership import Membership
from dbcluster.cluster.service import Outages
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore


class Masters:
    """The masters running on this node: a graceful stop waits for them to end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    @contextmanager
    def mastering(self) -> Iterator[None]:
        """Counts a master running on this node while the block runs."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def wait(self, deadline: float) -> None:
        """Until none runs, or ``deadline`` (monotonic) passes."""
        while self._running and time.monotonic() < deadline:
            time.sleep(0.02)


@dataclass(frozen=True)
class NodeContext:
    """The settings, store, events, membership and masters of one node (see the module doc)."""

    settings: ClusterSettings
    store: CoordinationStore
    events: ClusterEvents
    membership: Membership
    masters: Masters = field(default_factory=Masters)
    #: The node's database outages, which its services and partitions report together.
    outages: Outages = field(default_factory=Outages)

    def usable_identity(self) -> Identity | None:
        """The identity the node may act under now (see :meth:`Membership.usable_identity`)."""
        return self.membership.usable_identity()

    @property
    def stopping(self) -> bool:
        """Whether the node is leaving (a graceful stop began)."""
        return self.membership.stopping

    def fence(self, identity: Identity, reason: str) -> None:
        """Stop acting under ``identity`` (see :meth:`Membership.fence`)."""
        self.membership.fence(identity, reason)
