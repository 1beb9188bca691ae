"""Grouped commits on a worker node: claimed partitions of one transactional step run together.

A node whose recent partitions were short, of a tasklet step declared ``transactional`` whose
runs end in one call, claims up to ``commit_group_size`` partitions per free slot and runs each
slot's share in one transaction (:func:`dbcluster.batch.grouped.commit_group`): one ``BEGIN``,
each partition's call, one guarded final write for all of them, one ``COMMIT``. The guard
(:meth:`Grouping._guard`) records the partitions COMPLETED in one statement guarded by (id,
attempt, node, CLAIMED) for each, and the group commits only if it changed exactly one row per
partition: a partition moved meanwhile (reassigned, failed, its job abandoned, its node removed)
makes the whole group roll back, as a fenced node does. Then, and whenever a call fails, asks to
be called again or finds its job stopping, nothing of the group has committed, and each
partition runs alone on the same slot, as it would have without the group (a moved one is
refused by its own fence and reported lost). A group whose commit is unclear is judged per
partition, as a single partition's is (``Aftermath.fail_after_error``).

Every partition of a group is CLAIMED and STARTED by the claim, as any other: the fences,
retries, stop requests and takeovers hold unchanged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from dbcluster.batch.domain import StepExecution, utcnow
from dbcluster.batch.fence import FencedError
from dbcluster.batch.grouped import Ungrouped, commit_group, groupable
from dbcluster.batch.transactions import UnclearCommitError
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.patience import is_passing
from dbcluster.cluster.store import ClaimedPartition, NodeRemovedError
from dbcluster.retry import brief
from dbcluster.states import PARTITION_COMPLETED

#: The executor (``cluster/executor.py``) and its tasks, typed loosely here: the executor
#: imports this module, and no circle of imports is allowed.
Executor = Any
Task = Any

log = logging.getLogger("dbcluster.node")

#: A node groups partitions only while its partitions ran shorter than this on average
#: (milliseconds): a group's transaction lasts as long as its partitions together, and holds
#: their rows' locks that long.
GROUP_BELOW_MS = 250
#: How many of a node's slots may claim their next group at once (see :meth:`Grouping.refill`).
SLOT_CLAIMS = 2


class Grouping:
    """Which of an executor's claimed partitions run together (``size`` at most), and running
    them."""

    def __init__(self, executor: Executor, size: int) -> None:
        self.executor = executor
        self.size = size
        #: Per worker step: whether it may be grouped (transactional, without listeners).
        self._groupable: dict[str, bool] = {}
        #: Per worker step: whether its last partition that ended ended in one call.
        self._one_call: dict[str, bool] = {}
        #: Whether every partition of the last claim qualified for a group.
        self._last_claim = False
        #: Slots claiming their next group now (see :meth:`refill`).
        self._slot_claims = threading.BoundedSemaphore(SLOT_CLAIMS)

    def qualifies(self, worker_step_name: str) -> bool:
        """Whether partitions of this step may run in a group now: the step is groupable, its
        runs lately ended in one call and the node's partitions were short."""
        if self.size < 2 or not self._one_call.get(worker_step_name, False):
            return False
        recent = self.executor.recent_run_ms
        if recent is None or recent >= GROUP_BELOW_MS:
            return False
        return self._step_groupable(worker_step_name)

    def groupable_step(self, name: str) -> bool:
        """Whether partitions of this worker step may share a transaction (see
        :func:`~dbcluster.batch.grouped.groupable`): also whether one may run before it is
        claimed (see :mod:`dbcluster.cluster.placed`)."""
        return self._step_groupable(name)

    def _step_groupable(self, name: str) -> bool:
        found = self._groupable.get(name)
        if found is None:
            try:
                found = groupable(self.executor.registry.get_step(name))
            except Exception:  # noqa: BLE001 - the partition's own run says so
                found = False
            self._groupable[name] = found
        return found

    def together(self, tasks: Sequence[Task]) -> bool:
        """Whether ``tasks`` (more than one) may run as one group now: all of one step that
        qualifies."""
        names = {task.partition.worker_step_name for task in tasks}
        return len(tasks) > 1 and len(names) == 1 and self.qualifies(names.pop())

    def claim_size(self) -> int:
        """How many partitions the next claim may take per free slot."""
        return self.size if self._last_claim else 1

    def ran_alone(self, task: Task) -> None:
        """A partition ran alone and its step ended: note whether in one call."""
        se = task.step_execution
        if (
            se is not None
            and not se.status.is_running
            and self._step_groupable(task.partition.worker_step_name)
        ):
            self._one_call[task.partition.worker_step_name] = se.commit_count <= 1

    def batches(self, tasks: Sequence[Task], free_slots: int) -> list[list[Task]]:
        """What a claim won, in the order the slots take it: partitions that qualify spread
        over the free slots in groups of at most ``size`` (alone where there are no more of
        them than free slots), the others one by one."""
        alone: list[list[Task]] = []
        by_step: dict[str, list[Task]] = {}
        for task in tasks:
            name = task.partition.worker_step_name
            if self.qualifies(name):
                by_step.setdefault(name, []).append(task)
            else:
                alone.append([task])
        self._last_claim = bool(tasks) and not alone
        groups: list[list[Task]] = []
        slots = max(1, free_slots - len(alone))
        for members in by_step.values():
            count = max(-(-len(members) // self.size), min(slots, len(members)))
            groups.extend(members[k::count] for k in range(count))
        return groups + alone

    def refill(self, identity: Identity) -> tuple[list[ClaimedPartition], bool]:
        """The next group of a slot whose group committed, claimed by the slot itself from the
        partitions its node knows are waiting (a poll found them beyond what it claimed: the
        executor's ``next_partitions``) with the poller's own claim, for the slot to run next.
        A node's slots then refill side by side, where the one poller served them one after
        another, each with a poll and a claim, and the slots stood idle meanwhile. At most
        ``SLOT_CLAIMS`` slots claim at once (the claims take the node's own row one after
        another anyway, and share the autocommit pool with the heartbeat). What it won (none:
        the slot is free, and the poller takes over) where none is known, the node stops or is
        fenced, or the claim won none), and whether that was read back (see
        :meth:`Executor.take`): a claim that fails is read back once the database answers
        (:meth:`Aftermath.read_back_claim`), as one whose commit landed would otherwise leave
        its partitions CLAIMED on a live node that does not run them."""
        ex = self.executor
        size = self.claim_size()
        if size < 2 or ex.next_partitions is None or ex.context.stopping:
            return [], False
        if identity.fenced.is_set():
            return [], False
        with self._slot_claims:
            ids = ex.next_partitions(identity, size)
            if not ids:
                return [], False
            try:
                return ex.store.claim(identity.node_id, ex.load, ids, utcnow()), False
            except NodeRemovedError as exc:
                ex.context.fence(identity, str(exc))
                return [], False
            except Exception as exc:  # noqa: BLE001 - what it won, if anything, is read back
                # The database's passing trouble is said once, by the read back that waits it
                # out; anything else here.
                report = log.debug if is_passing(ex.store.provider, exc) else log.warning
                report("node %s: a slot's claim failed: %s", identity.node_id, brief(exc))
        return ex.aftermath.read_back_claim(identity, ids), True

    def run(self, tasks: list[Task]) -> list[Task]:
        """Run ``tasks`` (claimed, of one step) as one group. Returns those to run alone, each
        CLAIMED again (all of them when the group did not commit; none when it did, or when
        its unclear commit was judged per partition)."""
        ex = self.executor
        if not ex._begin_all(tasks):
            return tasks
        try:
            committed = self._commit(tasks)
        except UnclearCommitError as error:
            for task in tasks:
                ex.aftermath.fail_after_error(task, error)
            return []
        except Exception:  # noqa: BLE001 - a bug: each runs alone, as without the group
            log.exception("node %s could not run a group", tasks[0].identity.node_id)
            committed = False
        if committed:
            return []
        ex._unbegin(tasks)
        return tasks

    def _commit(self, tasks: list[Task]) -> bool:
        ex = self.executor
        name = tasks[0].partition.worker_step_name
        executions: list[StepExecution] = []
        for task in tasks:
            se = task.preloaded
            if se is None:
                return False
            fence = ex._fence_for(task)
            se.fence = fence
            with ex._lock:
                task.step_execution, task.fence = se, fence
            executions.append(se)
        attempts = {task.partition.step_execution_id: task.partition.attempt for task in tasks}
        identity = tasks[0].identity

        def entering(se: StepExecution) -> None:
            ex._entering(identity.node_id, attempts[se.id])

        def guard(conn: Connection, ses: Sequence[StepExecution]) -> None:
            if identity.fenced.is_set():
                raise FencedError(f"node {identity.node_id} is fenced; the group rolled back")
            members = [(se.id, attempts[se.id]) for se in ses]
            changed = ex.store.end_partitions(conn, identity.node_id, members)
            if changed != len(members):
                raise FencedError(
                    f"{len(members) - changed} of the group's {len(members)} partitions moved "
                    f"from node {identity.node_id}; the group rolled back"
                )

        step = ex.registry.get_step(name)
        watching = ex.stop_requests
        for se in executions:
            watching.watch(se.job_execution)
        began = time.monotonic()
        try:
            commit_group(step, executions, ex.runtime, guard, entering)  # type: ignore[arg-type]
        except UnclearCommitError:
            raise
        except Exception as error:  # noqa: BLE001 - each runs alone: its own run judges it
            if isinstance(error, Ungrouped) and "called again" in str(error):
                self._one_call[name] = False
            log.info(
                "node %s: a group of %d partitions of %s rolled back (%s); each runs alone",
                identity.node_id,
                len(tasks),
                name,
                error,
            )
            return False
        finally:
            for se in executions:
                watching.unwatch(se.job_execution)
        each_s = (time.monotonic() - began) / len(tasks)
        for task in tasks:
            assert task.fence is not None
            task.fence.outcome = PARTITION_COMPLETED
            ex._ran_for(each_s)
        ex.announce.group_completed(identity.node_id, [task.partition for task in tasks])
        return True
