"""Read-only views of a cluster, for ``dbcluster status``, ``jobs`` and ``job``.

Every query is SQLAlchemy Core over :mod:`dbcluster.schema`; ages are computed from two values
read from the database clock (the provider's), never from this machine's clock. Nothing here
writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Engine, Select, func, inspect, select, union

from dbcluster.batch.dao.rows import context_from
from dbcluster.batch.exceptions import NoSuchJobExecutionError
from dbcluster.batch.status import BatchStatus
from dbcluster.batch.step import failure_line
from dbcluster.dialects import get_provider, safe_url
from dbcluster.errors import SchemaMissingError
from dbcluster.inlists import in_batches
from dbcluster.schema import (
    ALL_TABLES,
    job_coordination,
    job_execution,
    job_execution_params,
    job_instance,
    job_masters,
    nodes,
    partitions,
    step_execution,
    step_execution_context,
)
from dbcluster.states import PARTITION_CLAIMED, PARTITION_IN_FLIGHT

RUNNING_STATUSES = [s.value for s in BatchStatus if s.is_running]


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


def utc_iso(value: datetime) -> str:
    """ISO 8601 in UTC ending in ``Z``; a naive time is UTC (the database clock's)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat() + "Z"


def jsonable(value: Any) -> Any:
    """Dataclasses, datetimes (ISO 8601, UTC, ``Z``) and containers as JSON-ready values."""
    if hasattr(value, "__dataclass_fields__"):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return utc_iso(value)
    if isinstance(value, date):
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
    with engine.connect() as conn:
        for batch in in_batches(ids):
            stmt = (
                select(partitions.c.job_execution_id, partitions.c.status, func.count().label("n"))
                .where(partitions.c.job_execution_id.in_(batch))
                .group_by(partitions.c.job_execution_id, partitions.c.status)
            )
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
    from dbcluster.states import COORD_IN_FLIGHT

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
    # Two index lookups (the executions' status, the coordination rows' status) rather than one
    # OR across the join, which would read every execution ever run.
    in_flight = union(
        select(job_execution.c.job_execution_id).where(
            job_execution.c.status.in_(RUNNING_STATUSES)
        ),
        select(job_coordination.c.job_execution_id).where(
            job_coordination.c.status.in_(COORD_IN_FLIGHT)
        ),
    )
    with engine.connect() as conn:
        ids = [int(r[0]) for r in conn.execute(in_flight)]
    jobs = []
    for batch in in_batches(ids):
        jobs += _job_rows(engine, job_execution.c.job_execution_id.in_(batch))
    jobs.sort(key=lambda j: j.job_execution_id)
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
    #: Its step execution's: when it first started, when it ended, the first line of its exit.
    start_time: datetime | None = None
    end_time: datetime | None = None
    exit_message: str | None = None


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
    #: What the step keeps in its execution context (a partition's counts, say), without
    #: dbcluster's own keys (``dbcluster.*``: a reader's position, the partitions' names).
    context: dict[str, Any] = field(default_factory=dict)


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
    #: The execution's masters, first to current: who, under which epoch, since when, why.
    masters: list[MasterRow] = field(default_factory=list)
    #: With a partition limit: every partition's count by status (``partitions`` holds at most
    #: the limit), and how many there are in all.
    counts: dict[str, int] | None = None
    partitions_total: int | None = None

    @property
    def partition_counts(self) -> dict[str, int]:
        if self.counts is not None:
            return dict(self.counts)
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.status] = out.get(p.status, 0) + 1
        return out


@dataclass
class MasterRow:
    node: str
    epoch: int
    reason: str
    since: datetime | None


def _user_context(short: str | None, serialized: str | None) -> dict[str, Any]:
    """A step's execution context as the repository reads it, without dbcluster's own keys;
    empty when there is none or it cannot be read."""
    try:
        context = context_from(short, serialized)
    except ValueError:
        return {}
    return {k: v for k, v in context.items() if not str(k).startswith("dbcluster.")}


