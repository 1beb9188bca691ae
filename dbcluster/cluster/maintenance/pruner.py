"""Pruning: finished job executions older than an age are deleted with everything that hangs off
them, in foreign-key order, in short transactions, and a node can do it on its own.

What may go (judged by the database, in SQL, and judged again in the transaction that deletes):

- an execution whose status is one of the prunable statuses (every finished status by default:
  never STARTING, STARTED or STOPPING) and that *ended* more than the age before the database
  clock (an execution with no end time never goes);
- not one whose coordination row is in flight (CREATED, STARTED, RECOVERING);
- no execution of an instance whose newest execution did not complete (FAILED, STOPPED,
  ABANDONED, UNKNOWN, or still running): such an instance may be restarted, and a restart reads
  every earlier execution of it (completed steps, partitions, the flow's path), so all of them
  stay until it completes;
- not the ``keep_last`` newest executions of each job name, whatever their age.

Deleting one execution: its step executions go in slices of ``batch_size`` (their partition rows,
their contexts, themselves; one transaction per slice), then its coordination row, master
history, context, parameters and the execution itself, and its job instance if no execution of
it is left (one transaction per slice of executions). Every transaction is short and
every lock wait bounded (the store's engine), so a node that claims and heartbeats meanwhile waits
at most one slice. A prune that stops part-way (a crash, a lost lease) leaves only executions
that may still go: the next prune finishes them.

One node at a time: the :class:`Pruner` service runs only while its node holds the ``prune``
lease (:mod:`.leases`: taken, renewed and fenced by the node's lease service, like every leased
service's), like Oban's Pruner that runs only on the leader; it checks between its transactions
that the node still holds it, and stops there once it does not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore
from dbcluster.errors import ConfigurationError
from dbcluster.schema import (
    job_coordination,
    job_execution,
    job_execution_context,
    job_execution_params,
    job_instance,
    job_masters,
    partitions,
    step_execution,
    step_execution_context,
)

log = logging.getLogger("dbcluster.prune")

#: Statuses of a finished execution (never STARTING, STARTED or STOPPING).
FINISHED = tuple(s.value for s in BatchStatus if not s.is_running)
#: Tables in the order rows are deleted from them (children first).
TABLES = tuple(
    t.name
    for t in (
        partitions,
        step_execution_context,
        step_execution,
        job_coordination,
        job_masters,
        job_execution_context,
        job_execution_params,
        job_execution,
        job_instance,
    )
)


def parse_statuses(text: str | None) -> tuple[str, ...]:
    """``COMPLETED,FAILED`` -> the statuses (finished ones only); None: every finished one."""
    if text is None:
        return FINISHED
    wanted = tuple(dict.fromkeys(s.strip().upper() for s in text.split(",") if s.strip()))
    wrong = [s for s in wanted if s not in FINISHED]
    if not wanted or wrong:
        raise ConfigurationError(
            f"invalid --status {text!r}: give finished statuses, comma-separated, from "
            f"{','.join(FINISHED)} (running executions are never pruned)"
        )
    return wanted


@dataclass(frozen=True)
class PrunePolicy:
    """What to prune: finished executions (``statuses``) ended more than ``older_than_ms``
    ago, except the ``keep_last`` newest of each job name; ``batch_size`` rows per statement
    and transaction (at most the IN-list limit)."""

    older_than_ms: int
    keep_last: int = 0
    statuses: tuple[str, ...] = FINISHED
    batch_size: int = 500

    def __post_init__(self) -> None:
        if self.older_than_ms < 0:
            raise ConfigurationError(f"the age must not be negative, not {self.older_than_ms} ms")
        if self.keep_last < 0:
            raise ConfigurationError(f"--keep-last must be 0 or more, not {self.keep_last}")
        if not 1 <= self.batch_size <= 500:
            raise ConfigurationError(f"--batch-size must be 1 to 500, not {self.batch_size}")
        parse_statuses(",".join(self.statuses))


@dataclass
class PruneResult:
    """Rows per table (deleted, or that would be by a dry run), and the executions' ids."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    executions: list[int] = field(default_factory=list)
    #: False when it stopped before the end (asked to, or lost its lease).
    finished: bool = True
    seconds: float = 0.0
    #: The longest single transaction, seconds (what a claim may have waited behind).
    longest_transaction_s: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Pruning:
    """Prunes a repository through a :class:`CoordinationStore` (its bounded lock waits, its
    transient-error retries). Statements are the provider's, built once per store."""

    def __init__(self, store: CoordinationStore) -> None:
        self.store = store
        self.provider = store.provider

    def _key(self, policy: PrunePolicy) -> tuple[Any, ...]:
        return (policy.statuses, policy.older_than_ms)

    def _select(self, policy: PrunePolicy) -> Any:
        provider = self.provider
        return self.store.prepared(
            ("prune-select", *self._key(policy), policy.keep_last),
            lambda: provider.select_prunable(
                policy.statuses, policy.older_than_ms, BatchStatus.COMPLETED.value, policy.keep_last
            ),
        )

    def candidates(self, policy: PrunePolicy) -> list[int]:
        """The ids of the executions the policy deletes now, oldest first."""
        stmt = self._select(policy)
        rows = self.store.transaction(lambda conn: conn.execute(stmt).all(), "prune candidates")
        return [int(r[0]) for r in rows]

    def dry_run(self, policy: PrunePolicy) -> PruneResult:
        """What :meth:`prune` would delete now, per table (nothing is written)."""
        started = time.monotonic()
        result = PruneResult(executions=self.candidates(policy))
        counts = self.provider.count_prunable(self._select(policy))

        def read(conn: Connection) -> dict[str, int]:
            return {name: int(conn.execute(stmt).scalar_one()) for name, stmt in counts.items()}

        result.counts.update(self.store.transaction(read, "prune dry run"))
        result.seconds = time.monotonic() - started
        return result

    def prune(
        self, policy: PrunePolicy, keep_going: Callable[[], bool] = lambda: True
    ) -> PruneResult:
        """Delete what the policy says, slice by slice; ``keep_going()`` is asked before every
        transaction (False: stop there, leaving a consistent repository)."""
        started = time.monotonic()
        result = PruneResult()
        # No slice above what one statement of this database should write (see the provider).
        policy = replace(
            policy, batch_size=min(policy.batch_size, self.provider.partition_write_batch)
        )
        ids = self.candidates(policy)
        size = policy.batch_size
        for first in range(0, len(ids), size):
            chunk = ids[first : first + size]
            # Asked before every transaction but the prune's opening reads (the caller asked
            # just before them): a pruner that lost its lease begins nothing more.
            if first and not keep_going():
                result.finished = False
                break
            if not self._prune_chunk(policy, chunk, keep_going, result):
                result.finished = False
                break
        result.seconds = time.monotonic() - started
        return result

    # --- one slice of executions ---------------------------------------------------------------

    def _timed(self, result: PruneResult, work: Callable[[Connection], Any], what: str) -> Any:
        began = time.monotonic()
        try:
            return self.store.transaction(work, what)
        finally:
            result.longest_transaction_s = max(
                result.longest_transaction_s, time.monotonic() - began
            )

    def _prune_chunk(
        self,
        policy: PrunePolicy,
        chunk: Sequence[int],
        keep_going: Callable[[], bool],
        result: PruneResult,
    ) -> bool:
        provider = self.provider
        store = self.store
        recheck = store.prepared(
            ("prune-recheck", *self._key(policy)),
            lambda: provider.select_prunable_recheck(
                policy.statuses, policy.older_than_ms, BatchStatus.COMPLETED.value
            ),
        )
        steps_of = store.prepared("prune-steps", provider.select_steps_of)
        step_deletes = store.prepared(
            "prune-step-rows", lambda: [provider.bounded(d) for d in provider.delete_step_rows()]
        )
        job_deletes = store.prepared(
            "prune-job-rows", lambda: [provider.bounded(d) for d in provider.delete_job_rows()]
        )
        step_tables = (partitions.name, step_execution_context.name, step_execution.name)
        job_tables = (
            job_coordination.name,
            job_masters.name,
            job_execution_context.name,
            job_execution_params.name,
            job_execution.name,
        )

        instances_of = store.prepared("prune-instances", provider.select_instances_of)

        def still(conn: Connection) -> list[int]:
            return [int(r[0]) for r in conn.execute(recheck, {"ids": list(chunk)})]

        # Step executions first (with their partitions and contexts), a slice per transaction.
        # Their ids are read once (a read, no locks), then deleted by key: no slice scans
        # what the previous ones deleted.
        steps = self.store.transaction(
            lambda conn: [(int(r[0]), int(r[1])) for r in conn.execute(steps_of, {"ids": chunk})],
            "prune read steps",
        )
        for first in range(0, len(steps), policy.batch_size):
            if not keep_going():
                return False
            sliced = steps[first : first + policy.batch_size]

            def step_slice(conn: Connection, sliced: list[tuple[int, int]] = sliced) -> dict:
                alive = set(still(conn))
                ids = [step for step, job in sliced if job in alive]
                if not ids:
                    return {}
                return {
                    name: _run(conn, parts, {"ids": ids})
                    for name, parts in zip(step_tables, step_deletes, strict=True)
                }

            for name, n in self._timed(result, step_slice, "prune steps").items():
                result.counts[name] += n

        if not keep_going():
            return False

        empty = store.prepared(
            "prune-empty-instances", lambda: provider.bounded(provider.delete_empty_instances())
        )

        def job_slice(conn: Connection) -> tuple[dict[str, int], list[int]]:
            alive = still(conn)
            if not alive:
                return {}, []
            instances = [int(r[0]) for r in conn.execute(instances_of, {"ids": alive})]
            counts = {
                name: _run(conn, parts, {"ids": alive})
                for name, parts in zip(job_tables, job_deletes, strict=True)
            }
            # Their instances that have no execution left go in the same transaction: a
            # stopped prune leaves no empty instance that no later prune would find.
            if instances:
                counts[job_instance.name] = _run(conn, empty, {"ids": instances})
            return counts, alive

        try:
            counts, alive = self._timed(result, job_slice, "prune executions")
        except IntegrityError:
            # A row that references one of them came meanwhile (a step execution, a table this
            # version does not know, a launch's new execution of one of their instances): the
            # slice rolled back; they stay for the next prune.
            log.warning("prune: executions %s still referenced; left for the next prune", chunk)
            return True
        for name, n in counts.items():
            result.counts[name] += n
        result.executions.extend(alive)
        return True


