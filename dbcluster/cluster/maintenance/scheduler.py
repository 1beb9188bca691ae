"""The scheduler: the node that holds its schedules' lease, of the nodes that accept launches
(see :mod:`.leases`), fires the due ticks of the registry's schedules; each tick fires exactly
once across the cluster.

Firing a tick is one transaction that inserts its launch request and its row in
``batch_schedule_fires``, whose primary key is (schedule, tick): when several nodes fire the same
tick (a holder that froze and woke after another took its lease), the database accepts one insert
and the others fail on the key and change nothing. Firing
is submitting: whichever node accepts launches runs the job (:mod:`.launches`).

Which ticks are due is judged on the database clock, so nodes whose clocks disagree still agree
on the ticks. Each turn reads the clock and every schedule's latest tick fired (one read each),
fires what :meth:`Schedule.due` returns (a missed-tick policy per schedule), then sleeps until
the next tick of any schedule (at most a second), with a little jitter so that the nodes do not
all race for the same insert.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from datetime import datetime

from dbcluster import points
from dbcluster.batch.schedule import Schedule
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.launches import LaunchStore
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings

log = logging.getLogger("dbcluster.scheduler")

#: The longest sleep between turns (ms): a node that was paused looks again soon.
MAX_SLEEP_MS = 1000
#: Up to this much (ms) is added to each sleep, spreading the nodes' inserts for one tick.
JITTER_MS = 40


class Scheduler(Service):
    name = "scheduler"

    def __init__(
        self,
        launches: LaunchStore,
        schedules: Sequence[Schedule],
        settings: ClusterSettings,
        events: ClusterEvents,
        usable_identity: Callable[[], Identity | None],
        on_fired: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(MAX_SLEEP_MS)
        self.launches = launches
        self.schedules = list(schedules)
        self.settings = settings
        self.events = events
        self.usable_identity = usable_identity
        self.on_fired = on_fired
        #: When this node first saw each schedule with no tick fired (the database clock): a
        #: new schedule's history starts there.
        self._first_seen: dict[str, datetime] = {}

    def run_once(self) -> None:
        if not self.schedules:
            self.interval_ms = 60_000
            return
        identity = self.usable_identity()
        if identity is None:
            self.interval_ms = MAX_SLEEP_MS
            return
        points.reach("maintenance.leased", service=self.name, node_id=identity.node_id)
        now = self.launches.db_now()
        self.fire_due(identity, now)
        upcoming = min(s.next_after(now) for s in self.schedules)
        wait_ms = (upcoming - now).total_seconds() * 1000
        self.interval_ms = int(min(max(wait_ms, 5), MAX_SLEEP_MS) + random.uniform(1, JITTER_MS))

    def fire_due(self, identity: Identity, now: datetime) -> int:
        """Fire every due tick (as of ``now``, the database clock); how many this node fired."""
        last = self.launches.last_fires([s.name for s in self.schedules])
        fired = 0
        for schedule in self.schedules:
            since = last.get(schedule.name) or self._first_seen.setdefault(schedule.name, now)
            for tick in schedule.due(since, now):
                if identity.is_fenced:
                    return fired
                request_id = self.launches.fire(
                    schedule.name,
                    tick,
                    identity.node_id,
                    schedule.job,
                    schedule.run_parameters(tick),
                    bool(schedule.next_run),
                )
                if request_id is None:
                    continue  # another node fired it
                fired += 1
                log.info(
                    "node %s fired schedule %s for %s (launch request %d)",
                    identity.node_id,
                    schedule.name,
                    tick.isoformat(),
                    request_id,
                )
                self.events.schedule_fired(identity.node_id, schedule.name, tick, request_id)
        if fired and self.on_fired is not None:
            self.on_fired()
        return fired
