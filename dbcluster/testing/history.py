"""Job history written straight into the repository tables (tests and benchmarks of pruning).

:func:`add_execution` writes one job execution as a partitioned run leaves it: its instance (made
or reused), parameters, context, a master step execution and one step execution per partition
with their contexts, partition rows, a coordination row and its master history. Rows go in with
``executemany`` (a few round trips per execution, whatever its partition count). Times are naive
UTC from this process's clock, ``ended_ago`` before now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, insert, select

from dbcluster.schema import (
    job_coordination,
    job_execution,
    job_execution_context,
    job_execution_params,
    job_instance,
    job_masters,
    partitions,
    step_execution,
    step_execution_context,
)


@dataclass(frozen=True)
class Written:
    instance_id: int
    execution_id: int
    step_ids: tuple[int, ...]


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def add_execution(
    engine: Engine,
    job_name: str,
    key: str,
    *,
    status: str = "COMPLETED",
    ended_ago: timedelta | None = timedelta(days=40),
    partitions_count: int = 2,
    coordination: str | None = "COMPLETED",
    partition_status: str = "COMPLETED",
) -> Written:
    """One execution of ``job_name``'s instance ``key`` (made if new). ``ended_ago`` None: no
    end time (a running execution). ``coordination`` None: no coordination row."""
    now = _utcnow()
    ended = None if ended_ago is None else now - ended_ago
    started = (ended or now) - timedelta(minutes=5)
    with engine.begin() as conn:
        instance_id = conn.execute(
            select(job_instance.c.job_instance_id).where(
                job_instance.c.job_name == job_name, job_instance.c.job_key == key
            )
        ).scalar()
        if instance_id is None:
            instance_id = conn.execute(
                insert(job_instance).values(version=0, job_name=job_name, job_key=key)
            ).inserted_primary_key[0]
        execution_id = conn.execute(
            insert(job_execution).values(
                version=1,
                job_instance_id=instance_id,
                create_time=started,
                start_time=started,
                end_time=ended,
                status=status,
                exit_code=status,
                exit_message="",
                last_updated=ended or now,
            )
        ).inserted_primary_key[0]
        conn.execute(
            insert(job_execution_params),
            [
                {
                    "job_execution_id": execution_id,
                    "parameter_name": name,
                    "parameter_type": "str",
                    "parameter_value": value,
                    "identifying": True,
                }
                for name, value in (("key", key), ("region", "eu"))
            ],
        )
        conn.execute(
            insert(job_execution_context).values(
                job_execution_id=execution_id, short_context="{}", serialized_context=None
            )
        )
        names = ["master", *(f"work:p{i}" for i in range(partitions_count))]
        conn.execute(
            insert(step_execution),
            [
                {
                    "version": 1,
                    "step_name": name,
                    "job_execution_id": execution_id,
                    "create_time": started,
                    "start_time": started,
                    "end_time": ended,
                    "status": status if name == "master" else partition_status,
                    "last_updated": ended or now,
                }
                for name in names
            ],
        )
        ids = dict(
            conn.execute(
                select(step_execution.c.step_name, step_execution.c.step_execution_id).where(
                    step_execution.c.job_execution_id == execution_id
                )
            ).all()
        )
        step_ids = tuple(int(ids[name]) for name in names)
        conn.execute(
            insert(step_execution_context),
            [{"step_execution_id": i, "short_context": "{}"} for i in step_ids],
        )
        if partitions_count:
            conn.execute(
                insert(partitions),
                [
                    {
                        "step_execution_id": i,
                        "job_execution_id": execution_id,
                        "master_step_execution_id": step_ids[0],
                        "partition_name": f"p{n}",
                        "assigned_node": "history-node",
                        "attempt": 1,
                        "max_attempts": 1,
                        "status": partition_status,
                        "transferable": True,
                        "created_time": started,
                        "last_updated": ended or now,
                    }
                    for n, i in enumerate(step_ids[1:])
                ],
            )
        if coordination is not None:
            conn.execute(
                insert(job_coordination).values(
                    job_execution_id=execution_id,
                    master_node="history-node",
                    master_epoch=1,
                    master_step_execution_id=step_ids[0],
                    worker_step_name="work",
                    status=coordination,
                    created_time=started,
                    updated_time=ended or now,
                )
            )
            conn.execute(
                insert(job_masters).values(
                    job_execution_id=execution_id,
                    master_epoch=1,
                    master_node="history-node",
                    reason="launched",
                    since=started,
                )
            )
    return Written(int(instance_id), int(execution_id), step_ids)
