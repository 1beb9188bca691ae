"""Partitions an idle node runs before claiming them: a wake-up carried their executions (see
:mod:`dbcluster.cluster.offers`), and each one's claim rides in its first transaction.

Why: a claim is a round trip and a ``COMMIT`` (a WAL flush) between a launch and its partition's
body, as long as the rest of that path. A partition of a transactional step (every effect of a
call in the call's transaction) need not wait for it: its fence's guards accept the row PENDING
on this node under its attempt as well as CLAIMED, and the first transaction that holds it
leaves it CLAIMED (:class:`~dbcluster.cluster.fencing.PartitionFence`, ``placed``). A partition
that moved before that transaction commits (taken by another node, handed back, its node
removed) changed its node or its attempt: the guard refuses it and nothing of the run commits,
exactly as for a claimed partition that moved.

Only while the node runs nothing (no partition held, no slot busy) and its poller is not
claiming (the caller holds the poller's claim lock): no claim of this node's may then win the
partition as well, which would record its start under the run's feet. A partition whose first
transaction is still open after ``CLAIM_PLACED_AFTER_MS`` (or half ``work_stealing_delay``) is
claimed beside it (:meth:`~dbcluster.cluster.store.claims.Claims.claim_placed`), so that no idle
node takes a long-running partition that still reads PENDING.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from dbcluster import points
from dbcluster.batch.domain import utcnow
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.offers import PlacedPartition
from dbcluster.cluster.task import CLAIMED, RUNNING, Task

#: The executor (``cluster/executor.py``), typed loosely here: it imports this module, and no
#: circle of imports is allowed.
Executor = Any

log = logging.getLogger("dbcluster.node")

#: A placed partition whose first transaction has not committed after this long (or half
#: ``work_stealing_delay``, if less) is claimed beside it (milliseconds).
CLAIM_PLACED_AFTER_MS = 1000
#: How long the thread that handed placed partitions to their slots sleeps (seconds): a sleep
#: gives up Python's interpreter lock, which the slots' threads are waiting for.
HAND_OFF_S = 0.0001


class PlacedRuns:
    """An executor's partitions run before they were claimed, and the claims of those that run
    long."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        delay = executor.context.settings.work_stealing_delay
        self.claim_after_s = min(CLAIM_PLACED_AFTER_MS, delay / 2) / 1000
        self._due: list[tuple[float, int, Task]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def run(self, identity: Identity, placed: Sequence[PlacedPartition]) -> list[int]:
        """Run those of ``placed`` this node may run before claiming them (a step of its own
        declared transactional; while it runs nothing else; as many as it has slots; none it
        ran lately, which a late wake-up may name). The caller holds the poller's claim lock.
        Returns the ids it runs (the others are claimed as usual)."""
        ex = self.executor
        started = utcnow()
        tasks: list[Task] = []
        with ex._lock:
            if ex._tasks or ex._busy or ex.context.stopping or identity.fenced.is_set():
                return []
            for offered in placed[: ex.capacity]:
                p = offered.partition
                if ex.ended_lately(p) or not ex.grouping.groupable_step(p.worker_step_name):
                    continue
                se = offered.step_execution
                # Its start is recorded by its first transaction's write of the step.
                se.status = BatchStatus.STARTED
                se.exit_status = ExitStatus.EXECUTING
                se.start_time = started
                se.start_recorded = True
                task = Task(p, identity, preloaded=se, placed=True)
                ex._tasks[p.step_execution_id] = task
                tasks.append(task)
            ex._busy += len(tasks)
        if not tasks:
            return []
        ids = [t.partition.step_execution_id for t in tasks]
        points.reach("node.placed_run", node_id=identity.node_id, partitions=ids)
        ex.claimed_placed([t.partition for t in tasks])
        # Their claims are told before they run (an end told first would never be matched).
        ex.announce.claimed_events(identity.node_id, [t.partition for t in tasks])
        for task in tasks:
            ex._pool.submit(ex._run, task)
        # This thread lets the partition threads have the interpreter at once (else they wait
        # for what it does next), then says what they run: neither is on their path.
        time.sleep(HAND_OFF_S)
        ex.announce.took_placed(identity.node_id, [t.partition for t in tasks])
        for task in tasks:
            self._watch(task, self.claim_after_s)
        return ids

    # --- claiming the long ones -----------------------------------------------------------------

    def _watch(self, task: Task, after_s: float) -> None:
        with self._changed:
            if self._stopped:
                return
            heapq.heappush(self._due, (time.monotonic() + after_s, next(self._order), task))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="dbcluster-placed", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._stopped:
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    if wait is not None and wait <= 0:
                        break
                    self._changed.wait(wait)
                if self._stopped:
                    return
                _, _, task = heapq.heappop(self._due)
            if self._claim_if_running(task) is None:
                self._watch(task, self.claim_after_s)  # the claim failed: again later

    def _claim_if_running(self, task: Task) -> bool | None:
        """``task``'s partition, still running, claimed beside its transaction: whether the
        claim changed its row (not: its first transaction claimed it, or it moved), False
        when it no longer runs, None when the claim failed."""
        ex = self.executor
        with ex._lock:
            running = task.state in (CLAIMED, RUNNING) and not task.identity.fenced.is_set()
        if not running:
            return False
        p = task.partition
        try:
            claimed = ex.store.claim_placed(p.step_execution_id, task.identity.node_id, p.attempt)
        except Exception as exc:  # noqa: BLE001 - tried again; its first commit claims it too
            log.debug(
                "node %s: claiming placed partition %s failed: %s",
                task.identity.node_id,
                p.partition_name,
                exc,
            )
            return None
        if claimed:
            log.info(
                "node %s claimed partition %s (%s, attempt %d) beside its first transaction, "
                "still open after %.1f s",
                task.identity.node_id,
                p.partition_name,
                p.step_execution_id,
                p.attempt,
                self.claim_after_s,
            )
        return claimed

    def stop(self, *, claim_running: bool = False) -> None:
        """No more claims of long-running placed partitions (the node is leaving); with
        ``claim_running``, those still running are claimed now (a leaving node hands back what
        it has not started: these have), each tried once."""
        with self._changed:
            self._stopped = True
            self._due.clear()
            self._changed.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        if claim_running:
            ex = self.executor
            with ex._lock:
                running = [t for t in ex._tasks.values() if t.placed]
            for task in running:
                self._claim_if_running(task)