def job_detail(engine: Engine, execution_id: int, partition_limit: int | None = None) -> JobDetail:
    """One job execution, its partitions, steps and masters. With ``partition_limit`` (a
    dashboard), at most that many partitions (by name) are read, with their counts by status
    from the index, and the steps are the job's own (not one per partition): the result stays
    small however large the job."""
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
        part_stmt = (
            select(
                partitions,
                step_execution.c.start_time,
                step_execution.c.end_time,
                step_execution.c.exit_message,
                provider.now().label("db_now"),
            )
            .join(
                step_execution,
                step_execution.c.step_execution_id == partitions.c.step_execution_id,
            )
            .where(partitions.c.job_execution_id == execution_id)
            .order_by(partitions.c.partition_name, partitions.c.step_execution_id)
        )
        step_stmt = (
            select(
                step_execution,
                step_execution_context.c.short_context,
                step_execution_context.c.serialized_context,
            )
            .outerjoin(
                step_execution_context,
                step_execution_context.c.step_execution_id == step_execution.c.step_execution_id,
            )
            .where(step_execution.c.job_execution_id == execution_id)
            .order_by(step_execution.c.step_execution_id)
        )
        counts = None
        if partition_limit is not None:
            part_stmt = part_stmt.limit(partition_limit)
            step_stmt = step_stmt.where(~step_execution.c.step_name.contains(":")).limit(
                partition_limit
            )
            counts = {
                status: int(n)
                for status, n in conn.execute(
                    select(partitions.c.status, func.count())
                    .where(partitions.c.job_execution_id == execution_id)
                    .group_by(partitions.c.status)
                )
            }
        part_rows = conn.execute(part_stmt).all()
        db_now = part_rows[0].db_now if part_rows else conn.execute(provider.select_now()).scalar()
        step_rows = conn.execute(step_stmt).all()
        master_rows = conn.execute(
            select(job_masters)
            .where(job_masters.c.job_execution_id == execution_id)
            .order_by(job_masters.c.master_epoch)
        ).all()
    m = head._mapping
    return JobDetail(
        job_execution_id=execution_id,
        job=m["job_name"],
        job_instance_id=int(m["job_instance_id"]),
        status=m["status"],
        exit_code=m["exit_code"],
        exit_message=failure_line(m["exit_message"]),
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
                start_time=r.start_time,
                end_time=r.end_time,
                exit_message=failure_line(r.exit_message),
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
                exit_message=failure_line(r.exit_message),
                context=_user_context(r.short_context, r.serialized_context),
            )
            for r in step_rows
        ],
        masters=[
            MasterRow(node=r.master_node, epoch=int(r.master_epoch), reason=r.reason, since=r.since)
            for r in master_rows
        ],
        counts=counts,
        partitions_total=None if counts is None else sum(counts.values()),
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


# --- the dashboard's bounded reads --------------------------------------------------------------


@dataclass
class JobPage:
    """One page of job executions, newest first; ``older`` is the ``before`` of the next page
    (None on the last one)."""

    rows: list[JobRow]
    older: int | None


def job_page(
    engine: Engine,
    *,
    limit: int = 50,
    job_name: str | None = None,
    status: str | None = None,
    before: int | None = None,
) -> JobPage:
    """Job executions newest first, filtered by job name and status, a page at a time. Pages are
    keyed by execution id (``before``), never by offset, so the hundredth page costs what the
    first does."""
    where: list[Any] = []
    if status:
        where.append(job_execution.c.status == status)
    if before is not None:
        where.append(job_execution.c.job_execution_id < before)
    if not job_name:
        rows = _job_rows(engine, *where, limit=limit + 1)
    else:
        rows = _named_rows(engine, job_name, where, limit + 1, before)
    older = rows[limit - 1].job_execution_id if len(rows) > limit else None
    return JobPage(rows[:limit], older)


