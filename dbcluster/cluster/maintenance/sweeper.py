"""The sweeper: the holder of the ``sweep`` lease (see :mod:`.leases`) marks silent nodes
UNREACHABLE and removes those silent past the cleanup threshold (fencing what they had claimed,
in the same transaction), then puts back to PENDING the launch requests that removed nodes had
claimed."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dbcluster import points
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.launches import LaunchStore
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore

log = logging.getLogger("dbcluster.node")


class Sweeper(Service):
    name = "sweep"

    def __init__(
        self,
        store: CoordinationStore,
        settings: ClusterSettings,
        events: ClusterEvents,
        usable_identity: Callable[[], Identity | None],
        launches: LaunchStore | None = None,
    ) -> None:
        super().__init__(settings.sweep_interval)
        self.store = store
        self.settings = settings
        self.events = events
        #: The identity this node sweeps under: its own while it holds the sweep lease.
        self.usable_identity = usable_identity
        self.launches = launches

    def run_once(self) -> None:
        # A node that does not hold the lease, or may itself be about to be removed, judges no
        # one.
        identity = self.usable_identity()
        if identity is None:
            return
        points.reach("maintenance.leased", service=self.name, node_id=identity.node_id)
        marked, removed = self.store.sweep(
            self.settings.unreachable_threshold, self.settings.cleanup_threshold
        )
        if marked or removed:
            log.info("sweep: %d node(s) marked unreachable, %d removed", marked, removed)
            self.events.swept(identity.node_id, marked, removed)
        if self.launches is not None:
            released = self.launches.release_lost()
            if released:
                log.warning("%d launch request(s) of lost nodes are pending again", released)
