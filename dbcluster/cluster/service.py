"""Periodic services: each loop of a node is one :class:`Service` on its own thread.

A service runs ``run_once`` every ``interval_ms`` (sooner when woken), survives its body's
failures, and has a stop path. A :class:`ServiceGroup` starts and stops a node's services in
order and tells the node when one of them died, so a node never goes on half-alive.

A database outage (a restart, a crash, a switchover: errors the node's provider calls passing,
``is_outage``) is routine: the node logs one WARNING when the first of its services meets it
("service heartbeat: database unavailable; retrying", no traceback), nothing while it lasts
(the other services that meet it say so at DEBUG), and one INFO once a service that met it gets
through again (:class:`Outages`). Any other failure of a body is an ERROR with its traceback:
someone must look.

A service remembers when a turn last did its work (:attr:`Service.last_good`): the lease of
a leased service (:mod:`dbcluster.cluster.maintenance.leases`) is renewed only while its
services keep up, so a holder whose turns keep failing or hang leaves the work to another node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dbcluster.retry import brief

log = logging.getLogger("dbcluster.service")

#: Called at the top of every loop turn; a test's pause gate blocks there (None outside tests).
Gate = Callable[[], None]
#: Whether an error is the database's passing trouble (an outage), not a bug to report.
IsOutage = Callable[[BaseException], bool]


def _never(error: BaseException) -> bool:
    return False


def _always() -> bool:
    return True


class Outages:
    """A node's database outages, as all its services (and its running partitions and masters)
    meet them: one WARNING when the first meets one, one INFO when one that met it gets through
    again, or when a heartbeat that began after it began lands (the heartbeat writes on every
    turn: proof that the database answers, even if what met the outage is gone, as a master
    whose job ended). A service that met it and has not got through since stays in its own
    outage (:class:`Outage`): its errors meanwhile are DEBUG records, not a new outage (a pool
    whose connections the restart broke fails once more on its next turn, after another
    service already got through)."""

    def __init__(self) -> None:
        #: When the node's current outage began (monotonic), or None.
        self.since: float | None = None
        self._lock = threading.Lock()

    def began(self, who: str, error: BaseException) -> None:
        """``who`` ("service heartbeat"), not in an outage of its own until now, met
        ``error``."""
        with self._lock:
            first = self.since is None
            if first:
                self.since = time.monotonic()
        if first:
            log.warning("%s: database unavailable; retrying (%s)", who, brief(error))
        else:
            log.debug("%s: database unavailable too (%s)", who, brief(error))

    def ended(self, who: str, began: float | None = None) -> None:
        """``who`` got through again: having met the outage (``began`` None), or with work that
        began at ``began`` (monotonic) and proves the database answers (a heartbeat), which
        ends the outage only if it began after the outage did."""
        with self._lock:
            since = self.since
            if since is None or (began is not None and began < since):
                return
            self.since = None
        took = time.monotonic() - since
        log.info("%s: database available again (after %.1f s)", who, took)


class Outage:
    """What one service (or a node's running partitions: see ``Executor.met_outage``) has seen
    of a database outage, reported through the node's :class:`Outages` (its own, where the
    service stands alone): the node's one WARNING when it begins, one INFO when it ends (see
    the module doc)."""

    def __init__(
        self,
        name: str,
        node: Outages | None = None,
        *,
        who: str | None = None,
        proves: bool = False,
    ) -> None:
        self.name = name
        #: Whether its work that got through proves the database answers (the heartbeat's).
        self.proves = proves
        self.node = node if node is not None else Outages()
        #: How the log lines name it ("service heartbeat", "master n1").
        self.who = who or f"service {name}"
        #: When the service first met the outage (monotonic), or None.
        self.since: float | None = None
        # The heartbeat's outage also ends on the poller's thread (a carried beat).
        self._lock = threading.Lock()

    def began(self, error: BaseException) -> None:
        with self._lock:
            first = self.since is None
            if first:
                self.since = time.monotonic()
        if first:
            self.node.began(self.who, error)
        else:
            log.debug("%s: database still unavailable (%s)", self.who, brief(error))

    def ended(self, proof_began: float | None = None) -> None:
        """A piece of work reached the database: the outage (if any) is over. ``proof_began``
        (monotonic): when that work began, where another thread may have met the outage
        meanwhile (a partition's write that landed just before the outage proves nothing of
        it); None: it began after this service last met the outage (its own turn). Work of one
        that :attr:`proves` and met no outage still ends the node's, if it began after it."""
        with self._lock:
            since = self.since
            if since is None:
                mine = False
            elif proof_began is not None and proof_began < since:
                return
            else:
                mine, self.since = True, None
        if mine:
            self.node.ended(self.who)
        elif self.proves and proof_began is not None:
            self.node.ended(self.who, proof_began)


