"""Accepting launches: a node started with ``accept_launches`` claims PENDING launch requests
(``dbcluster submit``, schedule ticks) for the jobs of its registry and becomes their master.

Each turn, when the node runs fewer launched masters than its limit, it claims requests (one
guarded transaction; exactly one node wins each) and hands each to the cluster, which launches it
on a thread of its own (the acceptor never waits for a job). The requests of claimers gone from
the registry are put back to PENDING by the holder of the sweep lease, after its sweep
(:mod:`.sweeper`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.launches import LaunchRequest, LaunchStore
from dbcluster.cluster.service import Service
from dbcluster.cluster.settings import ClusterSettings

log = logging.getLogger("dbcluster.launches")

#: Requests one turn claims at most (more wait for the next turn, which comes at once).
CLAIM_BATCH = 4


class Launcher(Protocol):
    """How a node launches a claimed request (the cluster provides it)."""

    def accepted_jobs(self) -> list[str]:
        """Names of the jobs this node launches."""
        ...

    def launches_running(self) -> int:
        """How many claimed requests this node is launching or mastering now."""
        ...

    def launch_request(self, request: LaunchRequest, identity: Identity) -> None:
        """Start launching ``request`` (claimed under ``identity``) as its master, on a thread
        of its own; returns at once."""
        ...


class LaunchAcceptor(Service):
    name = "launches"

    def __init__(
        self,
        launches: LaunchStore,
        settings: ClusterSettings,
        events: ClusterEvents,
        usable_identity: Callable[[], Identity | None],
        launcher: Launcher,
        max_running: int,
    ) -> None:
        super().__init__(settings.task_polling_interval)
        self.launches = launches
        self.events = events
        self.usable_identity = usable_identity
        self.launcher = launcher
        self.max_running = max_running

    def run_once(self) -> None:
        identity = self.usable_identity()
        if identity is None:
            return
        free = self.max_running - self.launcher.launches_running()
        if free <= 0:
            return
        limit = min(free, CLAIM_BATCH)
        claimed = self.launches.claim(identity.node_id, self.launcher.accepted_jobs(), limit)
        for request in claimed:
            if identity.is_fenced:
                return  # the claim goes back to PENDING once this id is removed
            log.info(
                "node %s claimed launch request %d (job %s)",
                identity.node_id,
                request.request_id,
                request.job_name,
            )
            self.events.launch_claimed(identity.node_id, request.request_id, request.job_name)
            self.launcher.launch_request(request, identity)
        if len(claimed) == limit:
            self.wake()
