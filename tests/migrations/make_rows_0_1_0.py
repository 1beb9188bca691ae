"""Regenerate ``rows_0_1_0.json``: rows written by dbcluster 0.1.0 itself.

Run with the 0.1.0 sources first on the path (any venv with dbcluster's dependencies)::

    mkdir /tmp/dbc010 && git archive b45d7ef dbcluster | tar -x -C /tmp/dbc010
    PYTHONPATH=/tmp/dbc010 python tests/migrations/make_rows_0_1_0.py \\
        sqlite:////tmp/dbc010.db tests/migrations/rows_0_1_0.json

It creates the 0.1.0 schema, runs the test application's job "ledger" over 300 items in three
partitions twice: once to COMPLETED, once FAILED in partition r-000100-000200, and dumps every
dbcluster and ledger row as JSON (timestamps in ISO format).
"""

from __future__ import annotations

import datetime
import json
import sys

from sqlalchemy import create_engine, select

from dbcluster import schema
from dbcluster.cluster.app import Cluster
from dbcluster.testing.app import FAST_SETTINGS, build_registry, ledger_metadata


def main(url: str, out_path: str) -> None:
    engine = create_engine(url)
    schema.metadata.create_all(engine)
    ledger_metadata.create_all(engine)
    registry = build_registry(per_node=3, items=300)
    with Cluster(url, registry, FAST_SETTINGS) as cluster:
        ok = cluster.launch("ledger", {"run": "ok"})
        bad = cluster.launch("ledger", {"run": "bad", "fail": "r-000100-000200"})
    print(ok.status, bad.status, file=sys.stderr)
    out: dict[str, list[dict[str, object]]] = {}
    with engine.connect() as conn:
        for table in [*schema.metadata.sorted_tables, *ledger_metadata.sorted_tables]:
            out[table.name] = [
                {
                    k: v.isoformat() if isinstance(v, datetime.datetime) else v
                    for k, v in row.items()
                }
                for row in conn.execute(select(table)).mappings()
            ]
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
