"""Many finished job executions at once, for tests and for measuring the dashboard on a large
repository: one job instance each, names and statuses spread over a few values."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, case, func, insert, literal, select

from dbcluster.dialects import get_provider
from dbcluster.schema import job_execution, job_instance

#: Job names, given in turn.
DEFAULT_NAMES = ("nightly-ledger", "reconcile", "export", "reindex", "cleanup")


def insert_executions(
    engine: Engine,
    count: int,
    *,
    names: Sequence[str] = DEFAULT_NAMES,
    prefix: str = "bulk",
    batch: int = 5000,
) -> None:
    """Insert ``count`` job instances named round-robin from ``names`` (keys ``<prefix>-<i>``),
    and one execution each, ended at the database's now: COMPLETED, every tenth FAILED."""
    provider = get_provider(engine)
    with engine.begin() as conn:
        for lo in range(0, count, batch):
            conn.execute(
                insert(job_instance),
                [
                    {"version": 0, "job_name": names[i % len(names)], "job_key": f"{prefix}-{i}"}
                    for i in range(lo, min(count, lo + batch))
                ],
            )
        now = provider.now()
        failed = job_instance.c.job_instance_id % 10 == 0
        conn.execute(
            insert(job_execution).from_select(
                [
                    "version",
                    "job_instance_id",
                    "create_time",
                    "start_time",
                    "end_time",
                    "status",
                    "exit_code",
                    "exit_message",
                    "last_updated",
                ],
                select(
                    literal(1),
                    job_instance.c.job_instance_id,
                    now,
                    now,
                    now,
                    case((failed, literal("FAILED")), else_=literal("COMPLETED")),
                    case((failed, literal("FAILED")), else_=literal("COMPLETED")),
                    case((failed, literal("failed on purpose")), else_=literal("")),
                    now,
                )
                .where(job_instance.c.job_key.like(f"{prefix}-%"))
                .order_by(job_instance.c.job_instance_id),
            )
        )


def count_executions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(job_execution)).scalar_one())
