"""Leases (``batch_leases``): who runs the maintenance that one node does for all (see
:mod:`dbcluster.cluster.maintenance.leases`). Each call is one statement, committed on its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam
from sqlalchemy.exc import IntegrityError

from dbcluster.cluster.store.connector import Connector


@dataclass(frozen=True)
class LeaseRow:
    """A lease as one read saw it: its holder, and whether it had lapsed (database clock)."""

    name: str
    holder: str
    lapsed: bool


class LeaseRows(Connector):
    """``batch_leases``: read them all, renew one, take a lapsed one, give one up."""

    def leases(self, term_ms: int) -> dict[str, LeaseRow]:
        """Every lease, by name (one read)."""
        stmt = self.prepared(("leases", term_ms), lambda: self.provider.select_leases(term_ms))
        return {
            str(r[0]): LeaseRow(str(r[0]), str(r[1]), bool(r[2])) for r in self.rows(stmt, "leases")
        }

    def renew_leases(self, names: list[str], holder: str, term_ms: int) -> int:
        """Renew the leases ``names`` that ``holder`` holds, not lapsed (one statement); how
        many it renewed."""
        return self.write_one(
            ("renew leases", term_ms),
            lambda: self.provider.renew_leases(
                bindparam("b_names", expanding=True), bindparam("b_holder"), term_ms
            ),
            {"b_names": list(names), "b_holder": holder},
            "renew leases",
        )

    def still_held(self, names: Sequence[str], holder: str, term_ms: int) -> list[str]:
        """Those of ``names`` that ``holder`` holds and that have not lapsed, as a read finds
        them now (which of a renewal's leases landed, when its row count says one did not)."""
        rows = self.leases(term_ms)
        return [n for n in names if (r := rows.get(n)) and r.holder == holder and not r.lapsed]

    def take_lease(self, name: str, holder: str, term_ms: int, *, exists: bool = True) -> bool:
        """Take the lease when it has lapsed (``exists``), or insert its first row (only one
        node's insert wins); True when ``holder`` holds it now. Harmless to repeat: a repeat of
        a take that landed finds it held (by this node, which then renews it or learns it lost
        it)."""
        if exists:
            changed = self.write_one(
                ("take lease", term_ms),
                lambda: self.provider.take_lapsed_lease(
                    bindparam("b_name"), bindparam("b_holder"), term_ms
                ),
                {"b_name": name, "b_holder": holder},
                "take lease",
            )
            return changed == 1
        insert = self.prepared(
            "insert lease",
            lambda: self.provider.insert_lease(bindparam("b_name"), bindparam("b_holder")),
        )
        try:
            self.transaction(
                lambda conn: conn.execute(insert, {"b_name": name, "b_holder": holder}),
                "insert lease",
            )
        except IntegrityError:
            return False
        return True

    def release_lease(self, name: str, holder: str) -> bool:
        """Give the lease up (a graceful stop): the next node takes it at its next look."""
        changed = self.write_one(
            "release lease",
            lambda: self.provider.release_lease(bindparam("b_name"), bindparam("b_holder")),
            {"b_name": name, "b_holder": holder},
            "release lease",
        )
        return changed == 1
