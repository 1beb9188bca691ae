"""Leases (``batch_leases``): a maintenance task that one node at a time runs (sweeps, the
stranded-master scan, pruning, schedule firing) is run by the holder of its lease, renewed by
the database clock; a holder silent past its term loses it to the next taker.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Delete, Insert, Select, Update, delete, insert, or_, select, update

from dbcluster import schema
from dbcluster.dialects.family import StatementFamily


class LeaseStatements(StatementFamily):
    """The leases' statements."""

    def take_lease(self, name: str, holder: str, term_ms: int) -> Update:
        """Take or renew the lease ``name``: it changes the row when ``holder`` holds it, or its
        holder has not renewed it for ``term_ms`` (exactly one contender wins: the row is
        locked by the first UPDATE and the second sees it renewed)."""
        leases = schema.leases
        return (
            update(leases)
            .where(
                leases.c.lease_name == name,
                or_(leases.c.holder == holder, self.older_than(leases.c.renewed_at, term_ms)),
            )
            .values(holder=holder, renewed_at=self.now())
        )

    def select_lease(self, name: str) -> Select[Any]:
        leases = schema.leases
        return select(leases.c.holder, leases.c.renewed_at).where(leases.c.lease_name == name)

    def insert_lease(self, name: str, holder: str) -> Insert:
        """The lease's first row (a duplicate-key error when another node inserted it first)."""
        return insert(schema.leases).values(lease_name=name, holder=holder, renewed_at=self.now())

    def release_lease(self, name: str, holder: str) -> Delete:
        """Give the lease up (its row goes; the next taker inserts it again)."""
        leases = schema.leases
        return delete(leases).where(leases.c.lease_name == name, leases.c.holder == holder)