def _named_rows(
    engine: Engine, job_name: str, where: list[Any], wanted: int, before: int | None
) -> list[JobRow]:
    """The newest ``wanted`` executions of one job, read in windows of execution ids that grow
    fourfold, newest first. Asked for at once, some databases (MariaDB, SQLite) read every
    execution of that job by its name and sort them; a window is read along the primary key,
    and a job that runs often fills the page from the first one."""
    with engine.connect() as conn:
        top = conn.execute(select(func.max(job_execution.c.job_execution_id))).scalar()
        low = conn.execute(select(func.min(job_execution.c.job_execution_id))).scalar()
    if top is None or low is None:
        return []
    high = min(int(top) + 1, before) if before is not None else int(top) + 1
    rows: list[JobRow] = []
    window = 4 * wanted
    while high > int(low) and len(rows) < wanted:
        rows += _job_rows(
            engine,
            *where,
            job_instance.c.job_name == job_name,
            job_execution.c.job_execution_id < high,
            job_execution.c.job_execution_id >= high - window,
            limit=wanted - len(rows),
        )
        high -= window
        window *= 4
    return rows


@dataclass
class ClusterGauges:
    """What the whole cluster looks like now, from the database clock."""

    nodes: dict[str, int]
    oldest_heartbeat_age_s: float | None
    partitions: dict[str, int]
    oldest_claimed_age_s: float | None
    jobs_in_flight: int
    load: int
    capacity: int


def cluster_gauges(engine: Engine) -> ClusterGauges:
    """Bounded reads: the node registry (one row per node), the running job executions (by
    their status index) and their partitions (by their job's index), never all history.
    Partitions count those of running executions only."""
    provider = get_provider(engine)
    running = job_execution.c.status.in_(RUNNING_STATUSES)
    with engine.connect() as conn:
        node_rows = conn.execute(provider.select_nodes_with_age()).all()
        jobs = int(
            conn.execute(
                select(func.count()).select_from(job_execution).where(running)
            ).scalar_one()
        )
        part_rows = conn.execute(
            select(
                partitions.c.status,
                func.count().label("n"),
                func.min(partitions.c.last_updated).label("oldest"),
                provider.now().label("db_now"),
            )
            .join(job_execution, job_execution.c.job_execution_id == partitions.c.job_execution_id)
            .where(running)
            .group_by(partitions.c.status)
        ).all()
    by_status: dict[str, int] = {}
    for r in node_rows:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    ages = [a for r in node_rows if (a := _age_ms(r.db_now, r.last_heartbeat)) is not None]
    claimed = [_age_ms(r.db_now, r.oldest) for r in part_rows if r.status == PARTITION_CLAIMED]
    oldest_claimed = claimed[0] if claimed else None
    return ClusterGauges(
        nodes=by_status,
        oldest_heartbeat_age_s=max(ages) / 1000 if ages else None,
        partitions={r.status: int(r.n) for r in part_rows},
        oldest_claimed_age_s=None if oldest_claimed is None else oldest_claimed / 1000,
        jobs_in_flight=jobs,
        load=sum(int(r.current_load) for r in node_rows),
        capacity=sum(int(r.capacity) for r in node_rows),
    )


@dataclass
class PartitionSample:
    step_execution_id: int
    job_execution_id: int
    node: str | None
    attempt: int
    status: str


def partitions_in_flight(
    engine: Engine, limit: int = 10_000
) -> tuple[datetime | None, list[PartitionSample]]:
    """The database clock and the PENDING and CLAIMED partitions of running job executions (at
    most ``limit``), found through the running executions' status index."""
    provider = get_provider(engine)
    stmt = (
        select(
            partitions.c.step_execution_id,
            partitions.c.job_execution_id,
            partitions.c.assigned_node,
            partitions.c.attempt,
            partitions.c.status,
        )
        .join(job_execution, job_execution.c.job_execution_id == partitions.c.job_execution_id)
        .where(
            job_execution.c.status.in_(RUNNING_STATUSES),
            partitions.c.status.in_(PARTITION_IN_FLIGHT),
        )
        .limit(limit)
    )
    with engine.connect() as conn:
        now = conn.execute(provider.select_now()).scalar()
        rows = conn.execute(stmt).all()
    return now, [
        PartitionSample(
            int(r.step_execution_id),
            int(r.job_execution_id),
            r.assigned_node,
            int(r.attempt),
            r.status,
        )
        for r in rows
    ]


def registered_nodes(engine: Engine) -> set[str]:
    """The ids of the nodes in the registry now (one row per node: a small read)."""
    with engine.connect() as conn:
        return {r.node_id for r in conn.execute(select(nodes.c.node_id))}
