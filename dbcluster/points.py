"""Named fault points: places in the engine where a test can park a thread.

Production code calls :func:`reach` at the worst moments of its protocols (a chunk transaction
holding its fence just before ``COMMIT``, a master between two steps, a worker between its poll
and its claim). With no handler installed (none is outside tests and the latency benchmark,
which records when a launch reaches some of them: :mod:`dbcluster.bench.stages`), :func:`reach`
is one truthiness check of an empty dict: a point costs nothing unless it is armed. Tests install
handlers with :func:`parked` (in-process) or through :mod:`dbcluster.testing.faults` (in a node
process, steered by files). This module sits at the bottom of the house (it imports nothing of
dbcluster), so the engine never imports the test package to reach a point. Not public API
(``dbcluster.testing.points`` names the same functions, for tests written before it moved).

Points and the details they pass:

- ``chunk.before_commit``: ``conn``, ``step_execution``: a step transaction (a chunk, a tasklet
  call, a step's start write) holds its fence and is about to commit.
- ``step.before_final_commit``: ``conn``, ``step_execution``: a step's final transaction.
- ``job.before_commit``: ``conn``, ``job_execution``: a master's job-level write.
- ``transaction.before_commit``: after any of the three above, last thing before ``COMMIT``
  (the test application observes there what its transaction holds at commit time).
- ``group.before_final_write``: ``conn``, ``step_executions``: a group of partitions ran its
  bodies in one transaction (see ``cluster/grouping.py``) and is about to take their rows;
  then each member reaches the three points above (with ``group``) as its own transaction
  would.
- ``driver.execute``: ``conn``, ``sql``: a prebuilt statement is about to go out on the
  driver's own cursor (``dbcluster.prebuilt``), where no ``do_execute`` listener sees it; a
  fault harness that fails statements there marks its ``do_execute`` listener
  ``sees_driver_path = True`` so the path stays in use (``testing/faults.py``).
- ``transaction.commit_sent``: ``conn``, ``sql``: a transaction's last statement (``sql``) and
  its ``COMMIT`` went out together and their results came back (``Prebuilt.one_committing``);
  a handler raising a lost connection's error here is a ``COMMIT`` whose acknowledgement was
  lost.
- ``master.after_create_execution``: ``job_execution``: the execution and its coordination row
  committed (with a first run's partitions, where they were placed in that transaction: see
  ``Cluster.create_execution``); the master has not started the job.
- ``master.between_steps``: ``job_execution``, ``next_step``: a step ended, the next has not
  started.
- ``master.before_place``: ``job_execution``: the master read the live nodes, ran the
  partitioner and is about to place a partitioned step's partitions (inside the creating
  transaction when a launch places them there).
- ``node.between_poll_and_claim``: ``node_id``, ``partitions``: a worker read its pending
  partitions and has not claimed them.
- ``node.offered``: ``node_id``, ``partitions``: a worker's listener received a wake-up naming
  these partitions (step execution ids), before the worker is told.
- ``node.claimed``: ``node_id``, ``partitions``: a worker's poller claimed; the partitions it
  won (``ClaimedPartition`` objects), before its executor starts them (not the claims a
  partition's final write makes as its slot hands itself on).
- ``app.checkpoint``: ``node_id``: the test application's partition body (see
  :func:`dbcluster.testing.app.ledger_tasklet`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Handler = Callable[..., None]

_handlers: dict[str, list[Handler]] = {}
_lock = threading.Lock()


def reach(name: str, **details: Any) -> None:
    """Run the handlers installed at ``name`` (none outside tests)."""
    if _handlers:
        for handler in list(_handlers.get(name, ())):
            handler(**details)


def install(name: str, handler: Handler) -> None:
    with _lock:
        _handlers.setdefault(name, []).append(handler)


def remove(name: str, handler: Handler) -> None:
    with _lock:
        found = _handlers.get(name, [])
        if handler in found:
            found.remove(handler)
        if not found:
            _handlers.pop(name, None)


class Parking:
    """Threads that reached a point and matched wait here until :meth:`release`."""

    def __init__(self, name: str, match: Callable[..., bool], limit: int | None) -> None:
        self.name = name
        self.match = match
        self.limit = limit
        self.arrivals: list[dict[str, Any]] = []
        self._arrived = threading.Condition()
        self._released = threading.Event()

    def __call__(self, **details: Any) -> None:
        if self._released.is_set() or not self.match(**details):
            return
        with self._arrived:
            if self.limit is not None and len(self.arrivals) >= self.limit:
                return
            self.arrivals.append(details)
            self._arrived.notify_all()
        self._released.wait()

    def wait(self, count: int = 1, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Block until ``count`` threads are parked here; their details."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.arrivals) >= count, timeout):
                raise TimeoutError(f"no thread reached fault point {self.name} in {timeout} s")
            return list(self.arrivals)

    def release(self) -> None:
        self._released.set()


@contextmanager
def parked(
    name: str, match: Callable[..., bool] = lambda **_: True, *, limit: int | None = 1
) -> Iterator[Parking]:
    """Park the first ``limit`` threads (None: all) that reach ``name`` and satisfy ``match``,
    until the parking is released (at the latest when the block exits)."""
    parking = Parking(name, match, limit)
    install(name, parking)
    try:
        yield parking
    finally:
        parking.release()
        remove(name, parking)
