"""Where each partition in flight has been, as the dashboard saw it.

The database keeps a partition's current node and attempt only: when a node dies, the row of a
partition it ran moves to another node and its old node is forgotten. To draw that move, the
dashboard samples the partitions in flight (PENDING and CLAIMED partitions of running
executions: a bounded read through their indexes) every ``interval_s`` and remembers, per
partition, the nodes and attempts it saw, with the database clock. Moves that happen while no
dashboard runs are not seen: the job page then shows the partition on its current node with
its attempt number only.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine

from dbcluster.monitor import partitions_in_flight

log = logging.getLogger("dbcluster.web")


@dataclass
class Segment:
    """A partition seen on ``node`` under ``attempt`` from ``since`` to ``until``."""

    node: str
    attempt: int
    since: datetime
    until: datetime


class MoveWatcher:
    """Samples the partitions in flight on a thread of its own (see the module's docstring)."""

    def __init__(
        self,
        engine: Engine,
        interval_s: float = 1.0,
        *,
        max_jobs: int = 100,
        max_partitions: int = 10_000,
    ) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self.max_jobs = max_jobs
        self.max_partitions = max_partitions
        self._lock = threading.Lock()
        #: job execution id -> step execution id -> segments, oldest first (least recently
        #: sampled jobs first).
        self._jobs: OrderedDict[int, dict[int, list[Segment]]] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> MoveWatcher:
        self._thread = threading.Thread(target=self._run, name="dbcluster-web-moves", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - the next sample tries again
                log.warning("cannot sample the partitions in flight: %s", exc)
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        now, rows = partitions_in_flight(self.engine, self.max_partitions)
        if now is None:
            return
        with self._lock:
            for r in rows:
                if r.node is None:
                    continue  # handed back or its node removed: not on any node until placed
                job = self._jobs.get(r.job_execution_id)
                if job is None:
                    job = self._jobs[r.job_execution_id] = {}
                    while len(self._jobs) > self.max_jobs:
                        self._jobs.popitem(last=False)
                self._jobs.move_to_end(r.job_execution_id)
                seen = job.setdefault(r.step_execution_id, [])
                if seen and (seen[-1].node, seen[-1].attempt) == (r.node, r.attempt):
                    seen[-1].until = now
                else:
                    seen.append(Segment(r.node, r.attempt, now, now))

    def segments(self, job_execution_id: int) -> dict[int, list[Segment]]:
        """Step execution id -> where that partition was seen (copies)."""
        with self._lock:
            job = self._jobs.get(job_execution_id, {})
            return {k: [Segment(**vars(s)) for s in v] for k, v in job.items()}
