"""A cluster node: the one place that builds a node's parts and wires them together.

A node opens its engines, builds its coordination store, its job repository and its
:class:`~dbcluster.cluster.context.NodeContext` (settings, store, events, membership), and from
that context its services (:mod:`dbcluster.cluster.service`): the heartbeat (started first,
stopped last: :mod:`dbcluster.cluster.membership`), the stop-request watch, the maintainers
(:mod:`dbcluster.cluster.maintenance`, each run by whichever node holds its lease: ``leases``),
the worker and its notifier, and the observers of its
work. None of them sees the node; they meet through the context.

Connections a node opens (see the README): a coordination pool of ``4 + 4`` (claims, sweeps,
stranded-master scans, masters' coordination writes), an autocommit pool of ``3 + 4`` (polls,
heartbeats and other single statements, and the listening connection where the database has
LISTEN/NOTIFY) and a work pool of ``concurrency_limit + 2`` (+ as many again in overflow) for step
transactions; all with the lock-wait and idle-in-transaction bounds of
:class:`~dbcluster.dialects.base.SessionLimits`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from dbcluster.batch.local import LocalPartitionHandler
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.runtime import BatchRuntime
from dbcluster.batch.transactions import RetryPolicy
from dbcluster.cluster.context import NodeContext
from dbcluster.cluster.events import EventHub
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.launches import LaunchStore
from dbcluster.cluster.maintenance.launches import LaunchAcceptor, Launcher
from dbcluster.cluster.maintenance.leases import PRUNE, SWEEP, Leases, named_for
from dbcluster.cluster.maintenance.pruner import Pruner
from dbcluster.cluster.maintenance.restarter import AutoRestarts, Relauncher
from dbcluster.cluster.maintenance.scheduler import Scheduler
from dbcluster.cluster.maintenance.stranded import StrandedMasters, Takeover
from dbcluster.cluster.maintenance.sweeper import Sweeper
from dbcluster.cluster.membership import Heartbeat, Membership
from dbcluster.cluster.notifier import Notifier
from dbcluster.cluster.observing import NodeObserving
from dbcluster.cluster.patience import is_passing
from dbcluster.cluster.service import Service, ServiceGroup
from dbcluster.cluster.settings import ClusterSettings, host_name
from dbcluster.cluster.stopping import StopRequests
from dbcluster.cluster.store import CoordinationStore
from dbcluster.cluster.worker import Worker
from dbcluster.dialects import get_provider, make_engine
from dbcluster.dialects.base import QueryProvider, SessionLimits
from dbcluster.errors import ConfigurationError

if TYPE_CHECKING:
    from dbcluster.batch.registry import JobRegistry

log = logging.getLogger("dbcluster.node")


@dataclass(frozen=True)
class NodeEngines:
    """A node's own engines (see the module doc): ``autocommit`` is None where the database
    has no autocommit mode (single statements then run in short transactions)."""

    coordination: Engine
    work: Engine
    autocommit: Engine | None
    #: Where the node's listening connection (wake-ups) comes from: the autocommit engine, an
    #: engine of ``listen_url`` of its own, or None (it polls).
    listen: Engine | None = None

    def own(self, shared: Engine) -> set[Engine]:
        """The engines the node made itself (disposed of when it stops)."""
        made = {self.coordination, self.work, self.autocommit, self.listen}
        return made - {shared, None}  # type: ignore[return-value]

    def coordinating(self) -> list[Engine]:
        """The engines coordination statements run on (reads and single statements on the
        autocommit one where there is one)."""
        return [e for e in (self.coordination, self.autocommit) if e is not None]


def _own_engines(engine: Engine, settings: ClusterSettings, capacity: int) -> NodeEngines:
    """The node's coordination, work and autocommit engines, made from ``engine``'s URL with the
    session limits of ``settings``. A database private to ``engine`` (in-memory SQLite) is
    shared."""
    provider = get_provider(engine)
    if provider.private_to_engine(engine):
        return NodeEngines(engine, engine, None, None)
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
    return NodeEngines(
        coordination, work, autocommit, _listen_engine(provider, settings, autocommit)
    )


def _listen_engine(
    provider: QueryProvider, settings: ClusterSettings, autocommit: Engine | None
) -> Engine | None:
    """The engine of the node's listening connection: one of ``listen_url`` (a direct
    connection where the node's own URL goes through a pooler in transaction mode), else the
    autocommit engine where its connections keep their sessions (a ``LISTEN`` lasts); None
    where neither: the node polls at ``task_polling_interval``."""
    if not provider.supports_listen_notify:
        return None
    if settings.listen_url is not None:
        listen = make_engine(
            settings.listen_url, coordination=True, autocommit=True, pool_size=1, max_overflow=1
        )
        if not get_provider(listen).keeps_session:
            listen.dispose()
            raise ConfigurationError(
                "listen_url goes through a pooler in transaction mode, where LISTEN does not "
                "last: give it a URL that reaches the database directly"
            )
        return listen
    return autocommit if provider.keeps_session else None


class Node:
    """A peer in the cluster. ``start()`` joins, ``stop()`` leaves gracefully.

    Hooks set before :meth:`start` (by the :class:`~dbcluster.cluster.app.Cluster`): ``takeover``
    (how it runs a job it takes over from a lost master; None: it abandons such jobs),
    ``relauncher`` (how it restarts executions that ended for cluster reasons; None: it does
    not), ``launcher`` (how it runs the launch requests it claims; None: it accepts none, and
    fires no schedule) with ``max_launches``.
    """

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
        self.host = host or host_name()
        self.engines = _own_engines(engine, self.settings, self.capacity)
        self.coordination_engine = self.engines.coordination
        self.work_engine = self.engines.work
        self.store = CoordinationStore(self.coordination_engine, autocommit=self.engines.autocommit)
        self.events = EventHub()
        self.membership = Membership(self.settings, self.events, on_fenced=self._on_fenced)
        self.context = NodeContext(self.settings, self.store, self.events, self.membership)
        self.repository = JobRepository(
            self.work_engine,
            # A database outage is waited out for as long as this node may act: its heartbeat
            # fences it past unreachable_threshold (then give_up), its watchdog at the latest
            # just under cleanup_threshold. No count of tries: an outage costs as many tries as
            # it lasts, and a step that gave up before its node did would fail a partition (a
            # non-transferable one: its job) that the outage alone interrupted.
            RetryPolicy(
                is_transient=get_provider(self.work_engine).is_transient,
                attempts=None,
                deadline_s=self.settings.cleanup_threshold / 1000,
                backoff_s=0.05,
                max_backoff_s=min(1.0, self.settings.heartbeat_interval / 1000),
                give_up=lambda: self.is_fenced or self._drained,
            ),
            reader=self.engines.autocommit,
        )
        #: Launch requests and schedule fires, on the node's store.
        self.launches = LaunchStore(self.store)
        #: The maintenance leases this node contends for (see ``cluster/maintenance/leases.py``).
        self.leases = Leases(self.store, self.settings, self.membership.usable_identity)
        provider = self.store.provider
        self.services = ServiceGroup(
            on_death=self._service_died,
            is_outage=lambda error: is_passing(provider, error),
            has_identity=lambda: self.membership.usable_identity() is not None,
            outages=self.context.outages,
        )
        #: The executions this node works for, watched for stop requests.
        self.stop_requests = StopRequests(self.store, self.settings)
        self.worker: Worker | None = None
        self.takeover: Takeover | None = None
        self.relauncher: Relauncher | None = None
        self.launcher: Launcher | None = None
        self.max_launches = 16
        #: Services added with :meth:`add_service`, started after the node's own and stopped
        #: before them.
        self._added: list[Service] = []
        self._started = False
        #: When a graceful stop's drain ends (``time.monotonic()``), set by :meth:`stop`.
        self._drain_deadline: float | None = None

    def add_service(self, service: Service) -> Service:
        """Run ``service`` with the node's (before :meth:`start`)."""
        if self._started:
            raise RuntimeError("add services before the node starts")
        self._added.append(service)
        return service

    # --- identity (the membership's) --------------------------------------------------------------

    @property
    def identity(self) -> Identity:
        return self.membership.identity

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def ids(self) -> list[str]:
        """Every id this node has joined under, oldest first."""
        return self.membership.ids

    @property
    def is_fenced(self) -> bool:
        return self.membership.is_fenced

    @property
    def stopping(self) -> bool:
        return self.membership.stopping

    @property
    def _drained(self) -> bool:
        """Whether a leaving node's steps should stop repeating transient errors: once its drain
        has run out, not while it lasts (a drain is for running partitions to finish, and an
        outage or a deadlock during a rolling restart must not fail them)."""
        if not self.stopping:
            return False
        deadline = self._drain_deadline
        return deadline is None or time.monotonic() >= deadline

    def usable_identity(self) -> Identity | None:
        """The identity this node may act under now, or None (not joined, fenced, leaving, or
        silent so long that the cluster may remove it at any moment)."""
        return self.membership.usable_identity()

    def fence(self, identity: Identity, reason: str) -> None:
        """Stop acting under ``identity``: its claims, partitions and masters refuse to write."""
        self.membership.fence(identity, reason)

    def _on_fenced(self, identity: Identity) -> None:
        if self.worker is not None:
            self.worker.on_fenced(identity)

    def _join(self) -> Identity:
        node_id = f"{self.settings.node_id_prefix}-{uuid.uuid4().hex}"
        # A worker that withdrew (its claims kept failing) rejoins without capacity.
        withdrawn = self.worker is not None and self.worker.withdrawn is not None
        capacity = 0 if withdrawn else self.capacity
        self.store.register(node_id, self.host, capacity)
        return self.membership.joined(node_id, self.capacity)

    @property
    def load(self) -> int:
        return 0 if self.worker is None else self.worker.load

    # --- wiring -----------------------------------------------------------------------------------

    def start(self) -> Node:
        if self._started:
            raise RuntimeError("node already started")
        self._started = True
        context, s = self.context, self.settings
        self.observing = NodeObserving(context, self.engines.coordinating()).start()
        self._join()
        usable = self.membership.usable_identity
        heartbeat = Heartbeat(self.membership, self.store, lambda: self.load, self._join)
        self.services.add(heartbeat)
        self.services.add(self.stop_requests)
        # Started before the leased services and stopped after them (it gives its leases up).
        leases = self.leases
        self.services.add(leases)
        # Where the database can, the heartbeat carries the look for a lapsed lease.
        heartbeat.leases = leases
        sweeper = Sweeper(self.store, s, self.events, leases.acting(SWEEP), self.launches)
        leases.want(SWEEP, sweeper)
        self.services.add(sweeper)
        if s.prune_after is not None:
            pruner = Pruner(self.store, s, self.events, leases.acting(PRUNE))
            leases.want(PRUNE, pruner)
            self.services.add(pruner)
        # The stranded-master scan and automatic restarts: one node of each application (the
        # jobs it can take over); a node that takes nothing over scans on its own.
        jobs = [] if self.registry is None else self.registry.job_names()
        scanning = named_for("stranded", jobs)
        stranded = StrandedMasters(
            self.store,
            self.repository,
            s,
            self.events,
            usable,
            self.takeover,
            None if self.takeover is None else leases.acting(scanning),
            lambda: leases.step_down(scanning),
        )
        if self.takeover is not None:
            leases.want(scanning, stranded)
        self.services.add(stranded)
        if self.relauncher is not None:
            restarts = AutoRestarts(self.repository, s, leases.acting(scanning), self.relauncher)
            leases.want(scanning, restarts)
            self.services.add(restarts)
        if self.capacity > 0:
            runtime = BatchRuntime(self.repository, LocalPartitionHandler(), self.registry)
            self.worker = Worker(
                context, runtime, capacity=self.capacity, stop_requests=self.stop_requests
            )
            self.services.add(self.worker)
            # Where they coincide, a heartbeat and an idle poll share one round trip.
            heartbeat.poll, self.worker.heartbeat = self.worker, heartbeat
            listen = self.engines.listen
            if listen is not None:
                notifier = Notifier(context, listen, self.worker)
                self.worker.listening = lambda: notifier.healthy
                self.services.add(notifier)
        if self.launcher is not None:
            self._accept_launches(self.launcher)
        for service in self._added:
            self.services.add(service)
        self.services.start()
        return self

    def _accept_launches(self, launcher: Launcher) -> None:
        """Claim launch requests for ``launcher`` and fire the registry's schedules."""
        usable = self.membership.usable_identity
        acceptor = LaunchAcceptor(
            self.launches, self.settings, self.events, usable, launcher, self.max_launches
        )
        self.services.add(acceptor)
        schedules = [] if self.registry is None else self.registry.schedules()
        # One accepting node of each application fires its schedules.
        firing = named_for("schedules", [schedule.name for schedule in schedules])
        scheduler = Scheduler(
            self.launches,
            schedules,
            self.settings,
            self.events,
            self.leases.acting(firing) if schedules else usable,
            acceptor.wake,
        )
        if schedules:
            self.leases.want(firing, scheduler)
        self.services.add(scheduler)

    def _service_died(self, service: Service, death: BaseException) -> None:
        identity = self.membership.current
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
        with self.context.masters.mastering():
            yield

    def stop(self, drain_timeout_ms: int | None = None) -> None:
        """Leave gracefully: stop claiming, hand back what has not started, let running
        partitions finish (or stop them after the drain timeout), keep heartbeating to the end,
        then leave the registry."""
        if not self._started:
            return
        drain = self.settings.drain_timeout if drain_timeout_ms is None else drain_timeout_ms
        deadline = time.monotonic() + drain / 1000
        self._drain_deadline = deadline
        self.membership.stop()
        self.services.set_gate(None)
        if self.worker is not None:
            self._withdraw()
            self.worker.wake()
            self.worker.drain(deadline)
        self.context.masters.wait(deadline)
        self.services.stop(keep=("heartbeat",))
        self.services.stop()
        identity = self.membership.current
        if identity is not None and self.membership.retire(identity):
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
        identity = self.membership.current
        if identity is None or identity.fenced.is_set():
            return
        try:
            self.store.set_capacity(identity.node_id, 0)
        except Exception as exc:  # noqa: BLE001 - its partitions move once it leaves anyway
            log.warning("node %s could not withdraw its capacity: %s", identity.node_id, exc)

    def describe(self) -> dict[str, Any]:
        identity = self.membership.current
        return {
            "node_id": None if identity is None else identity.node_id,
            "fenced": self.is_fenced,
            "stopping": self.stopping,
            "load": self.load,
            "capacity": self.capacity,
        }
