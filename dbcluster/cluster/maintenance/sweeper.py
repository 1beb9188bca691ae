"""The sweeper: every node marks silent nodes UNREACHABLE and removes those silent past the
cleanup threshold (fencing what they had claimed, in the same transaction)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
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
    ) -> None:
        super().__init__(settings.sweep_interval)
        self.store = store
        self.settings = settings
        self.events = events
        self.usable_identity = usable_identity

    def run_once(self) -> None:
        # A node that may itself be about to be removed judges no one.
        identity = self.usable_identity()
        if identity is None:
            return
        marked, removed = self.store.sweep(
            self.settings.unreachable_threshold, self.settings.cleanup_threshold
        )
        if marked or removed:
            log.info("sweep: %d node(s) marked unreachable, %d removed", marked, removed)
            self.events.swept(identity.node_id, marked, removed)
