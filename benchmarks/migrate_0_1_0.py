"""How long ``dbcluster migrate`` takes on a large 0.1.0 repository.

    python benchmarks/migrate_0_1_0.py URL [PARTITIONS]

Creates the 0.1.0 schema in the database at URL (dropping dbcluster's tables first: use a
scratch database), fills it with one finished job of PARTITIONS partitions (default 100,000: a
step execution, its context and its partition row each), then times the upgrade to the current
schema and checks the rows survived.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime

from sqlalchemy import MetaData, func, select

from dbcluster import migrations
from dbcluster.dialects import get_provider, make_engine
from dbcluster.migrations.ops import Operations
from dbcluster.testing.backends import drop_tables


def fill(engine: object, partitions: int) -> None:
    meta = MetaData()
    meta.reflect(engine)  # type: ignore[arg-type]
    t = meta.tables
    now = datetime(2026, 1, 1)
    with engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(
            t["batch_job_instance"].insert(),
            {"job_instance_id": 1, "version": 0, "job_name": "big", "job_key": "k"},
        )
        conn.execute(
            t["batch_job_execution"].insert(),
            {
                "job_execution_id": 1,
                "version": 0,
                "job_instance_id": 1,
                "create_time": now,
                "status": "COMPLETED",
            },
        )
        step = {
            "version": 0,
            "job_execution_id": 1,
            "create_time": now,
            "status": "COMPLETED",
            **{
                c: 0
                for c in (
                    "commit_count",
                    "read_count",
                    "filter_count",
                    "write_count",
                    "read_skip_count",
                    "write_skip_count",
                    "process_skip_count",
                    "rollback_count",
                )
            },
        }
        for lo in range(1, partitions + 2, 5000):
            ids = range(lo, min(lo + 5000, partitions + 2))
            conn.execute(
                t["batch_step_execution"].insert(),
                [{**step, "step_execution_id": i, "step_name": f"w:p{i}"} for i in ids],
            )
            conn.execute(
                t["batch_step_execution_context"].insert(),
                [{"step_execution_id": i, "short_context": '{"lo": 0}'} for i in ids],
            )
            conn.execute(
                t["batch_partitions"].insert(),
                [
                    {
                        "step_execution_id": i,
                        "job_execution_id": 1,
                        "master_step_execution_id": 1,
                        "partition_name": f"p{i}",
                        "assigned_node": "n1",
                        "attempt": 1,
                        "status": "COMPLETED",
                        "transferable": True,
                        "created_time": now,
                        "last_updated": now,
                    }
                    for i in ids
                    if i > 1
                ],
            )


def main(url: str, partitions: int) -> None:
    engine = make_engine(url)
    drop_tables(engine)
    with engine.begin() as conn:
        migrations.revisions()[0].upgrade(Operations(get_provider(engine), conn))
    started = time.perf_counter()
    fill(engine, partitions)
    filled = time.perf_counter() - started
    started = time.perf_counter()
    applied = migrations.upgrade(engine)
    took = time.perf_counter() - started
    migrations.require_current_schema(engine)
    from dbcluster.schema import partitions as part_table

    with engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(part_table)).scalar()
        epochs = conn.execute(select(func.min(part_table.c.max_attempts))).scalar()
    print(
        f"{get_provider(engine).name}: {partitions} partitions filled in {filled:.1f}s; "
        f"migrate {[r.revision for r in applied]} took {took:.1f}s; {count} partitions after, "
        f"max_attempts >= {epochs}"
    )
    drop_tables(engine)
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100_000)
