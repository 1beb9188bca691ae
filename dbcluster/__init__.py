"""dbcluster: partitioned batch jobs across worker processes coordinated only through SQL.

The names a first job needs are here (imported on first use, so ``import dbcluster`` stays
cheap); the batch model is :mod:`dbcluster.batch`, the cluster :mod:`dbcluster.cluster`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from dbcluster.batch import ChunkContext, JobRegistry, Resource, partitioned_job
    from dbcluster.cluster import Cluster

_EXPORTS = {
    "ChunkContext": "dbcluster.batch",
    "Cluster": "dbcluster.cluster",
    "JobRegistry": "dbcluster.batch",
    "Resource": "dbcluster.batch",
    "partitioned_job": "dbcluster.batch",
}

__all__ = ["ChunkContext", "Cluster", "JobRegistry", "Resource", "partitioned_job"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dbcluster' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