def _run(conn: Connection, parts: Sequence[Any], params: dict[str, Any]) -> int:
    """A bounded statement (the provider's lock-then-write pair, or one statement) with its
    parameters; the row count of the last."""
    rowcount = 0
    for part in parts:
        rowcount = conn.execute(part, params).rowcount
    return max(0, int(rowcount))


class Pruner(Service):
    """Every ``prune_interval``, the node holding the ``prune`` lease prunes finished
    executions older than ``prune_after``; between its transactions it checks that the node
    still holds the lease (``usable_identity``: the lease service's ``acting(PRUNE)``), and
    stops there once it does not."""

    name = "prune"

    def __init__(
        self,
        store: CoordinationStore,
        settings: ClusterSettings,
        events: ClusterEvents,
        usable_identity: Callable[[], Identity | None],
    ) -> None:
        super().__init__(settings.prune_interval)
        if settings.prune_after is None:
            raise ConfigurationError("a Pruner needs prune_after")
        self.store = store
        self.settings = settings
        self.events = events
        #: The identity this node prunes under: its own while it holds the ``prune`` lease.
        self.usable_identity = usable_identity
        self.policy = PrunePolicy(
            older_than_ms=settings.prune_after,
            batch_size=min(500, store.provider.partition_write_batch),
        )
        self.pruning = Pruning(store)

    def run_once(self) -> None:
        identity = self.usable_identity()
        if identity is None:
            return

        def keep_going() -> bool:
            if self.stopped:
                return False
            if self.usable_identity() is not identity:
                log.info("prune: node %s no longer holds the lease; stopping", identity.node_id)
                return False
            # A transaction committed: a long prune is getting on (its lease stays renewed).
            self.progressed()
            return True

        result = self.pruning.prune(self.policy, keep_going)
        if result.total:
            log.info(
                "prune: %d execution(s), %d row(s) in %.1f s",
                len(result.executions),
                result.total,
                result.seconds,
            )
            self.events.pruned(identity.node_id, dict(result.counts), result.seconds)