class Service:
    """A named loop: ``run_once`` every ``interval_ms``, or at once after :meth:`wake`."""

    name = "service"
    #: Whether every turn that raises nothing got an answer from the database (the heartbeat's
    #: writes): then it ends the node's outage (see :class:`Outages`).
    proves_database = False

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self.gate: Gate | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_death: Callable[[Service, BaseException], None] | None = None
        #: When the next turn is due (``time.monotonic()``), None while the body runs.
        self._due: float | None = None
        #: Which errors are a database outage (the group sets the node's provider's verdict).
        self.is_outage: IsOutage = _never
        #: Whether a turn that raised nothing proves the database answers again: not while the
        #: node has no identity to act under (its services' turns then skip their work).
        self.has_identity: Callable[[], bool] = _always
        self.outage = Outage(self.name)
        self._unavailable_this_turn = False
        #: Whether the last turn that ended met a database outage.
        self._unavailable_last_turn = False
        #: When a turn last did its work (monotonic): it ended without an error or an outage,
        #: or a long turn said it got on (:meth:`progressed`).
        self.last_good = time.monotonic()

    def run_once(self) -> None:
        raise NotImplementedError

    def unavailable(self, error: BaseException) -> bool:
        """For a body that handles its own errors: whether ``error`` is a database outage (then
        logged as one: a WARNING when the outage begins, nothing while it lasts). False for any
        other error, which the caller reports itself."""
        if not self.is_outage(error):
            return False
        self._unavailable_this_turn = True
        self.outage.began(error)
        return True

    def progressed(self) -> None:
        """A long turn did part of its work (one of its transactions committed): it is not
        stuck, however long it runs."""
        self.last_good = time.monotonic()

    def behind(self) -> float:
        """Seconds since a turn last did its work, beyond the interval a service that keeps
        up waits between turns (0 or less: it keeps up). It grows while the turns fail, or
        while one hangs; not while the database is unavailable (every node meets that alike,
        and a holder that cannot reach it cannot renew its lease either)."""
        if self._unavailable_last_turn:
            return 0.0
        return time.monotonic() - self.last_good - self.interval_ms / 1000

    def wake(self) -> None:
        """Run the body now rather than at the end of the interval."""
        self._wake.set()

    def due_in(self) -> float | None:
        """Seconds until the next turn (0 when due or woken), or None while the body runs (or
        before the loop started)."""
        due = self._due
        if due is None:
            return None
        if self._wake.is_set():
            return 0.0
        return max(0.0, due - time.monotonic())

    def postpone(self) -> None:
        """Another service did this one's work just now: the next turn is due one interval
        from now (a wake-up still runs it at once)."""
        if self._due is not None:
            self._due = time.monotonic() + self.interval_ms / 1000

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"service {self.name} already started")
        self.last_good = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=f"dbcluster-{self.name}")
        self._thread.daemon = True
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if self.gate is not None:
                    self.gate()
                    if self._stop.is_set():
                        break
                # Cleared before the body, so a wake-up that arrives while the body runs is kept
                # for the next turn instead of being lost.
                self._wake.clear()
                self._unavailable_this_turn = False
                turn_began = time.monotonic()
                try:
                    self.run_once()
                except Exception as error:  # noqa: BLE001 - a loop survives its body's failures
                    if not self.unavailable(error):
                        log.exception("service %s failed", self.name)
                else:
                    if not self._unavailable_this_turn:
                        self.last_good = time.monotonic()
                        if self.has_identity():
                            self.outage.ended(turn_began)
                self._unavailable_last_turn = self._unavailable_this_turn
                self._due = time.monotonic() + self.interval_ms / 1000
                self._sleep()
                self._due = None
        except BaseException as death:  # noqa: BLE001 - reported to the group, then re-raised
            if self.on_death is not None:
                self.on_death(self, death)
            raise

    def _sleep(self) -> None:
        """Until the next turn is due (:meth:`postpone` may move it) or a wake-up."""
        while True:
            due = self._due
            remaining = 0.0 if due is None else due - time.monotonic()
            if remaining <= 0 or self._wake.wait(remaining):
                return


class ServiceGroup:
    """A node's services, started in order and stopped in reverse order (the heartbeat, started
    first, stops last)."""

    def __init__(
        self,
        on_death: Callable[[Service, BaseException], None] | None = None,
        is_outage: IsOutage | None = None,
        has_identity: Callable[[], bool] | None = None,
        outages: Outages | None = None,
    ) -> None:
        self.services: list[Service] = []
        self.on_death = on_death
        self.is_outage = is_outage or _never
        self.has_identity = has_identity or _always
        #: The node's outages, which its services report together.
        self.outages = outages if outages is not None else Outages()

    def add(self, service: Service) -> Service:
        service.on_death = self.on_death
        service.is_outage = self.is_outage
        service.has_identity = self.has_identity
        service.outage = Outage(service.name, self.outages, proves=type(service).proves_database)
        self.services.append(service)
        return service

    def set_gate(self, gate: Gate | None) -> None:
        for service in self.services:
            service.gate = gate

    def start(self) -> None:
        for service in self.services:
            service.start()

    def stop(self, keep: tuple[str, ...] = ()) -> None:
        """Stop every service (in reverse order) except those named in ``keep``."""
        for service in reversed(self.services):
            if service.name not in keep:
                service.stop()

    def get(self, name: str) -> Service | None:
        return next((s for s in self.services if s.name == name), None)
