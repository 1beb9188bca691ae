"""A node's executor hands partitions back: one it has not started (as a graceful stop hands back
what waits), and every one at a graceful stop (:meth:`Draining.drain`: what has not started
goes back, what runs finishes or is stopped at the deadline)."""

from __future__ import annotations

import logging
import time
from typing import Any

from dbcluster.cluster.task import CLAIMED, RELEASING, RUNNING, Task

#: The executor (``cluster/executor.py``), typed loosely here: it imports this module, and no
#: circle of imports is allowed.
Executor = Any

log = logging.getLogger("dbcluster.node")


class Draining:
    """The hand-backs of ``executor``'s partitions."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def release(self, task: Task) -> None:
        """Hand back ``task``'s partition, which has not begun: unassigned, next attempt."""
        ex = self.executor
        p = task.partition
        with ex._lock:
            task.state = RELEASING
        if task.identity.fenced.is_set():
            return
        try:
            if ex.store.release(
                p.step_execution_id, task.identity.node_id, p.attempt, placed=task.placed
            ):
                log.info(
                    "node %s handed back partition %s (%s)",
                    task.identity.node_id,
                    p.partition_name,
                    p.step_execution_id,
                )
                ex.context.events.released(
                    task.identity.node_id, p.partition_name, p.step_execution_id
                )
        except Exception as exc:  # noqa: BLE001 - the master recovers it once we are removed
            log.warning("could not hand back partition %s: %s", p.step_execution_id, exc)

    def drain(self, deadline: float) -> None:
        """A graceful stop: hand back what has not started, let running partitions finish (or
        stop them at the deadline), then shut the thread pool down."""
        ex = self.executor
        # Partitions running before their claim are claimed first: the hand-back below is of
        # partitions that have not started.
        ex.placed_runs.stop(claim_running=True)
        identity = ex.context.membership.current
        if identity is not None and not identity.fenced.is_set():
            try:
                handed = ex.store.release_pending(identity.node_id)
                if handed:
                    log.info(
                        "node %s handed back %d unclaimed partition(s)", identity.node_id, handed
                    )
                    ex.context.events.released(identity.node_id, None, None)
            except Exception as exc:  # noqa: BLE001 - they move once we leave the registry
                log.warning("could not hand back unclaimed partitions: %s", exc)
        with ex._lock:
            unstarted = [t for t in ex._tasks.values() if t.state == CLAIMED]
        for task in unstarted:
            if self._claim_back(task):
                self.release(task)
                ex._forget(task)
        self._wait_running(deadline)
        running = self._running()
        if running:
            log.warning("drain timeout: stopping %d running partition(s)", len(running))
            with ex._lock:
                for task in running:
                    if task.step_execution is not None:
                        task.step_execution.terminate_only = True
            grace_s = max(1.0, ex.context.settings.drain_timeout / 1000)
            self._wait_running(time.monotonic() + grace_s)
        ex._pool.shutdown(wait=False)

    def _claim_back(self, task: Task) -> bool:
        """Take a queued task away from the executor (it has not begun); True if taken."""
        ex = self.executor
        with ex._lock:
            if task.state != CLAIMED:
                return False
            task.state = RELEASING
            return True

    def _running(self) -> list[Task]:
        ex = self.executor
        with ex._lock:
            return [t for t in ex._tasks.values() if t.state == RUNNING]

    def _wait_running(self, deadline: float) -> None:
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.02)
