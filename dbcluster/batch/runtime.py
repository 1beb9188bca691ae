"""What a running step needs from its surroundings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dbcluster.batch.partition import PartitionHandler
    from dbcluster.batch.registry import JobRegistry
    from dbcluster.batch.repository import JobRepository


@dataclass
class BatchRuntime:
    """The repository, the default partition handler and (optionally) the registry of a run."""

    repository: JobRepository
    partition_handler: PartitionHandler
    registry: JobRegistry | None = None
