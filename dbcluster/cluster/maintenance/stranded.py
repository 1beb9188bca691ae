"""Stranded masters: a survivor recovers a job whose master node is gone from the registry.

The scan runs on one node of each application: the holder of its ``stranded`` lease (see
:mod:`.leases`; a node that takes no jobs over, such as a ``launch`` process, scans on its own
and, under ``takeover``, only abandons what nobody took over after a grace).

Exactly one survivor wins the guarded claim of the coordination row (RECOVERING, owned by the
winner under the next epoch, so the lost master's own writes change nothing from then on; the
claim is recorded in the job's master history). Then:

- ``takeover`` (the default, when the job is in this node's registry and its execution still
  runs): the winner becomes the job's master under that epoch and finishes it in the same
  execution (:class:`Takeover`, done by the cluster).
- ``abandon`` (or when it cannot take over): the winner fails the job in one transaction (its
  in-flight partitions, its running step executions, the execution) and closes the row
  ABANDONED, so the job can be restarted.

Recovery is idempotent: if the winner dies part-way the row is RECOVERING under a master that is
gone, so another survivor claims it and starts over; if the winner lives but failed part-way, it
finishes on its next scan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from dbcluster import points
from dbcluster.batch.repository import JobRepository
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore, StrandedJob
from dbcluster.states import COORD_ABANDONED, MASTER_ABANDON, MASTER_TAKEOVER

log = logging.getLogger("dbcluster.recovery")


class Takeover(Protocol):
    """How a node runs a job it took over (the cluster provides it)."""

    def can_take_over(self, job_execution_id: int) -> bool:
        """Whether this node can be the execution's master (it knows the job, and the
        execution still runs)."""
        ...

    def take_over(self, job: StrandedJob, identity: Identity, lost_master: str) -> None:
        """Start running the job as its master under ``job.master_epoch`` (claimed RECOVERING
        by ``identity``); returns at once. Done once the coordination row is STARTED."""
        ...

    def taking_over(self, job_execution_id: int) -> bool:
        """Whether a takeover of the execution is under way on this node."""
        ...


class StrandedMasters(Service):
    name = "stranded"

    def __init__(
        self,
        store: CoordinationStore,
        repository: JobRepository,
        settings: ClusterSettings,
        events: ClusterEvents,
        usable_identity: Callable[[], Identity | None],
        takeover: Takeover | None = None,
        leased_identity: Callable[[], Identity | None] | None = None,
        step_down: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(settings.stranded_master_scan_interval)
        self.store = store
        self.repository = repository
        self.settings = settings
        self.events = events
        self.usable_identity = usable_identity
        self.takeover = takeover
        #: The identity this node scans for stranded jobs under (while it holds the lease of
        #: its application's scan, see :mod:`.leases`); None: it scans under its own, unleased
        #: (a node that takes no jobs over, such as a ``launch`` process).
        self.leased_identity = leased_identity
        #: Gives that lease up for a while (a job this node must leave to another is stranded).
        self.step_down = step_down
        #: The ids under which this node claimed a recovery (only those can own one unfinished).
        self._claimed_under: set[str] = set()
        #: When this node first saw each stranded job it could not take over (monotonic).
        self._seen: dict[int, float] = {}

    def run_once(self) -> None:
        self.recover()

    def _takes_over(self, job_execution_id: int) -> bool:
        return (
            self.settings.master_failover == "takeover"
            and self.takeover is not None
            and self.takeover.can_take_over(job_execution_id)
        )

    def recover(self) -> list[int]:
        """Recover every stranded job this node can; the job execution ids it recovered."""
        recovered: list[int] = []
        identity = self.usable_identity()
        if identity is None:
            return recovered
        me = identity.node_id
        # A recovery this node claimed and could not finish (a transient error part-way) is its
        # own to finish: it is alive, so no survivor will pick the row up.
        mine = self.store.unfinished_recoveries(me) if me in self._claimed_under else []
        for job in mine:
            if identity.is_fenced:
                return recovered
            if self._under_way(job.job_execution_id):
                continue
            if self._recover(identity, job, "(lost before this recovery resumed)"):
                recovered.append(job.job_execution_id)
        if self.leased_identity is not None and self.leased_identity() is not identity:
            return recovered  # another node scans for all
        points.reach("maintenance.leased", service=self.name, node_id=me)
        stranded = self.store.stranded_jobs()
        self._seen = {
            j: t for j, t in self._seen.items() if j in {s.job_execution_id for s in stranded}
        }
        for job in stranded:
            if identity.is_fenced:
                break
            if self._under_way(job.job_execution_id):
                # A takeover of this job by an earlier identity of this node has not ended yet:
                # claiming the row now would leave it owned by a live node that runs nothing
                # (take_over ignores a job it is already taking over). Other nodes may claim it:
                # this one, holding the scan's lease, gives it up so that another scans.
                if self.leased_identity is not None and self.step_down is not None:
                    self.step_down()
                continue
            taking = self._takes_over(job.job_execution_id)
            if not taking and not self._may_abandon(job.job_execution_id):
                continue
            reason = MASTER_TAKEOVER if taking else MASTER_ABANDON
            self._claimed_under.add(me)
            won = self.store.claim_stranded(job, me, reason)
            if won is None:
                continue
            if self._recover(identity, won, job.master_node):
                recovered.append(job.job_execution_id)
        return recovered

    def _under_way(self, job_execution_id: int) -> bool:
        """Whether this node is still taking the job over (under this identity or an earlier)."""
        return self.takeover is not None and self.takeover.taking_over(job_execution_id)

    def _may_abandon(self, job_execution_id: int) -> bool:
        """Under ``takeover``, a node that cannot run a stranded job itself (it does not know the
        job, or takes no jobs over) leaves it to the nodes that can for three scans, and at
        least one ``cleanup_threshold``, before it abandons it: long enough for a node that can
        to come back (restarted, or thawed and rejoined) when the fault that took the master
        took them too, since abandoning turns a job that could finish into a restart."""
        if self.settings.master_failover != "takeover":
            return True
        first = self._seen.setdefault(job_execution_id, time.monotonic())
        s = self.settings
        grace_ms = max(3 * s.stranded_master_scan_interval, s.cleanup_threshold)
        return (time.monotonic() - first) * 1000 >= grace_ms

    def _recover(self, identity: Identity, job: StrandedJob, lost: str) -> bool:
        if self._takes_over(job.job_execution_id):
            assert self.takeover is not None
            log.warning(
                "node %s takes over job execution %s (master %s lost), epoch %d",
                identity.node_id,
                job.job_execution_id,
                lost,
                job.master_epoch,
            )
            self.takeover.take_over(job, identity, lost)
            return True
        return self._abandon_logged(identity, job, lost)

    def _abandon_logged(self, identity: Identity, job: StrandedJob, lost: str) -> bool:
        try:
            return self._abandon(identity, job, lost)
        except Exception as exc:  # noqa: BLE001 - the row stays RECOVERING; the next scan resumes
            log.warning(
                "recovery of job execution %s failed part-way: %s", job.job_execution_id, exc
            )
            return False

    def _abandon(self, identity: Identity, job: StrandedJob, lost: str) -> bool:
        me = identity.node_id
        message = f"master node {lost} was lost; job abandoned by node {me}"
        closed = self.store.abandon(job, message, self.repository)
        if closed is None:
            log.warning("node %s lost the recovery of job execution %s", me, job.job_execution_id)
            return False
        if closed != COORD_ABANDONED:
            log.info(
                "job execution %s had ended before its master %s was lost; coordination closed %s",
                job.job_execution_id,
                lost,
                closed,
            )
            return False
        log.warning(
            "node %s abandoned job execution %s (master %s lost)", me, job.job_execution_id, lost
        )
        self.events.abandoned(me, job.job_execution_id, lost)
        return True
