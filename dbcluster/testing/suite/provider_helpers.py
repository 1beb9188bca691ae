"""Helpers of the provider conformance tests: a job's partitions placed, nodes registered, a
store over the backend (also used by the project's own cluster tests)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import DBAPIError

from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.repository import JobRepository
from dbcluster.dialects.base import QueryProvider
from dbcluster.schema import partitions


def _provider(backend: Any) -> QueryProvider:
    return backend.provider


def _now(engine: Engine, provider: QueryProvider) -> datetime:
    with engine.connect() as conn:
        return conn.execute(provider.select_now()).scalar_one()


def _naive(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


def _job(engine: Engine, count: int = 2) -> tuple[int, list[int], int]:
    """A job execution with a master step and ``count`` partition step executions."""
    repository = JobRepository(engine)
    params = JobParameters.parse([f"suite={time.monotonic_ns()}"])
    instance = repository.create_job_instance("suite-job", params)
    execution = repository.create_job_execution(instance, params)
    master = repository.create_step_execution(execution, "suite.master")
    workers = [
        repository.create_step_execution(execution, f"suite.worker:p{i}") for i in range(count)
    ]
    return execution.id, [w.id for w in workers], master.id


def _place(
    engine: Engine, provider: QueryProvider, node: str, count: int = 2, *, transferable: bool = True
) -> tuple[int, list[int]]:
    job_id, ids, master_id = _job(engine, count)
    with engine.begin() as conn:
        conn.execute(
            provider.insert_coordination(job_id, node, "STARTED", master_id, "suite.worker")
        )
        conn.execute(
            provider.insert_partitions(),
            [
                {
                    "step_execution_id": sid,
                    "job_execution_id": job_id,
                    "master_step_execution_id": master_id,
                    "partition_name": f"p{i}",
                    "assigned_node": node,
                    "transferable": transferable,
                }
                for i, sid in enumerate(ids)
            ],
        )
    return job_id, ids


def _register(engine: Engine, provider: QueryProvider, *node_ids: str) -> None:
    with engine.begin() as conn:
        for node_id in node_ids:
            provider.register_node(conn, node_id, "suite-host", 4)


def _store(engine: Engine, provider: Any, **options: Any) -> Any:
    """The coordination store a node has: with an autocommit engine where the database has
    autocommit (single statements, the one-statement claim, run there)."""
    from dbcluster.cluster.store import CoordinationStore

    autocommit = (
        engine.execution_options(isolation_level="AUTOCOMMIT")
        if provider.supports_autocommit and not provider.private_to_engine(engine)
        else None
    )
    return CoordinationStore(engine, provider, autocommit=autocommit, **options)


def _rowcount(engine: Engine, stmt: Any) -> int:
    with engine.begin() as conn:
        return conn.execute(stmt).rowcount


def _lost_race(provider: QueryProvider, error: BaseException) -> bool:
    """A contender that failed lost the race only through a database error the provider calls
    transient (a lock conflict); the classifier itself is proven by the last test here."""
    return isinstance(error, DBAPIError) and provider.is_transient(error)


def _partition(engine: Engine, sid: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(partitions).where(partitions.c.step_execution_id == sid)).one()
