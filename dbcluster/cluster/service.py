"""Periodic services: each loop of a node is one :class:`Service` on its own thread.

A service runs ``run_once`` every ``interval_ms`` (sooner when woken), survives its body's
failures, and has a stop path. A :class:`ServiceGroup` starts and stops a node's services in
order and tells the node when one of them died, so a node never goes on half-alive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("dbcluster.service")

#: Called at the top of every loop turn; a test's pause gate blocks there (None outside tests).
Gate = Callable[[], None]


class Service:
    """A named loop: ``run_once`` every ``interval_ms``, or at once after :meth:`wake`."""

    name = "service"

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self.gate: Gate | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_death: Callable[[Service, BaseException], None] | None = None
        #: When the next turn is due (``time.monotonic()``), None while the body runs.
        self._due: float | None = None

    def run_once(self) -> None:
        raise NotImplementedError

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
                try:
                    self.run_once()
                except Exception:  # noqa: BLE001 - a loop survives its body's failures
                    log.exception("service %s failed", self.name)
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

    def __init__(self, on_death: Callable[[Service, BaseException], None] | None = None) -> None:
        self.services: list[Service] = []
        self.on_death = on_death

    def add(self, service: Service) -> Service:
        service.on_death = self.on_death
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
