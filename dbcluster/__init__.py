"""dbcluster: partitioned batch jobs across worker processes coordinated only through SQL."""

from __future__ import annotations

__version__ = "0.2.0"
