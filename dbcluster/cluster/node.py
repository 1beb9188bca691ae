"""A cluster node: registry row, heartbeat, sweeps, partition poller, stranded-master scan.

Each loop is its own thread with its own stop path, so a heartbeat never starves behind user code.
A node has an *identity* (a node id) per membership: when its row is removed, or it cannot
heartbeat for longer than the unreachable threshold, that identity is fenced: it claims nothing
more, starts nothing it claimed, makes every write of its running partitions fail (their write
guard becomes ``false``), and never writes under that id again. The node then rejoins under a
fresh id.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, false

from dbcluster.batch.domain import JobExecution, StepExecution, utcnow
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.local import LocalPartitionHandler
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.runtime import BatchRuntime
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.cluster.settings import ClusterSettings, _host_name
from dbcluster.cluster.store import CoordinationStore, PendingPartition
from dbcluster.dialects.base import PARTITION_COMPLETED, PARTITION_FAILED

if TYPE_CHECKING:
    from dbcluster.batch.registry import JobRegistry

log = logging.getLogger("dbcluster.node")

CLAIMED, RUNNING, RELEASED, DONE = "claimed", "running", "released", "done"
#: Prefix of an outcome already recorded in the step's final transaction.
RECORDED = "recorded:"

#: The id of the node running the current partition (for logs and ledgers in user code).
current_node_id: ContextVar[str | None] = ContextVar("dbcluster_current_node_id", default=None)
#: The attempt (fencing token) of the partition being run.
current_attempt: ContextVar[int | None] = ContextVar("dbcluster_current_attempt", default=None)
_current_node: ContextVar[Node | None] = ContextVar("dbcluster_current_node", default=None)


def checkpoint() -> None:
    """Park the calling partition while its node is paused (fault injection: a paused node is
    frozen as a stopped process would be, its running partitions included)."""
    node = _current_node.get()
    if node is not None:
        node._resumed.wait()


def _own_pool(engine: Engine) -> Engine:
    """A small engine of the node's own for coordination statements, so that a heartbeat never
    waits for a connection behind partitions that hold the application's pool."""
    from dbcluster.dialects import get_provider, make_engine

    if get_provider(engine).private_to_engine(engine):
        return engine
    # No pre-ping: a coordination statement on a dead connection fails as a transient error, the
    # pool is invalidated, and the store repeats it on a fresh connection; a ping per checkout
    # would add a round trip to every heartbeat, poll and claim.
    return make_engine(
        engine.url, coordination=True, pool_size=2, max_overflow=2, pool_pre_ping=False
    )


@dataclass
class Identity:
    """One membership of the cluster under one node id."""

    node_id: str
    joined_at: float = field(default_factory=time.monotonic)
    last_heartbeat_ok: float = field(default_factory=time.monotonic)
    fenced: threading.Event = field(default_factory=threading.Event)
    fence_reason: str = ""


@dataclass
class Task:
    partition: PendingPartition
    identity: Identity
    state: str = CLAIMED
    step_execution: StepExecution | None = None
    future: Future[None] | None = None
    preloaded: StepExecution | None = None
    claimed_at: float = field(default_factory=time.monotonic)


