"""Batch and exit statuses."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar


class BatchStatus(Enum):
    """The lifecycle status of an execution, ordered from best to worst."""

    COMPLETED = "COMPLETED"
    STARTING = "STARTING"
    STARTED = "STARTED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"
    UNKNOWN = "UNKNOWN"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, BatchStatus):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, BatchStatus):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, BatchStatus):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, BatchStatus):
            return NotImplemented
        return self.rank >= other.rank

    @staticmethod
    def max(a: BatchStatus, b: BatchStatus) -> BatchStatus:
        """The worse of two statuses."""
        return a if a.rank >= b.rank else b

    def upgrade_to(self, other: BatchStatus) -> BatchStatus:
        """Spring's upgrade: past STARTED the worse wins; otherwise COMPLETED wins over running."""
        if self > BatchStatus.STARTED or other > BatchStatus.STARTED:
            return BatchStatus.max(self, other)
        if BatchStatus.COMPLETED in (self, other):
            return BatchStatus.COMPLETED
        return BatchStatus.max(self, other)

    @property
    def is_running(self) -> bool:
        return self in (BatchStatus.STARTING, BatchStatus.STARTED, BatchStatus.STOPPING)

    @property
    def is_unsuccessful(self) -> bool:
        return self >= BatchStatus.FAILED


_RANK = {status: index for index, status in enumerate(BatchStatus)}

_EXIT_SEVERITY = {
    "EXECUTING": 1,
    "COMPLETED": 2,
    "NOOP": 3,
    "STOPPED": 4,
    "FAILED": 5,
    "UNKNOWN": 6,
}


@dataclass(frozen=True)
class ExitStatus:
    """How an execution ended: a code (standard or user-defined) and a free-text description."""

    code: str
    description: str = ""

    UNKNOWN: ClassVar[ExitStatus]
    EXECUTING: ClassVar[ExitStatus]
    COMPLETED: ClassVar[ExitStatus]
    NOOP: ClassVar[ExitStatus]
    FAILED: ClassVar[ExitStatus]
    STOPPED: ClassVar[ExitStatus]

    @property
    def severity(self) -> int:
        return _EXIT_SEVERITY.get(self.code, 7)

    def and_(self, other: ExitStatus) -> ExitStatus:
        """The more severe code of the two; descriptions are joined."""
        code = self.code if self.severity >= other.severity else other.code
        parts = [d for d in (self.description, other.description) if d]
        return ExitStatus(code, "; ".join(parts))

    def with_description(self, description: str) -> ExitStatus:
        return ExitStatus(self.code, description)

    @classmethod
    def from_batch_status(cls, status: BatchStatus) -> ExitStatus:
        if status is BatchStatus.COMPLETED:
            return EXIT_COMPLETED
        if status is BatchStatus.STOPPED:
            return EXIT_STOPPED
        if status.is_running:
            return EXIT_EXECUTING
        if status is BatchStatus.FAILED:
            return EXIT_FAILED
        return EXIT_UNKNOWN


EXIT_UNKNOWN = ExitStatus("UNKNOWN")
EXIT_EXECUTING = ExitStatus("EXECUTING")
EXIT_COMPLETED = ExitStatus("COMPLETED")
EXIT_NOOP = ExitStatus("NOOP")
EXIT_FAILED = ExitStatus("FAILED")
EXIT_STOPPED = ExitStatus("STOPPED")
#: Failed for a cluster reason, not the job's own: its master was lost and a survivor abandoned
#: it, or a partition was lost with its node (or no node was left to run it). Jobs with an
#: auto-restart policy are restarted after these.
EXIT_ABANDONED = "ABANDONED"
EXIT_NODE_LOST = "NODE_LOST"
CLUSTER_EXIT_CODES = (EXIT_ABANDONED, EXIT_NODE_LOST)

ExitStatus.UNKNOWN = EXIT_UNKNOWN
ExitStatus.EXECUTING = EXIT_EXECUTING
ExitStatus.COMPLETED = EXIT_COMPLETED
ExitStatus.NOOP = EXIT_NOOP
ExitStatus.FAILED = EXIT_FAILED
ExitStatus.STOPPED = EXIT_STOPPED
