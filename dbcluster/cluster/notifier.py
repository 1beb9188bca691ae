"""Push wake-ups: a node listens for the notification a placement sends it and polls at once.

Where the database has LISTEN/NOTIFY (PostgreSQL), the transaction that places partitions on a
node (a launch's placement, a master's move of an orphan) notifies that node's channel; the
notification is delivered when it commits. Each node keeps one listening connection and wakes
its poller on every notification; a notification names the partitions placed on the node (as
many as its payload holds), which the node claims without polling for them first; or carries
their executions too, and an idle node runs them at once (see :mod:`dbcluster.cluster.offers`).

Polling stays the fallback. While the listener is up (:attr:`Notifier.healthy`), an idle node
polls every ``wakeup_poll_interval`` only (10 s by default): a notification lost while the
connection looked healthy costs at most that. When the listener fails, the worker is woken at
once (a notification may have been lost with the connection) and polls every
``task_polling_interval`` until the listener is back; it reconnects after a pause of one
heartbeat interval, and polls once more as it comes back.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from dbcluster import points
from dbcluster.cluster.offers import read_offer
from dbcluster.cluster.service import Service
from dbcluster.dialects import get_provider
from dbcluster.dialects.base import Listener

if TYPE_CHECKING:
    from dbcluster.cluster.context import NodeContext
    from dbcluster.cluster.worker import Worker

log = logging.getLogger("dbcluster.node")

#: How long one wait for a notification lasts (a stop is noticed within it).
WAIT_S = 0.5


class Notifier(Service):
    """Listens on the node's wake-up channel (under its current identity, on a connection of
    ``engine``) and wakes ``worker``."""

    name = "listen"

    def __init__(self, context: NodeContext, engine: Engine, worker: Worker) -> None:
        super().__init__(0)
        self.context = context
        self.worker = worker
        self.engine = engine
        self.provider = get_provider(engine)
        self._listener: Listener | None = None
        self._channel: str | None = None
        #: Set while a listener is up and its last wait ended without an error.
        self._healthy = threading.Event()

    @property
    def healthy(self) -> bool:
        """Whether wake-ups arrive now: the listener is up and its last wait worked."""
        return self._healthy.is_set()

    def _set_healthy(self, healthy: bool) -> None:
        if healthy == self._healthy.is_set():
            return
        if healthy:
            self._healthy.set()
        else:
            self._healthy.clear()
        self.worker.listener_changed()

    def run_once(self) -> None:
        identity = self.context.usable_identity()
        if identity is None:
            self._close()
            self._stop.wait(WAIT_S)
            return
        channel = self.provider.wake_channel(identity.node_id)
        try:
            if self._listener is None or channel != self._channel:
                self._close()
                self._listener = self.provider.open_listener(self.engine, channel)
                self._channel = channel
                # Work placed before the listener was up is found by this poll.
                self.worker.wake()
            payloads = self._listener.wait(WAIT_S)
            self._set_healthy(True)
            if payloads is not None:
                offers = [read_offer(payload) for payload in payloads]
                ids = [sid for offer in offers for sid in offer.ids]
                points.reach("node.offered", node_id=identity.node_id, partitions=ids)
                self.worker.offer(
                    identity.node_id, ids, [p for offer in offers for p in offer.placed]
                )
        except Exception as exc:  # noqa: BLE001 - the node polls meanwhile
            if not self.unavailable(exc):  # an outage: one WARNING for all of it
                log.warning("node %s lost its wake-up listener: %s", identity.node_id, exc)
            self._close()
            self._stop.wait(self.context.settings.heartbeat_interval / 1000)

    def _close(self) -> None:
        self._set_healthy(False)
        listener, self._listener, self._channel = self._listener, None, None
        if listener is not None:
            try:
                listener.close()
            except Exception as exc:  # noqa: BLE001 - it is being dropped anyway
                log.debug("closing a wake-up listener failed: %s", exc)

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        self._close()
