"""The schema dbcluster 0.1.0 released (``schemas/<db>.sql`` of the 0.1.0 tag).

A database that has the 0.1.0 tables and no ``batch_schema_version`` table is at this revision.
"""

from __future__ import annotations

from dbcluster.migrations.baseline import baseline
from dbcluster.migrations.ops import Operations

revision = "0001"
down_revision = None
release = "0.1.0"


def upgrade(op: Operations) -> None:
    """Create the 0.1.0 tables (``dbcluster init`` creates the current schema instead; this
    stands for databases 0.1.0 made, and for tests that need one)."""
    for statement in baseline(op.provider.name).statements:
        op.execute(statement)
