"""A claim looks up the partitions it locked by key, whatever the planner believes of PENDING.

The one-statement claim (PostgreSQL) locks the polled partitions that are still PENDING, then
updates them. The update used to repeat ``status = 'PENDING'``; with statistics from before a
placement (a new table, or one whose last ANALYZE saw no PENDING row: the normal state of a
long-lived repository between jobs) the planner took the status index for the cheaper path and
scanned every PENDING partition of the job for each claim, so a 2,000-partition job cost each
claim a scan of up to 2,000 index entries (0.34 -> 0.14 ms a claim measured here). This test
builds exactly those statistics and reads the claim's plan.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, text

from dbcluster.schema import partitions
from dbcluster.testing.backends import Backend
from dbcluster.testing.suite.provider_helpers import _place, _register, _store

PENDING_ROWS = 400


def _scans_of(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    found = []
    if plan.get("Relation Name") == table and "Scan" in plan.get("Node Type", ""):
        found.append(plan)
    for child in plan.get("Plans", []):
        found.extend(_scans_of(child, table))
    return found


@pytest.mark.backends("postgresql")
def test_a_claim_reads_only_the_partitions_it_locked(backend: Backend) -> None:
    engine, provider = backend.engine, backend.provider
    store = _store(engine, provider)
    assert provider.claim_and_start(1, [1], None, 0) is not None
    _register(engine, provider, "plan-me")
    _, ids = _place(engine, provider, "plan-me", count=PENDING_ROWS)
    # Statistics that say "nothing is PENDING", then every partition PENDING again.
    with engine.begin() as conn:
        conn.execute(partitions.update().values(status="COMPLETED"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE batch_partitions"))
    with engine.begin() as conn:
        conn.execute(partitions.update().values(status="PENDING"))

    plans: list[dict[str, Any]] = []

    def explain(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "dbc_touched" in statement and not plans:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
            found = cursor.fetchone()[0]
            plans.append((json.loads(found) if isinstance(found, str) else found)[0]["Plan"])

    # EXPLAIN ANALYZE runs the claim (it commits: the claim's engine is autocommit); the claim
    # that follows it then finds the partition taken and wins nothing, which is not under test.
    event.listen(store.autocommit, "before_cursor_execute", explain)
    try:
        store.claim("plan-me", 0, ids[:1], datetime.now(UTC).replace(tzinfo=None))
    finally:
        event.remove(store.autocommit, "before_cursor_execute", explain)
    assert plans, "the claim did not run as one statement"
    scans = _scans_of(plans[0], "batch_partitions")
    assert scans
    for scan in scans:
        looked_at = scan["Actual Rows"] * scan["Actual Loops"] + scan.get(
            "Rows Removed by Filter", 0
        )
        assert looked_at <= 2, (
            f"the claim of one partition read {looked_at} of {PENDING_ROWS} PENDING rows "
            f"through {scan.get('Index Name', scan['Node Type'])}"
        )
