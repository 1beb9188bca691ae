"""A cluster node: its membership (join, heartbeat, watchdog, fence, rejoin) and its services.

A node has an *identity* (a node id) per membership. When its row is removed, or it cannot
heartbeat for so long that the cluster may remove it at any moment, that identity is fenced: it
claims nothing more, starts nothing it claimed, and every transaction of its running partitions
and masters is refused (their fences check the identity before the database does). The node then
rejoins under a fresh id; nothing is ever written again under the old one.

The node's loops are services (:mod:`dbcluster.cluster.service`): the heartbeat (started first,
stopped last), the worker's poller (:mod:`dbcluster.cluster.worker`), and the maintainers
(:mod:`dbcluster.cluster.maintenance`).

Connections a node opens (see the README): a coordination pool of ``4 + 4`` (claims, sweeps,
stranded-master scans, masters' coordination writes), an autocommit pool of ``3 + 4`` (polls,
heartbeats and other single statements, and the listening connection where the database has
LISTEN/NOTIFY) and a work pool of ``concurrency_limit + 2`` (+ as many again in overflow) for step
transactions; all with the lock-wait and idle-in-transaction bounds of
:class:`~dbcluster.dialects.base.SessionLimits`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from dbcluster.batch.repository import JobRepository
from dbcluster.batch.transactions import RetryPolicy
from dbcluster.cluster.events import EventHub
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.maintenance.pruner import Pruner
from dbcluster.cluster.maintenance.restarter import AutoRestarts, Relauncher
from dbcluster.cluster.maintenance.stranded import StrandedMasters, Takeover
from dbcluster.cluster.maintenance.sweeper import Sweeper
from dbcluster.cluster.observing import NodeObserving
from dbcluster.cluster.service import Service, ServiceGroup
from dbcluster.cluster.settings import ClusterSettings, _host_name
from dbcluster.cluster.stopping import StopRequests
from dbcluster.cluster.store import CoordinationStore
from dbcluster.dialects import get_provider, make_engine
from dbcluster.dialects.base import SessionLimits

if TYPE_CHECKING:
    from dbcluster.batch.registry import JobRegistry
    from dbcluster.cluster.worker import Worker

log = logging.getLogger("dbcluster.node")


@dataclass(frozen=True)
class NodeEngines:
    """A node's own engines (see the module doc): ``autocommit`` is None where the database
    has no autocommit mode (single statements then run in short transactions)."""

    coordination: Engine
    work: Engine
    autocommit: Engine | None

    def own(self, shared: Engine) -> set[Engine]:
        """The engines the node made itself (disposed of when it stops)."""
        return {self.coordination, self.work, self.autocommit} - {shared, None}  # type: ignore[return-value]


def _own_engines(engine: Engine, settings: ClusterSettings, capacity: int) -> NodeEngines:
    """The node's coordination, work and autocommit engines, made from ``engine``'s URL with the
    session limits of ``settings``. A database private to ``engine`` (in-memory SQLite) is
    shared."""
    provider = get_provider(engine)
    if provider.private_to_engine(engine):
        return NodeEngines(engine, engine, None)
    idle = settings.idle_transaction_ms
    coordination_limits = SessionLimits(settings.coordination_lock_timeout_ms, idle)
    # No pings on coordination connections: a statement on a dead connection fails as a
    # transient error, the pool is invalidated and the store repeats it on a fresh connection;
    # a ping per checkout would add a round trip to every heartbeat, poll and claim.
    coordination = make_engine(
        engine.url,
        coordination=True,
        limits=coordination_limits,
        pool_size=4,
        max_overflow=4,
        ping=False,
    )
    autocommit = None
    if provider.supports_autocommit:
        # Reads and single-statement writes (polls, heartbeats, a master's progress checks),
        # and a listening connection where the database has LISTEN/NOTIFY.
        autocommit = make_engine(
            engine.url,
            coordination=True,
            limits=coordination_limits,
            autocommit=True,
            pool_size=3,
            max_overflow=4,
            ping=False,
        )
    work = make_engine(
        engine.url,
        limits=SessionLimits(settings.work_lock_timeout_ms, idle),
        pool_size=capacity + 2,
        max_overflow=capacity + 2,
    )
    return NodeEngines(coordination, work, autocommit)


class Heartbeat(Service):
    name = "heartbeat"

    def __init__(self, node: Node) -> None:
        super().__init__(node.settings.heartbeat_interval)
        self.node = node

    def run_once(self) -> None:
        self.node.beat()


class Node:
    """A peer in the cluster. ``start()`` joins, ``stop()`` leaves gracefully."""

    def __init__(
        self,
        engine: Engine,
        registry: JobRegistry | None,
        settings: ClusterSettings | None = None,
        *,
        capacity: int | None = None,
        host: str | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.settings = settings or ClusterSettings.from_env()
        self.capacity = self.settings.concurrency_limit if capacity is None else capacity
        if registry is None and self.capacity > 0:
            raise ValueError("a node that runs partitions needs a JobRegistry")
        self.host = host or _host_name()
        self.engines = _own_engines(engine, self.settings, self.capacity)
        self.coordination_engine = self.engines.coordination
        self.work_engine = self.engines.work
        self.store = CoordinationStore(self.coordination_engine, autocommit=self.engines.autocommit)
        self.repository = JobRepository(
            self.work_engine,
            RetryPolicy(
                is_transient=get_provider(self.work_engine).is_transient,
                attempts=50,
                deadline_s=self.settings.unreachable_threshold / 1000,
                backoff_s=0.05,
                max_backoff_s=min(1.0, self.settings.heartbeat_interval / 1000),
                give_up=lambda: self.is_fenced or self.stopping,
            ),
            reader=self.engines.autocommit,
        )
        self.events = EventHub()
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._identity: Identity | None = None
        #: Every id this node has joined under, oldest first.
        self.ids: list[str] = []
        self._masters = 0
        self.services = ServiceGroup(on_death=self._service_died)
        #: The executions this node works for, watched for stop requests.
        self.stop_requests = StopRequests(self.store, self.settings)
        self.worker: Worker | None = None
        #: How this node runs a job it takes over from a lost master (set by the Cluster; None:
        #: it abandons such jobs).
        self.takeover: Takeover | None = None
        #: How this node restarts executions that ended for cluster reasons (None: it does not).
        self.relauncher: Relauncher | None = None
        #: Services the cluster adds (maintainers built from the store), started after the
        #: node's own and stopped before them.
        self._added: list[Service] = []
        self._started = False

    def add_service(self, service: Service) -> Service:
        """Run ``service`` with the node's (before :meth:`start`)."""
        if self._started:
            raise RuntimeError("add services before the node starts")
        self._added.append(service)
        return service

    # --- identity -------------------------------------------------------------------------------

    @property
    def identity(self) -> Identity:
        if self._identity is None:
            raise RuntimeError("the node has not joined the cluster; call start()")
        return self._identity

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def is_fenced(self) -> bool:
        return self._identity is None or self._identity.is_fenced

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def acting(self) -> Identity | None:
        """The identity this node may act under now, or None (not joined, fenced, leaving, or
        silent so long that the cluster may remove it at any moment)."""
        identity = self._identity
        if identity is None or self.stopping or self.watchdog(identity):
            return None
        return identity

    def _join(self) -> Identity:
        node_id = f"{self.settings.node_id_prefix}-{uuid.uuid4().hex}"
        # A worker that withdrew (its claims kept failing) rejoins without capacity.
        withdrawn = self.worker is not None and self.worker.withdrawn is not None
        self.store.register(node_id, self.host, 0 if withdrawn else self.capacity)
        identity = Identity(node_id)
        with self._lock:
            self._identity = identity
            self.ids.append(node_id)
        log.info("node %s joined the cluster (capacity %d)", node_id, self.capacity)
        self.events.joined(node_id)
        return identity

    def fence(self, identity: Identity, reason: str) -> None:
        """Stop acting under ``identity``: its claims, partitions and masters refuse to write."""
        with self._lock:
            if identity.fenced.is_set():
                return
            identity.fence_reason = reason
            identity.fenced.set()
        if self.worker is not None:
            self.worker.on_fenced(identity)
        log.warning("node %s fenced itself (%s)", identity.node_id, reason)
        self.events.fenced(identity.node_id, reason)

    def watchdog(self, identity: Identity) -> bool:
        """Fence when the last good heartbeat is so old that the cluster may remove this node at
        any moment, even if the heartbeat thread itself is stuck in a call that has not returned
        (a cut network) or the process was stopped. Shorter silences stay in the grace window:
        an UNREACHABLE node that beats again is ACTIVE again. True when fenced."""
        s = self.settings
        limit = max(s.unreachable_threshold, s.cleanup_threshold - s.heartbeat_interval)
        silent_ms = (time.monotonic() - identity.last_heartbeat_ok) * 1000
        if silent_ms >= limit and not identity.fenced.is_set():
            self.fence(identity, f"no heartbeat for {silent_ms:.0f} ms")
        return identity.fenced.is_set()

    def beat(self) -> None:
        identity = self._identity
        if identity is None or identity.fenced.is_set():
            if not self.stopping:
                self._rejoin()
            return
        began = time.monotonic()
        try:
            alive = self.store.heartbeat(identity.node_id, self.load)
        except Exception as exc:  # noqa: BLE001 - judged by how long it has lasted
            silent_ms = (time.monotonic() - identity.last_heartbeat_ok) * 1000
            log.warning("node %s cannot heartbeat (%d ms): %s", identity.node_id, silent_ms, exc)
            if silent_ms >= self.settings.unreachable_threshold:
                self.fence(identity, f"no heartbeat for {silent_ms:.0f} ms")
            return
        # A heartbeat that only lands after the unreachable threshold may have revived a row
        # that others already judged; we still hold it, so it counts as alive.
        if alive:
            identity.last_heartbeat_ok = time.monotonic()
            self.events.heartbeat(identity.node_id, identity.last_heartbeat_ok - began)
        else:
            self.fence(identity, "its registry row was removed")

    def _rejoin(self) -> None:
        try:
            self._join()
        except Exception as exc:  # noqa: BLE001 - try again on the next beat
            log.warning("node could not rejoin the cluster: %s", exc)

    @property
    def load(self) -> int:
        return 0 if self.worker is None else self.worker.load

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Node:
        if self._started:
            raise RuntimeError("node already started")
        self._started = True
        self.observing = NodeObserving(self).start()
        self._join()
        s = self.settings
        self.services.add(Heartbeat(self))
        self.services.add(self.stop_requests)
        self.services.add(Sweeper(self.store, s, self.events, self.acting))
        if s.prune_after is not None:
            self.services.add(Pruner(self.store, s, self.events, self.acting))
        self.services.add(
            StrandedMasters(self.store, self.repository, s, self.events, self.acting, self.takeover)
        )
        if self.relauncher is not None:
            self.services.add(AutoRestarts(self.repository, s, self.acting, self.relauncher))
        if self.capacity > 0:
            from dbcluster.cluster.worker import Worker

            self.worker = Worker(self)
            self.services.add(self.worker)
            listen = self.engines.autocommit
            if listen is not None and get_provider(listen).supports_listen_notify:
                from dbcluster.cluster.notifier import Notifier

                self.services.add(Notifier(self, listen))
        for service in self._added:
            self.services.add(service)
        self.services.start()
        return self

    def _service_died(self, service: Service, death: BaseException) -> None:
        identity = self._identity
        log.error("node service %s died (%r): the node fences itself", service.name, death)
        if identity is not None:
            self.fence(identity, f"its {service.name} service died")

    def wake(self) -> None:
        """Poll now (a master just placed partitions)."""
        if self.worker is not None:
            self.worker.wake()

    def offer(self, node_id: str, step_execution_ids: Sequence[int]) -> None:
        """Partitions just placed on ``node_id`` (this node, under that identity): claim them
        now, without polling for them first; none: poll now."""
        if self.worker is not None:
            self.worker.offer(node_id, step_execution_ids)

    @contextmanager
    def mastering(self) -> Iterator[None]:
        """Marks a master running on this node (a graceful stop waits for it)."""
        with self._lock:
            self._masters += 1
        try:
            yield
        finally:
            with self._lock:
                self._masters -= 1

    def stop(self, drain_timeout_ms: int | None = None) -> None:
        """Leave gracefully: stop claiming, hand back what has not started, let running
        partitions finish (or stop them after the drain timeout), keep heartbeating to the end,
        then leave the registry."""
        if not self._started:
            return
        drain = self.settings.drain_timeout if drain_timeout_ms is None else drain_timeout_ms
        self._stopping.set()
        self.services.set_gate(None)
        deadline = time.monotonic() + drain / 1000
        if self.worker is not None:
            self._withdraw()
            self.worker.wake()
            self.worker.drain(deadline)
        while self._masters and time.monotonic() < deadline:
            time.sleep(0.02)
        self.services.stop(keep=("heartbeat",))
        self.services.stop()
        identity = self._identity
        if identity is not None and not identity.fenced.is_set():
            # Nothing writes under this id after it leaves (a master still monitoring stops).
            identity.fence_reason = "left the cluster"
            identity.fenced.set()
            try:
                self.store.deregister(identity.node_id)
                log.info("node %s left the cluster", identity.node_id)
                self.events.left(identity.node_id)
            except Exception as exc:  # noqa: BLE001 - it will be swept as unreachable
                log.warning("node %s could not deregister: %s", identity.node_id, exc)
        self._started = False
        self.observing.stop()
        for engine in self.engines.own(self.engine):
            engine.dispose()

    def _withdraw(self) -> None:
        """Publish capacity 0, so no master places or moves partitions onto a leaving node."""
        identity = self._identity
        if identity is None or identity.fenced.is_set():
            return
        try:
            self.store.set_capacity(identity.node_id, 0)
        except Exception as exc:  # noqa: BLE001 - its partitions move once it leaves anyway
            log.warning("node %s could not withdraw its capacity: %s", identity.node_id, exc)

    def describe(self) -> dict[str, Any]:
        identity = self._identity
        return {
            "node_id": None if identity is None else identity.node_id,
            "fenced": self.is_fenced,
            "stopping": self.stopping,
            "load": self.load,
            "capacity": self.capacity,
        }
