"""A lease holder's heartbeat that renews its leases in the same round trip (see
:mod:`dbcluster.cluster.maintenance.leases`): the heartbeat, the renewal (under the fence of
``renew_leases``) and what else the heartbeat carries (the idle poll, the leases' read) as one
statement where the database can write in a read (PostgreSQL), else the heartbeat and the
renewal as one UPDATE of two joined tables, alone or behind the read in one request (MySQL and
MariaDB through PyMySQL). Elsewhere the lease service renews on its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam

from dbcluster.cluster.store.claims import polled_and_leases
from dbcluster.cluster.store.leases import LeaseRow, LeaseRows


@dataclass(frozen=True)
class RenewingBeat:
    """What a heartbeat that renewed the node's leases found."""

    #: The node's row was there (else the node was removed and must fence; it renewed nothing).
    alive: bool
    #: The leases it renewed (the others did not land: lapsed, or another node's now).
    renewed: list[str]
    #: What the carried poll found (step and job execution ids, oldest first).
    found: list[tuple[int, int]]
    #: The leases as the carried read found them (None: none was carried).
    leases: dict[str, LeaseRow] | None


def _binds(count: int) -> list[Any]:
    """One bound parameter per lease name (plain text a driver can send beside a read, where an
    expanding list could not be)."""
    return [bindparam(f"b_lease_{i}") for i in range(count)]


class LeaseRenewals(LeaseRows):
    """The holder's heartbeat that renews its leases."""

    def beat_renewing(
        self,
        node_id: str,
        load: int,
        names: Sequence[str],
        term_ms: int,
        *,
        limit: int | None = None,
        read_leases: bool = False,
        steal_after_ms: int | None = None,
        unreachable_ms: int = 0,
    ) -> RenewingBeat | None:
        """The node's heartbeat and its renewal of the leases ``names`` (those it holds and
        that have not lapsed, judged as ``renew_leases`` judges), with the idle poll for
        ``limit`` partitions (none when None) and, with ``read_leases``, every lease, in one
        round trip, where the database can. None where it cannot (nothing was sent: the caller
        sends them itself)."""
        provider = self.provider
        engine = self.autocommit
        beat = self.prepared(
            ("bounded", "heartbeat"),
            lambda: provider.bounded(provider.heartbeat(bindparam("b_node"), bindparam("b_load"))),
        )
        if engine is None or len(beat) != 1 or not names:
            return None
        count = len(names)
        params: dict[str, Any] = {"b_node": node_id, "b_load": load}
        params.update((f"b_lease_{i}", name) for i, name in enumerate(names))
        key = (count, term_ms, limit, read_leases, steal_after_ms, unreachable_ms)

        def read() -> Any:
            node = bindparam("b_node")
            if read_leases:
                return provider.poll_and_leases(
                    node, limit, steal_after_ms, unreachable_ms, term_ms
                )
            if limit is not None:
                return provider.select_claimable(node, limit, steal_after_ms, unreachable_ms)
            return None

        stmt = self.prepared(
            ("beat renewing", *key),
            lambda: provider.heartbeat_renewing_and_read(
                bindparam("b_node"), bindparam("b_load"), _binds(count), term_ms, read()
            ),
        )
        if stmt is not None:
            rows = self.rows(stmt, "heartbeat renewing leases", params)
            alive = bool(rows) and int(rows[0][0]) == 1
            renewed = [str(n) for n in (rows[0][1] or ())] if alive else []
            found, leases = self._read([r[2:] for r in rows], limit, read_leases)
            return RenewingBeat(alive, renewed, found, leases)
        # Else the heartbeat and the renewal as one UPDATE (behind the read, in one request).
        writing = ("heartbeat renewing", count, term_ms)

        def build() -> Any:
            return provider.heartbeat_renewing(
                bindparam("b_node"), bindparam("b_load"), _binds(count), term_ms
            )

        # Under the key write_one uses (built once, here).
        write = self.prepared(
            ("bounded", writing), lambda: None if (b := build()) is None else provider.bounded(b)
        )
        if write is None or len(write) != 1:
            return None
        rows: Sequence[Any] = ()
        if read_leases or limit is not None:
            pair = self.paired(("read then beat renewing", *key), read, write[0])
            if pair is None:
                return None
            rows, changed = self.run_pair(pair, params, "heartbeat renewing leases")
        else:
            changed = self.write_one(writing, build, params, "heartbeat renewing leases")
        # The node's row (1, or 0 when it was removed) and each lease row it renewed.
        alive = changed >= 1
        if not alive:
            renewed = []
        elif changed - 1 == count:
            renewed = list(names)
        else:
            renewed = self.still_held(names, node_id, term_ms)
        found, leases = self._read(rows, limit, read_leases)
        return RenewingBeat(alive, renewed, found, leases)

    @staticmethod
    def _read(
        rows: Sequence[Any], limit: int | None, read_leases: bool
    ) -> tuple[list[tuple[int, int]], dict[str, LeaseRow] | None]:
        """The carried read's rows: what the poll found, and the leases (None: not read)."""
        if read_leases:
            return polled_and_leases(rows)
        if limit is None:
            return [], None
        return sorted((int(r[0]), int(r[1])) for r in rows if r[0] is not None), None
