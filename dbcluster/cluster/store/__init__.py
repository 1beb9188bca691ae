"""The coordination store: runs the provider's coordination statements and judges their row
counts (SQL stays in the provider; whether a transition happened is judged here).

One :class:`CoordinationStore` per node, made of one part per family of rows, each on the same
:class:`~dbcluster.cluster.store.connector.Connector` (engines, retry, prepared statements):

- :mod:`.nodes`: the node registry (register, heartbeat, sweep, capacity, deregister);
- :mod:`.claims`: a worker's partitions (poll, claim, the fence of its transactions, its end);
- :mod:`.placing` and :mod:`.wakeups`: a master places partitions and wakes their nodes;
- :mod:`.recovery`: orphans, stalled partitions, stranded masters (takeover, abandon);
- :mod:`.coordination`: a job's coordination row and partition counts, and stopping it;
- :mod:`.leases`: the leases of the maintenance one node does for all; :mod:`.renewals`: a
  holder's heartbeat that renews them in its round trip;
- :mod:`.records`: what the store reads back, as records; :mod:`.verify`: reads that judge an
  unclear commit.

Methods that act for a master take its :class:`~dbcluster.batch.fence.Fence` and hold it first in
the same transaction, so a master that lost its mastership changes nothing.

Lock order (every dbcluster transaction takes rows in this order, so none deadlocks with another):
``batch_nodes`` -> ``batch_job_coordination`` -> ``batch_partitions`` -> the application's rows
-> ``batch_step_execution`` (and its context) -> ``batch_job_execution`` (and its context).
"""

from __future__ import annotations

from dbcluster.cluster.store.claims import Claims
from dbcluster.cluster.store.coordination import JobCoordination
from dbcluster.cluster.store.leases import LeaseRow
from dbcluster.cluster.store.nodes import NodeRegistry
from dbcluster.cluster.store.placing import Placing
from dbcluster.cluster.store.records import (
    ClaimedPartition,
    NodeInfo,
    NodeRemovedError,
    OrphanedPartition,
    PendingPartition,
    StalledPartition,
    StrandedJob,
)
from dbcluster.cluster.store.recovery import Recovery
from dbcluster.cluster.store.renewals import LeaseRenewals, RenewingBeat
from dbcluster.cluster.store.wakeups import offer_payload, offered_ids

__all__ = [
    "ClaimedPartition",
    "CoordinationStore",
    "LeaseRow",
    "NodeInfo",
    "NodeRemovedError",
    "OrphanedPartition",
    "PendingPartition",
    "RenewingBeat",
    "StalledPartition",
    "StrandedJob",
    "offer_payload",
    "offered_ids",
]


class CoordinationStore(NodeRegistry, Claims, Placing, Recovery, JobCoordination, LeaseRenewals):
    """The coordination statements of one node (or one command), on ``engine`` (transactions)
    and ``autocommit`` (single statements, where the database has an autocommit mode); see the
    package doc."""
