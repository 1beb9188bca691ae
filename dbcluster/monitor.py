"""Read-only views of a cluster, for ``dbcluster status``, ``jobs`` and ``job``.

Every query is SQLAlchemy Core over :mod:`dbcluster.schema`; ages are computed from two values
read from the database clock (the provider's), never from this machine's clock. Nothing here
writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from typing import Any

from sqlalchemy import Engine, Select, func, inspect, select

from dbcluster.batch.exceptions import NoSuchJobExecutionError
from dbcluster.batch.status import BatchStatus
from dbcluster.dialects import get_provider, safe_url
from dbcluster.errors import SchemaMissingError
from dbcluster.schema import (
    ALL_TABLES,
    job_coordination,
    job_execution,
    job_execution_params,
    job_instance,
    partitions,
    step_execution,
)

RUNNING_STATUSES = [s.value for s in BatchStatus if s.is_running]
#: Partition statuses in the order they are shown.
PARTITION_STATUSES = ("PENDING", "CLAIMED", "COMPLETED", "FAILED")


def require_schema(engine: Engine) -> None:
    """Raise :class:`SchemaMissingError` (saying to run ``dbcluster init``) when any dbcluster
    table is missing."""
    present = {name.lower() for name in inspect(engine).get_table_names()}
    missing = [t.name for t in ALL_TABLES if t.name.lower() not in present]
    if not missing:
        return
    where = safe_url(engine.url)
    if len(missing) == len(ALL_TABLES):
        what = f"the database {where} has no dbcluster tables"
    else:
        what = f"the database {where} lacks dbcluster tables {', '.join(missing)}"
    raise SchemaMissingError(f"{what}; run `dbcluster init` with the same --url first")


def _age_ms(now: datetime | None, then: datetime | None) -> int | None:
    if now is None or then is None:
        return None
    return max(0, round((now - then).total_seconds() * 1000))


def jsonable(value: Any) -> Any:
    """Dataclasses, datetimes and containers as JSON-ready values."""
    if hasattr(value, "__dataclass_fields__"):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


# --- status -------------------------------------------------------------------------------------


@dataclass
class NodeRow:
    node_id: str
    host: str
    status: str
    load: int
    capacity: int
    heartbeat_age_ms: int | None
    joined: datetime | None


@dataclass
class JobRow:
    job_execution_id: int
    job: str
    status: str
    exit_code: str | None
    master: str | None
    coordination: str | None
    start_time: datetime | None
    end_time: datetime | None
    partitions: dict[str, int] = field(default_factory=dict)

    @property
    def partitions_total(self) -> int:
        return sum(self.partitions.values())


@dataclass
class ClusterStatus:
    db_now: datetime | None
    nodes: list[NodeRow]
    jobs: list[JobRow]


def _partition_counts(engine: Engine, execution_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    ids = list(execution_ids)
    out: dict[int, dict[str, int]] = {i: {} for i in ids}
    if not ids:
        return out
    stmt = (
        select(partitions.c.job_execution_id, partitions.c.status, func.count().label("n"))
        .where(partitions.c.job_execution_id.in_(ids))
        .group_by(partitions.c.job_execution_id, partitions.c.status)
    )
    with engine.connect() as conn:
        for job_id, status, n in conn.execute(stmt):
            out.setdefault(int(job_id), {})[status] = int(n)
    return out


def _select_jobs(*columns: Any) -> Select[Any]:
    """Job executions with their job name and coordination row (master, status), if any."""
    return (
        select(
            *columns,
            job_instance.c.job_name,
            job_coordination.c.master_node,
            job_coordination.c.status.label("coordination"),
        )
        .join(job_instance, job_instance.c.job_instance_id == job_execution.c.job_instance_id)
        .outerjoin(
            job_coordination,
            job_coordination.c.job_execution_id == job_execution.c.job_execution_id,
        )
    )


def _job_rows(engine: Engine, *where: Any, limit: int | None = None) -> list[JobRow]:
    stmt = (
        _select_jobs(
            job_execution.c.job_execution_id,
            job_execution.c.status,
            job_execution.c.exit_code,
            job_execution.c.start_time,
            job_execution.c.end_time,
        )
        .where(*where)
        .order_by(job_execution.c.job_execution_id.desc())
    )
    if limit is not None:
        stmt = stmt.limit(limit)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    counts = _partition_counts(engine, [int(r.job_execution_id) for r in rows])
    return [
        JobRow(
            job_execution_id=int(r.job_execution_id),
            job=r.job_name,
            status=r.status,
            exit_code=r.exit_code,
            master=r.master_node,
            coordination=r.coordination,
            start_time=r.start_time,
            end_time=r.end_time,
            partitions=counts.get(int(r.job_execution_id), {}),
        )
        for r in rows
    ]


def cluster_status(engine: Engine) -> ClusterStatus:
    """The nodes, with heartbeat ages from the database clock, and the jobs in flight (running
    executions, and any whose coordination row is still in flight)."""
    from dbcluster.dialects.base import COORD_IN_FLIGHT

    provider = get_provider(engine)
    with engine.connect() as conn:
        node_rows = conn.execute(provider.select_nodes_with_age()).all()
        db_now = node_rows[0].db_now if node_rows else conn.execute(provider.select_now()).scalar()
    nodes = [
        NodeRow(
            node_id=r.node_id,
            host=r.host,
            status=r.status,
            load=int(r.current_load),
            capacity=int(r.capacity),
            heartbeat_age_ms=_age_ms(r.db_now, r.last_heartbeat),
            joined=r.created_time,
        )
        for r in node_rows
    ]
    jobs = _job_rows(
        engine,
        job_execution.c.status.in_(RUNNING_STATUSES)
        | job_coordination.c.status.in_(COORD_IN_FLIGHT),
    )
    jobs.reverse()
    return ClusterStatus(db_now, nodes, jobs)


def recent_jobs(engine: Engine, limit: int = 20, job_name: str | None = None) -> list[JobRow]:
    """The most recent job executions, newest first."""
    where = [job_instance.c.job_name == job_name] if job_name else []
    return _job_rows(engine, *where, limit=limit)


# --- one job ------------------------------------------------------------------------------------


@dataclass
class PartitionRow:
    step_execution_id: int
    name: str
    node: str | None
    status: str
    attempt: int
    transferable: bool
    last_updated: datetime | None
    age_ms: int | None


@dataclass
class StepRow:
    step_execution_id: int
    name: str
    status: str
    exit_code: str | None
    read_count: int
    write_count: int
    commit_count: int
    rollback_count: int
    start_time: datetime | None
    end_time: datetime | None
    exit_message: str | None = None


@dataclass
class JobDetail:
    job_execution_id: int
    job: str
    job_instance_id: int
    status: str
    exit_code: str | None
    exit_message: str | None
    parameters: list[str]
    create_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    master: str | None
    coordination: str | None
    db_now: datetime | None
    partitions: list[PartitionRow]
    steps: list[StepRow]

    @property
    def partition_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.status] = out.get(p.status, 0) + 1
        return out


def _first_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [line for line in text.strip().splitlines() if line.strip()]
    # A recorded traceback ends with the exception itself: that is the line to show.
    return lines[-1].strip() if lines and lines[0].startswith("Traceback") else lines[0].strip()


def job_detail(engine: Engine, execution_id: int) -> JobDetail:
    provider = get_provider(engine)
    with engine.connect() as conn:
        head = conn.execute(
            _select_jobs(job_execution).where(job_execution.c.job_execution_id == execution_id)
        ).first()
        if head is None:
            raise NoSuchJobExecutionError(f"there is no job execution with id {execution_id}")
        params = conn.execute(
            select(job_execution_params)
            .where(job_execution_params.c.job_execution_id == execution_id)
            .order_by(job_execution_params.c.parameter_name)
        ).all()
        part_rows = conn.execute(
            select(partitions, provider.now().label("db_now"))
            .where(partitions.c.job_execution_id == execution_id)
            .order_by(partitions.c.partition_name, partitions.c.step_execution_id)
        ).all()
        db_now = part_rows[0].db_now if part_rows else conn.execute(provider.select_now()).scalar()
        step_rows = conn.execute(
            select(step_execution)
            .where(step_execution.c.job_execution_id == execution_id)
            .order_by(step_execution.c.step_execution_id)
        ).all()
    m = head._mapping
    return JobDetail(
        job_execution_id=execution_id,
        job=m["job_name"],
        job_instance_id=int(m["job_instance_id"]),
        status=m["status"],
        exit_code=m["exit_code"],
        exit_message=_first_line(m["exit_message"]),
        parameters=[
            f"{'' if p.identifying else '-'}{p.parameter_name}({p.parameter_type})="
            f"{p.parameter_value}"
            for p in params
        ],
        create_time=m["create_time"],
        start_time=m["start_time"],
        end_time=m["end_time"],
        master=m["master_node"],
        coordination=m["coordination"],
        db_now=db_now,
        partitions=[
            PartitionRow(
                step_execution_id=int(r.step_execution_id),
                name=r.partition_name,
                node=r.assigned_node,
                status=r.status,
                attempt=int(r.attempt),
                transferable=bool(r.transferable),
                last_updated=r.last_updated,
                age_ms=_age_ms(r.db_now, r.last_updated),
            )
            for r in part_rows
        ],
        steps=[
            StepRow(
                step_execution_id=int(r.step_execution_id),
                name=r.step_name,
                status=r.status,
                exit_code=r.exit_code,
                read_count=int(r.read_count),
                write_count=int(r.write_count),
                commit_count=int(r.commit_count),
                rollback_count=int(r.rollback_count),
                start_time=r.start_time,
                end_time=r.end_time,
                exit_message=_first_line(r.exit_message),
            )
            for r in step_rows
        ],
    )


def partition_progress(engine: Engine, master_step_execution_id: int) -> dict[str, dict[str, int]]:
    """Partition counts by node and status for one partitioned step (the launch progress bar).
    Partitions handed back and not yet placed again count under the node ``""``."""
    stmt = (
        select(partitions.c.assigned_node, partitions.c.status, func.count().label("n"))
        .where(partitions.c.master_step_execution_id == master_step_execution_id)
        .group_by(partitions.c.assigned_node, partitions.c.status)
    )
    out: dict[str, dict[str, int]] = {}
    with engine.connect() as conn:
        for node, status, n in conn.execute(stmt):
            out.setdefault(node or "", {})[status] = int(n)
    return out


def reassigned_count(engine: Engine, job_execution_id: int) -> int:
    """Partitions of a job execution that run on a later attempt than their first."""
    stmt = select(func.count()).where(
        partitions.c.job_execution_id == job_execution_id, partitions.c.attempt > 1
    )
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())
