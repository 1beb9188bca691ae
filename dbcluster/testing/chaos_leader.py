"""The leader faults of ``dbcluster chaos`` (``leader-kill``, ``leader-freeze``): which node process
holds the sweep lease (the maintenance leader) when such a fault falls, and how long the cluster
took to give the lease to another node afterwards (the database's view, polled)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine, select

from dbcluster.schema import leases

#: The lease whose holder the leader faults hit.
LEADER_LEASE = "sweep"
#: Seconds between two looks at the lease while a leader fault waits for its successor.
POLL_S = 0.25
#: How long a leader fault waits past its planned time for a live, unfaulted holder (the one it
#: found was killed or frozen by an earlier fault, its lease not passed on yet), and how often
#: it looks again.
DEFER_S = 8.0
DEFER_STEP_S = 0.5


def lease_holder(engine: Engine) -> str | None:
    """The node id holding the sweep lease (lapsed or not), or None."""
    with engine.connect() as conn:
        row = conn.execute(
            select(leases.c.holder).where(leases.c.lease_name == LEADER_LEASE)
        ).first()
    return None if row is None else str(row[0])


def holder_process(holder: str | None, processes: Iterable[Any]) -> Any | None:
    """The process (of the harness) whose node id is ``holder``."""
    if holder is None:
        return None
    return next((p for p in processes if holder.startswith(f"{p.prefix}-")), None)


class LeaderWatch:
    """Leader faults waiting for the lease to pass to another node: each record gets
    ``lease_taken_s``, the seconds from the fault until the database named another holder."""

    def __init__(self) -> None:
        self.waiting: list[tuple[dict[str, Any], str, float]] = []
        self.records: list[dict[str, Any]] = []
        self._next = 0.0
        #: id(fault) -> when the fault was first due (seconds into the run).
        self.deferred_since: dict[int, float] = {}

    def defer(self, fault: Any, elapsed: float, queue: list[Any]) -> bool:
        """Put ``fault`` back in ``queue`` a moment later, until :data:`DEFER_S` past its
        planned time; False when it waited that long (it is then skipped)."""
        first = self.deferred_since.setdefault(id(fault), fault.at)
        if elapsed - first >= DEFER_S:
            return False
        later = replace(fault, at=round(elapsed + DEFER_STEP_S, 3))
        self.deferred_since[id(later)] = first
        queue.append(later)
        queue.sort(key=lambda f: f.at)
        return True

    def fault(self, record: dict[str, Any], holder: str) -> None:
        record["lease_holder"] = holder
        self.waiting.append((record, holder, time.monotonic()))
        self.records.append(record)

    def poll(self, engine: Engine) -> None:
        now = time.monotonic()
        if not self.waiting or now < self._next:
            return
        self._next = now + POLL_S
        try:
            holder = lease_holder(engine)
        except Exception:  # noqa: BLE001 - the database may be away (a fault of its own)
            return
        for item in list(self.waiting):
            record, old, at = item
            if holder is not None and holder != old:
                record["lease_taken_s"] = round(now - at, 2)
                self.waiting.remove(item)

    def summary(self, bound_s: float) -> list[dict[str, Any]]:
        """One line per leader fault (a fault whose lease never moved has no ``lease_taken_s``:
        the frozen holder woke and renewed before anyone took it, or the run ended first)."""
        return [
            {
                "fault": r["index"],
                "kind": r["kind"],
                "target": r.get("applied_to"),
                "lease_taken_s": r.get("lease_taken_s"),
                "bound_s": bound_s,
            }
            for r in self.records
        ]