class Node:
    """A peer in the cluster. ``start()`` joins, ``stop()`` leaves gracefully."""

    def __init__(
        self,
        engine: Engine,
        registry: JobRegistry | None,
        settings: ClusterSettings | None = None,
        *,
        capacity: int | None = None,
        repository: JobRepository | None = None,
        host: str | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.settings = settings or ClusterSettings.from_env()
        self.capacity = self.settings.concurrency_limit if capacity is None else capacity
        if registry is None and self.capacity > 0:
            raise ValueError("a node that runs partitions needs a JobRegistry")
        self.host = host or _host_name()
        self.coordination_engine = _own_pool(engine)
        self.store = CoordinationStore(self.coordination_engine)
        self.repository = repository or JobRepository(engine)
        self.runtime = BatchRuntime(self.repository, LocalPartitionHandler(), registry)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._stopping = threading.Event()
        self._heartbeat_stop = threading.Event()
        self._poll_wake = threading.Event()
        self._paused = threading.Event()
        self._resumed = threading.Event()
        self._resumed.set()
        self._identity: Identity | None = None
        self._tasks: dict[int, Task] = {}
        self._job_cache: dict[int, JobExecution] = {}
        self._backlog = False
        self._threads: list[threading.Thread] = []
        self._executor: ThreadPoolExecutor | None = None
        self.masters: set[Any] = set()
        #: Fired with (event, details) for claims, completions, fencing and so on.
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []

    # --- identity -------------------------------------------------------------------------------

    @property
    def identity(self) -> Identity:
        if self._identity is None:
            raise RuntimeError("the node has not joined the cluster; call start()")
        return self._identity

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def is_fenced(self) -> bool:
        return self._identity is None or self._identity.fenced.is_set()

    def _emit(self, event: str, **details: Any) -> None:
        for listener in list(self.listeners):
            try:
                listener(event, details)
            except Exception:  # noqa: BLE001 - an observer must not break the node
                log.exception("node listener failed on %s", event)

    def _join(self) -> Identity:
        node_id = f"{self.settings.node_id_prefix}-{uuid.uuid4().hex}"
        self.store.register(node_id, self.host, self.capacity)
        identity = Identity(node_id)
        with self._lock:
            self._identity = identity
        log.info("node %s joined the cluster (capacity %d)", node_id, self.capacity)
        self._emit("joined", node_id=node_id)
        return identity

    def _fence(self, identity: Identity, reason: str) -> None:
        with self._lock:
            if identity.fenced.is_set():
                return
            identity.fenced.set()
            identity.fence_reason = reason
            tasks = [t for t in self._tasks.values() if t.identity is identity]
            for task in tasks:
                se = task.step_execution
                if se is not None:
                    se.write_guard = false()
                    se.terminate_only = True
        log.warning(
            "node %s fenced itself (%s): %d partition(s) left for their masters",
            identity.node_id,
            reason,
            len([t for t in tasks if t.state in (CLAIMED, RUNNING)]),
        )
        self._emit("fenced", node_id=identity.node_id, reason=reason)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Node:
        if self._threads:
            raise RuntimeError("node already started")
        self._join()
        if self.capacity > 0:
            self._executor = ThreadPoolExecutor(self.capacity, thread_name_prefix="dbcluster-part")
        s = self.settings
        loops: list[tuple[str, Callable[[], None], int, threading.Event]] = [
            ("heartbeat", self._heartbeat_once, s.heartbeat_interval, self._heartbeat_stop),
            ("sweep", self._sweep_once, s.sweep_interval, self._stop),
            ("stranded", self._stranded_once, s.stranded_master_scan_interval, self._stop),
        ]
        if self.capacity > 0:
            loops.append(("poll", self._poll_once, s.task_polling_interval, self._stop))
        for name, body, interval, stop in loops:
            thread = threading.Thread(
                target=self._loop,
                args=(name, body, interval, stop),
                name=f"dbcluster-{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _loop(
        self, name: str, body: Callable[[], None], interval_ms: int, stop: threading.Event
    ) -> None:
        wake = self._poll_wake if name == "poll" else None
        while not stop.is_set():
            self._resumed.wait()
            if stop.is_set():
                break
            try:
                body()
            except Exception:  # noqa: BLE001 - a loop survives its body's failures
                log.exception("node loop %s failed", name)
            if wake is not None:
                wake.wait(interval_ms / 1000)
                wake.clear()
            else:
                stop.wait(interval_ms / 1000)

    def wake(self) -> None:
        """Poll now (a master just placed partitions)."""
        self._poll_wake.set()

    def stop(self, drain_timeout_ms: int | None = None) -> None:
        """Leave gracefully: stop claiming, hand back what has not started, let running
        partitions finish (or stop them after the drain timeout), keep heartbeating to the end,
        then leave the registry."""
        if not self._threads:
            return
        drain = self.settings.drain_timeout if drain_timeout_ms is None else drain_timeout_ms
        self._stopping.set()
        self._resumed.set()
        self._poll_wake.set()
        self._withdraw()
        self._release_unstarted()
        deadline = time.monotonic() + drain / 1000
        self._wait_running(deadline)
        if self._running_tasks():
            log.warning(
                "drain timeout: stopping %d running partition(s)", len(self._running_tasks())
            )
            with self._lock:
                for task in self._running_tasks():
                    if task.step_execution is not None:
                        task.step_execution.terminate_only = True
            self._wait_running(time.monotonic() + max(1.0, drain / 1000))
        self._wait_masters(deadline)
        self._stop.set()
        self._poll_wake.set()
        for thread in self._threads:
            if thread.name != "dbcluster-heartbeat":
                thread.join(timeout=5)
        self._heartbeat_stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._executor is not None:
            # Queued tasks are not cancelled: each one, refused by _begin, hands its partition back.
            self._executor.shutdown(wait=False)
        identity = self._identity
        if identity is not None and not identity.fenced.is_set():
            # Nothing writes under this id after it leaves (a master still monitoring stops).
            identity.fence_reason = "left the cluster"
            identity.fenced.set()
            try:
                self.store.deregister(identity.node_id)
                log.info("node %s left the cluster", identity.node_id)
            except Exception as exc:  # noqa: BLE001 - it will be swept as unreachable
                log.warning("node %s could not deregister: %s", identity.node_id, exc)
        self._threads = []
        if self.coordination_engine is not self.engine:
            self.coordination_engine.dispose()

    def _withdraw(self) -> None:
        """Publish capacity 0, so no master places or moves partitions onto a leaving node."""
        identity = self._identity
        if identity is None or identity.fenced.is_set() or self.capacity == 0:
            return
        try:
            self.store.set_capacity(identity.node_id, 0)
        except Exception as exc:  # noqa: BLE001 - its partitions move once it leaves anyway
            log.warning("node %s could not withdraw its capacity: %s", identity.node_id, exc)

    def _running_tasks(self) -> list[Task]:
        with self._lock:
            return [t for t in self._tasks.values() if t.state == RUNNING]

    def _wait_running(self, deadline: float) -> None:
        while self._running_tasks() and time.monotonic() < deadline:
            time.sleep(0.02)

    def _wait_masters(self, deadline: float) -> None:
        while self.masters and time.monotonic() < deadline:
            time.sleep(0.02)

    def _release_unstarted(self) -> None:
        identity = self._identity
        if identity is not None and not identity.fenced.is_set():
            try:
                handed = self.store.release_pending(identity.node_id)
                if handed:
                    log.info(
                        "node %s handed back %d unclaimed partition(s)", identity.node_id, handed
                    )
                    self._emit("released", count=handed)
            except Exception as exc:  # noqa: BLE001 - they move once we leave the registry
                log.warning("could not hand back unclaimed partitions: %s", exc)
        with self._lock:
            unstarted = [t for t in self._tasks.values() if t.state == CLAIMED]
            for task in unstarted:
                task.state = RELEASED
        for task in unstarted:
            self._release(task)

    def _release(self, task: Task) -> None:
        p = task.partition
        if task.identity.fenced.is_set():
            return
        try:
            if self.store.release(p.step_execution_id, task.identity.node_id, p.attempt):
                log.info(
                    "node %s handed back partition %s (%s)",
                    task.identity.node_id,
                    p.partition_name,
                    p.step_execution_id,
                )
                self._emit("released", partition=p.partition_name, id=p.step_execution_id)
        except Exception as exc:  # noqa: BLE001 - the master recovers it once we are removed
            log.warning("could not hand back partition %s: %s", p.step_execution_id, exc)
        finally:
            self._forget(task)

    def _forget(self, task: Task) -> None:
        with self._lock:
            task.state = DONE
            self._tasks.pop(task.partition.step_execution_id, None)

    # --- fault injection (tests) ----------------------------------------------------------------

    def pause(self) -> None:
        """Freeze every loop (heartbeat included), as a stopped process would be."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    # --- loops ----------------------------------------------------------------------------------

    @property
    def load(self) -> int:
        with self._lock:
            return sum(1 for t in self._tasks.values() if t.state in (CLAIMED, RUNNING))

    def _heartbeat_once(self) -> None:
        identity = self._identity
        if identity is None or identity.fenced.is_set():
            if not self._stopping.is_set():
                self._rejoin()
            return
        try:
            alive = self.store.heartbeat(identity.node_id, self.load)
        except Exception as exc:  # noqa: BLE001 - judged by how long it has lasted
            silent_ms = (time.monotonic() - identity.last_heartbeat_ok) * 1000
            log.warning("node %s cannot heartbeat (%d ms): %s", identity.node_id, silent_ms, exc)
            if silent_ms >= self.settings.unreachable_threshold:
                self._fence(identity, f"no heartbeat for {silent_ms:.0f} ms")
            return
        # A heartbeat that only lands after the unreachable threshold may have revived a row
        # that others already judged; we still hold it, so it counts as alive.
        if alive:
            identity.last_heartbeat_ok = time.monotonic()
        else:
            self._fence(identity, "its registry row was removed")

    def _rejoin(self) -> None:
        try:
            self._join()
        except Exception as exc:  # noqa: BLE001 - try again on the next beat
            log.warning("node could not rejoin the cluster: %s", exc)

    def _sweep_once(self) -> None:
        identity = self._identity
        if identity is None or self._stopping.is_set() or self._watchdog(identity):
            return
        marked, removed = self.store.sweep(
            self.settings.unreachable_threshold, self.settings.cleanup_threshold
        )
        if marked or removed:
            log.info("sweep: %d node(s) marked unreachable, %d removed", marked, removed)
            self._emit("swept", marked=marked, removed=removed)

    def _stranded_once(self) -> None:
        if self.is_fenced or self._stopping.is_set():
            return
        from dbcluster.cluster.recovery import recover_stranded_jobs

        recover_stranded_jobs(self)

    def _watchdog(self, identity: Identity) -> bool:
        """Fence when the last good heartbeat is so old that the cluster may remove this node at
        any moment, even if the heartbeat thread itself is stuck in a call that has not returned
        (a cut network) or the process was stopped. Shorter silences stay in the grace window:
        an UNREACHABLE node that beats again is ACTIVE again."""
        s = self.settings
        limit = max(s.unreachable_threshold, s.cleanup_threshold - s.heartbeat_interval)
        silent_ms = (time.monotonic() - identity.last_heartbeat_ok) * 1000
        if silent_ms >= limit and not identity.fenced.is_set():
            self._fence(identity, f"no heartbeat for {silent_ms:.0f} ms")
        return identity.fenced.is_set()

    def _poll_once(self) -> None:
        identity = self._identity
        if identity is None or identity.fenced.is_set() or self._stopping.is_set():
            return
        if self._watchdog(identity):
            return
        free = self.capacity - self.load
        if free <= 0:
            return
        polled = self.store.poll(identity.node_id, free)
        # More may be waiting: poll again as soon as a slot frees up.
        self._backlog = len(polled) >= free
        claimed: list[Task] = []
        try:
            for pending in polled:
                if identity.fenced.is_set() or self._stopping.is_set():
                    break
                if pending.step_execution_id in self._tasks:
                    continue
                try:
                    won = self.store.claim(
                        pending.step_execution_id, identity.node_id, pending.attempt
                    )
                except Exception as exc:  # noqa: BLE001 - a claim that may have committed
                    log.warning("claim of partition %s failed: %s", pending.step_execution_id, exc)
                    won = self._claimed_anyway(pending, identity)
                if not won:
                    continue
                task = Task(pending, identity)
                with self._lock:
                    self._tasks[pending.step_execution_id] = task
                claimed.append(task)
                log.info(
                    "node %s claimed partition %s (%s, attempt %d)",
                    identity.node_id,
                    pending.partition_name,
                    pending.step_execution_id,
                    pending.attempt,
                )
                self._emit(
                    "claimed",
                    node_id=identity.node_id,
                    partition=pending.partition_name,
                    id=pending.step_execution_id,
                    attempt=pending.attempt,
                )
        finally:
            # Whatever happened above, every partition claimed gets a task that runs it (or,
            # refused by _begin when fenced or stopping, hands it back).
            self._preload(claimed)
            assert self._executor is not None
            for task in claimed:
                task.future = self._executor.submit(self._run, task)

    def _claimed_anyway(self, pending: PendingPartition, identity: Identity) -> bool:
        """After a claim raised: whether it committed all the same (then it is ours to run)."""
        deadline = time.monotonic() + self.settings.unreachable_threshold / 1000
        while time.monotonic() < deadline and not identity.fenced.is_set():
            try:
                return self.store.holds(
                    pending.step_execution_id, identity.node_id, pending.attempt
                )
            except Exception:  # noqa: BLE001 - the database is not answering yet
                time.sleep(0.1)
        return False

    def _job_execution(self, job_execution_id: int) -> JobExecution | None:
        """Job executions are read once per node and shared by their partitions (a worker step
        reads its parameters and job context, which do not change while it runs)."""
        with self._lock:
            cached = self._job_cache.get(job_execution_id)
        if cached is not None:
            return cached
        loaded = self.repository.get_job_execution(job_execution_id)
        if loaded is not None:
            with self._lock:
                if len(self._job_cache) >= 64:
                    self._job_cache.pop(next(iter(self._job_cache)))
                self._job_cache[job_execution_id] = loaded
        return loaded

    def _preload(self, tasks: list[Task]) -> None:
        """Load the step executions of freshly claimed partitions in one query per job."""
        by_job: dict[int, list[Task]] = {}
        for task in tasks:
            by_job.setdefault(task.partition.job_execution_id, []).append(task)
        for job_execution_id, group in by_job.items():
            try:
                job_execution = self._job_execution(job_execution_id)
                if job_execution is None:
                    continue
                loaded = self.repository.get_step_executions_by_ids(
                    job_execution, [t.partition.step_execution_id for t in group]
                )
            except Exception as exc:  # noqa: BLE001 - each task loads its own instead
                log.warning("could not preload step executions: %s", exc)
                continue
            by_id = {se.id: se for se in loaded}
            for task in group:
                task.preloaded = by_id.get(task.partition.step_execution_id)

    # --- running a partition --------------------------------------------------------------------

    def _begin(self, task: Task) -> bool:
        with self._lock:
            if task.state != CLAIMED or task.identity.fenced.is_set() or self._stopping.is_set():
                return False
            task.state = RUNNING
            return True

    def _run(self, task: Task) -> None:
        p, identity = task.partition, task.identity
        try:
            if not self._begin(task):
                if task.state == CLAIMED and self._stopping.is_set():
                    task.state = RELEASED
                    self._release(task)
                return
            outcome = self._execute(task)
            if outcome is None:
                return
            already = outcome.startswith(RECORDED)
            outcome = outcome.removeprefix(RECORDED)
            if not already and identity.fenced.is_set():
                return
            if already or self.store.finish(
                p.step_execution_id, identity.node_id, p.attempt, outcome
            ):
                log.info(
                    "node %s %s partition %s (%s)",
                    identity.node_id,
                    "completed" if outcome == PARTITION_COMPLETED else "failed",
                    p.partition_name,
                    p.step_execution_id,
                )
                self._emit(
                    "completed" if outcome == PARTITION_COMPLETED else "failed",
                    node_id=identity.node_id,
                    partition=p.partition_name,
                    id=p.step_execution_id,
                )
            else:
                log.warning(
                    "node %s no longer holds partition %s (%s); its outcome was not recorded",
                    identity.node_id,
                    p.partition_name,
                    p.step_execution_id,
                )
        except Exception:  # noqa: BLE001 - recorded FAILED once the database answers
            log.exception("node failed to run partition %s", p.step_execution_id)
            self._fail_after_error(task)
        finally:
            self._forget(task)
            if self._backlog:
                self._poll_wake.set()

    def _fail_after_error(self, task: Task) -> None:
        """The step could not record its outcome (its final transaction failed, e.g. the
        database connection dropped). A partition left CLAIMED on a live node is never looked
        at again (masters only recover partitions of nodes that are gone), so record FAILED
        under the same guard once the database answers, unless the step's own final commit
        landed after all. A fenced node, or one that is leaving, leaves it to the master."""
        p, identity = task.partition, task.identity
        while not identity.fenced.is_set() and not self._stopping.is_set():
            try:
                se = self.repository.get_step_execution(p.step_execution_id)
                if se is None:
                    return
                outcome = (
                    PARTITION_COMPLETED if se.status is BatchStatus.COMPLETED else PARTITION_FAILED
                )
                if se.status.is_running:
                    se.status = BatchStatus.FAILED
                    se.exit_status = ExitStatus.FAILED.with_description(  # type: ignore[attr-defined]
                        f"node {identity.node_id} could not record the outcome of partition "
                        f"{p.partition_name}"
                    )
                    se.end_time = utcnow()
                    se.write_guard = self.store.provider.partition_guard(
                        p.step_execution_id, identity.node_id, p.attempt
                    )
                    self.repository.update_step_execution(se)
                if self.store.finish(p.step_execution_id, identity.node_id, p.attempt, outcome):
                    log.warning(
                        "node %s recorded partition %s %s after an error",
                        identity.node_id,
                        p.partition_name,
                        outcome,
                    )
                return
            except OptimisticLockingFailureError:
                return  # no longer ours: its master decides
            except Exception as exc:  # noqa: BLE001 - try again when the database answers
                log.warning("cannot record partition %s yet: %s", p.step_execution_id, exc)
                self._stop.wait(self.settings.heartbeat_interval / 1000)

    def _execute(self, task: Task) -> str | None:
        """Run the worker step; the partition status to record, or None to record nothing."""
        p, identity = task.partition, task.identity
        se = task.preloaded or self.repository.get_step_execution(p.step_execution_id)
        if se is None:
            log.error("partition %s has no step execution", p.step_execution_id)
            return PARTITION_FAILED
        se.write_guard = self.store.provider.partition_guard(
            p.step_execution_id, identity.node_id, p.attempt
        )
        if se.status is BatchStatus.COMPLETED:
            # Its node died between finishing the step and recording the partition.
            return PARTITION_COMPLETED
        assert self.registry is not None
        try:
            step = self.registry.get_step(p.worker_step_name)
        except Exception as exc:  # noqa: BLE001 - recorded on the step execution
            se.status = BatchStatus.FAILED
            se.exit_status = ExitStatus.FAILED.with_description(  # type: ignore[attr-defined]
                f"node {identity.node_id} has no step {p.worker_step_name!r}: {exc}"
            )
            se.end_time = utcnow()
            try:
                self.repository.update_step_execution(se)
            except OptimisticLockingFailureError:
                return None
            return PARTITION_FAILED
        with self._lock:
            task.step_execution = se
            if identity.fenced.is_set():
                return None
        _current_node.set(self)
        current_node_id.set(identity.node_id)
        current_attempt.set(p.attempt)
        recorded: list[str] = []
        provider = self.store.provider

        def record_outcome(conn: Connection) -> None:
            """The partition's outcome, in the step's final transaction: both commit or
            neither does."""
            if identity.fenced.is_set():
                raise OptimisticLockingFailureError(f"node {identity.node_id} is fenced")
            if se.status is BatchStatus.COMPLETED:
                outcome = PARTITION_COMPLETED
            elif se.status is BatchStatus.STOPPED and self._stopping.is_set() and p.transferable:
                outcome = RELEASED  # stopped by a graceful shutdown: it may run elsewhere
            else:
                outcome = PARTITION_FAILED
            stmt = (
                provider.release_partition(p.step_execution_id, identity.node_id, p.attempt)
                if outcome == RELEASED
                else provider.finish_partition(
                    p.step_execution_id, identity.node_id, p.attempt, outcome
                )
            )
            if conn.execute(stmt).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"partition {p.step_execution_id} is no longer held by {identity.node_id} "
                    f"under attempt {p.attempt}"
                )
            recorded.append(outcome)

        se.on_final_commit = record_outcome
        try:
            step.execute(se, self.runtime)
        except OptimisticLockingFailureError as exc:
            log.warning(
                "node %s lost partition %s while running it: %s",
                identity.node_id,
                p.partition_name,
                exc,
            )
            if not identity.fenced.is_set():
                # Refused on its version, not its guard (e.g. a commit acknowledgement lost on
                # a dropped connection): the node still holds the partition, so record an
                # outcome rather than leave it CLAIMED where no master looks.
                self._fail_after_error(task)
            return None
        if recorded and recorded[0] == RELEASED:
            log.info("node %s handed back stopped partition %s", identity.node_id, p.partition_name)
            self._emit("released", partition=p.partition_name, id=p.step_execution_id)
            return None
        return RECORDED + (recorded[0] if recorded else PARTITION_FAILED)
