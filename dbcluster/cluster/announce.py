"""What a worker node tells its log and its events about the partitions it claims and ends:
one INFO line per claim (naming every partition it won) and per outcome (a group's members in
one line), one event per partition."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dbcluster.batch.step import failure_line
from dbcluster.cluster.fencing import RELEASED, RETRIED
from dbcluster.retry import brief
from dbcluster.states import PARTITION_COMPLETED

if TYPE_CHECKING:
    from dbcluster.cluster.events import ClusterEvents
    from dbcluster.cluster.store import ClaimedPartition, PendingPartition

log = logging.getLogger("dbcluster.node")


class Announcer:
    """Announces a node's claims and outcomes on ``events`` and in the ``dbcluster.node`` log."""

    def __init__(self, events: ClusterEvents) -> None:
        self.events = events

    def claimed(
        self, node_id: str, claimed: Sequence[ClaimedPartition], after: str | None = None
    ) -> None:
        """What a claim won (the final write of partition ``after``, when it was that): one
        line for all of them (a line per partition cost a grouped drain's worker more than any
        statement of the framework's), one event each."""
        if len(claimed) == 1:
            p = claimed[0].partition
            log.info(
                "node %s claimed partition %s (%s, attempt %d)%s",
                node_id,
                p.partition_name,
                p.step_execution_id,
                p.attempt,
                "" if after is None else f" as {after} ended",
            )
        elif claimed:
            log.info(
                "node %s claimed %d partitions: %s",
                node_id,
                len(claimed),
                ", ".join(
                    f"{w.partition.partition_name} ({w.partition.step_execution_id}, "
                    f"attempt {w.partition.attempt})"
                    for w in claimed
                ),
            )
        self.claimed_events(node_id, [won.partition for won in claimed])

    def claimed_events(self, node_id: str, partitions: Sequence[PendingPartition]) -> None:
        """One ``claimed`` event per partition: what a claim won, or a partition run before it
        was claimed (told before its run is submitted, so that no end of it is told first)."""
        for p in partitions:
            self.events.claimed(node_id, p.partition_name, p.step_execution_id, p.attempt)

    def took_placed(self, node_id: str, partitions: Sequence[PendingPartition]) -> None:
        """Partitions a wake-up carried with their executions, run before they were claimed
        (their first transaction claims them): one line (their events: claimed_events)."""
        log.info(
            "node %s runs %s as placed (claimed by its first transaction)",
            node_id,
            ", ".join(
                f"partition {p.partition_name} ({p.step_execution_id}, attempt {p.attempt})"
                for p in partitions
            ),
        )

    def group_completed(self, node_id: str, partitions: Sequence[PendingPartition]) -> None:
        """A group's partitions, recorded COMPLETED by its one transaction."""
        log.info(
            "node %s completed %d partitions in one transaction: %s",
            node_id,
            len(partitions),
            ", ".join(f"{p.partition_name} ({p.step_execution_id})" for p in partitions),
        )
        for p in partitions:
            self.events.completed(node_id, p.partition_name, p.step_execution_id)

    def recorded(
        self,
        node_id: str,
        p: PendingPartition,
        outcome: str | None,
        why: str | None = None,
        *,
        outage: BaseException | None = None,
    ) -> None:
        """A partition's outcome, recorded by its final write (None: it failed; ``why``: its
        step execution's exit description, of which a failure's line gives the cause;
        ``outage``: the database's passing trouble that failed it, which its node reports once
        per outage: a try that gets another then says so at INFO, not in a WARNING of its
        own)."""
        events = self.events
        if outcome == RELEASED:
            log.info("node %s handed back stopped partition %s", node_id, p.partition_name)
            events.released(node_id, p.partition_name, p.step_execution_id)
        elif outcome == RETRIED:
            if outage is not None:
                log.info(
                    "node %s: partition %s (%s) met a database outage on attempt %d of %d; it "
                    "will be tried again (%s)",
                    node_id,
                    p.partition_name,
                    p.step_execution_id,
                    p.attempt,
                    p.max_attempts,
                    brief(outage),
                )
            else:
                log.warning(
                    "node %s: partition %s (%s) failed on attempt %d of %d; it will be tried again",
                    node_id,
                    p.partition_name,
                    p.step_execution_id,
                    p.attempt,
                    p.max_attempts,
                )
            events.retried(node_id, p.partition_name, p.step_execution_id, p.attempt)
        elif outcome == PARTITION_COMPLETED:
            log.info(
                "node %s completed partition %s (%s)",
                node_id,
                p.partition_name,
                p.step_execution_id,
            )
            events.completed(node_id, p.partition_name, p.step_execution_id)
        else:
            log.warning(
                "node %s failed partition %s (%s): %s",
                node_id,
                p.partition_name,
                p.step_execution_id,
                cause(why),
            )
            events.failed(node_id, p.partition_name, p.step_execution_id)

    def lost(self, node_id: str, p: PendingPartition, reason: str) -> None:
        """A partition taken away while this node ran it (its fence was refused)."""
        log.warning(
            "node %s lost partition %s (%s) while running it: %s",
            node_id,
            p.partition_name,
            p.step_execution_id,
            reason,
        )
        self.events.lost(node_id, p.partition_name, p.step_execution_id, reason)


def cause(description: str | None) -> str:
    """Why a partition failed, from its step's exit description (:func:`failure_line`)."""
    return failure_line(description) or "no reason recorded"
