"""The job repository: every job and step execution recorded in SQL, on SQLAlchemy Core.

Every write method takes an optional ``conn``: given, it runs inside that connection's transaction
and does not commit; omitted, it runs in its own transaction. Updates are guarded by ``version``
(optimistic locking) and, for step executions, by the execution's in-memory ``write_guard``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Row, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from dbcluster import schema
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import COUNTER_NAMES, JobExecution, JobInstance, StepExecution, utcnow
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.parameters import JobParameter, JobParameters, parse_value
from dbcluster.batch.status import BatchStatus, ExitStatus

log = logging.getLogger(__name__)

_JI = schema.job_instance
_JE = schema.job_execution
_JP = schema.job_execution_params
_SE = schema.step_execution
_JC = schema.job_execution_context
_SC = schema.step_execution_context

_RUNNING = [s.value for s in BatchStatus if s.is_running]
#: Keeps IN lists under every database's limit (Oracle: 1000).
_IN_BATCH = 500
_EXIT_MAX = schema.EXIT_LENGTH


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= _EXIT_MAX:
        return text
    return text[: _EXIT_MAX - 3] + "..."


def _context_columns(context: ExecutionContext) -> dict[str, str | None]:
    text = context.to_json()
    if len(text) <= schema.SHORT_CONTEXT_LENGTH:
        return {"short_context": text, "serialized_context": None}
    return {
        "short_context": text[: schema.SHORT_CONTEXT_LENGTH - 3] + "...",
        "serialized_context": text,
    }


def _execution_fields(m: Any) -> dict[str, Any]:
    """What job and step execution rows share: status, exit status, times, version, context."""
    return {
        "status": BatchStatus(m["status"]),
        "exit_status": ExitStatus(m["exit_code"] or "UNKNOWN", m["exit_message"] or ""),
        "create_time": m["create_time"],
        "start_time": m["start_time"],
        "end_time": m["end_time"],
        "last_updated": m["last_updated"],
        "version": int(m["version"]),
        "execution_context": _context_from_row(m["short_context"], m["serialized_context"]),
    }


def _context_from_row(short: str | None, serialized: str | None) -> ExecutionContext:
    return ExecutionContext.from_json(serialized if serialized is not None else short)


def _batches(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), _IN_BATCH):
        yield items[start : start + _IN_BATCH]


class JobRepository:
    """Creates, updates and finds job instances, job executions and step executions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- plumbing ----------------------------------------------------------------------------

    @contextmanager
    def transaction(self, conn: Connection | None = None) -> Iterator[Connection]:
        """``conn`` itself if given (its transaction, not committed here), else a new transaction
        committed on exit."""
        if conn is not None:
            yield conn
        else:
            with self.engine.begin() as own:
                yield own

    @contextmanager
    def _read(self, conn: Connection | None) -> Iterator[Connection]:
        if conn is not None:
            yield conn
        else:
            with self.engine.connect() as own:
                yield own

    def _insert_id(self, conn: Connection, table: Any, pk: Any, values: dict[str, Any]) -> int:
        if conn.dialect.insert_returning:
            return int(conn.execute(insert(table).values(**values).returning(pk)).scalar_one())
        result = conn.execute(insert(table).values(**values))
        return int(result.inserted_primary_key[0])

    # --- job instances -----------------------------------------------------------------------

    def create_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance:
        key = params.job_key()
        with self.transaction(conn) as c:
            new_id = self._insert_id(
                c, _JI, _JI.c.job_instance_id, {"job_name": job_name, "job_key": key, "version": 0}
            )
        return JobInstance(id=new_id, job_name=job_name, job_key=key, version=0)

    def get_or_create_job_instance(self, job_name: str, params: JobParameters) -> JobInstance:
        """The instance for these parameters; tolerates a concurrent creator."""
        found = self.get_job_instance(job_name, params)
        if found is not None:
            return found
        try:
            return self.create_job_instance(job_name, params)
        except IntegrityError:
            found = self.get_job_instance(job_name, params)
            if found is None:
                raise
            return found

    def get_job_instance(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobInstance | None:
        stmt = select(_JI).where(_JI.c.job_name == job_name, _JI.c.job_key == params.job_key())
        with self._read(conn) as c:
            row = c.execute(stmt).first()
        return None if row is None else self._instance(row)

    def get_job_instance_by_id(
        self, instance_id: int, conn: Connection | None = None
    ) -> JobInstance | None:
        with self._read(conn) as c:
            row = c.execute(select(_JI).where(_JI.c.job_instance_id == instance_id)).first()
        return None if row is None else self._instance(row)

    def lock_job_instance(self, instance: JobInstance, conn: Connection) -> None:
        """Take the instance's row lock for the rest of ``conn``'s transaction (serializes launches
        of the same instance across processes)."""
        conn.execute(
            update(_JI)
            .where(_JI.c.job_instance_id == instance.id)
            .values(version=_JI.c.version + 1)
        )
        instance.version += 1

    @staticmethod
    def _instance(row: Row[Any]) -> JobInstance:
        m = row._mapping
        return JobInstance(
            id=int(m["job_instance_id"]),
            job_name=m["job_name"],
            job_key=m["job_key"],
            version=int(m["version"]),
        )

    # --- job executions ----------------------------------------------------------------------

    def create_job_execution(
        self,
        job_instance: JobInstance,
        params: JobParameters,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
    ) -> JobExecution:
        now = utcnow()
        context = context if context is not None else ExecutionContext()
        with self.transaction(conn) as c:
            new_id = self._insert_id(
                c,
                _JE,
                _JE.c.job_execution_id,
                {
                    "version": 0,
                    "job_instance_id": job_instance.id,
                    "create_time": now,
                    "status": BatchStatus.STARTING.value,
                    "exit_code": ExitStatus.UNKNOWN.code,
                    "exit_message": "",
                    "last_updated": now,
                },
            )
            if len(params):
                c.execute(
                    insert(_JP),
                    [
                        {
                            "job_execution_id": new_id,
                            "parameter_name": name,
                            "parameter_type": p.type_name,
                            "parameter_value": p.text,
                            "identifying": p.identifying,
                        }
                        for name, p in params.parameters().items()
                    ],
                )
            c.execute(insert(_JC).values(job_execution_id=new_id, **_context_columns(context)))
        context.clear_dirty()
        return JobExecution(
            id=new_id,
            job_instance=job_instance,
            parameters=params,
            create_time=now,
            last_updated=now,
            execution_context=context,
        )

    def update_job_execution(self, execution: JobExecution, conn: Connection | None = None) -> None:
        now = utcnow()
        stmt = (
            update(_JE)
            .where(
                _JE.c.job_execution_id == execution.id,
                _JE.c.version == execution.version,
            )
            .values(
                version=_JE.c.version + 1,
                start_time=execution.start_time,
                end_time=execution.end_time,
                status=execution.status.value,
                exit_code=_clip(execution.exit_status.code),
                exit_message=_clip(execution.exit_status.description),
                last_updated=now,
            )
        )
        with self.transaction(conn) as c:
            if c.execute(stmt).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"job execution {execution.id} (version {execution.version}) was updated by "
                    f"someone else or no longer exists; reload it before updating"
                )
        execution.version += 1
        execution.last_updated = now

    def update_job_execution_context(
        self, execution: JobExecution, conn: Connection | None = None
    ) -> None:
        stmt = (
            update(_JC)
            .where(_JC.c.job_execution_id == execution.id)
            .values(**_context_columns(execution.execution_context))
        )
        with self.transaction(conn) as c:
            if c.execute(stmt).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"the context of job execution {execution.id} no longer exists"
                )
        execution.execution_context.clear_dirty()

    def get_job_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> JobExecution | None:
        with self._read(conn) as c:
            found = self._job_executions(c, _JE.c.job_execution_id == execution_id)
        return found[0] if found else None

    def get_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        """Every execution of the instance, newest first."""
        with self._read(conn) as c:
            return self._job_executions(c, _JE.c.job_instance_id == job_instance.id)

    def get_last_job_execution(
        self, job_name: str, params: JobParameters, conn: Connection | None = None
    ) -> JobExecution | None:
        with self._read(conn) as c:
            instance = self.get_job_instance(job_name, params, c)
            if instance is None:
                return None
            found = self._job_executions(c, _JE.c.job_instance_id == instance.id, limit=1)
        return found[0] if found else None

    def find_running_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> list[JobExecution]:
        with self._read(conn) as c:
            return self._job_executions(
                c,
                _JE.c.job_instance_id == job_instance.id,
                _JE.c.status.in_(_RUNNING),
            )

    def count_job_executions(
        self, job_instance: JobInstance, conn: Connection | None = None
    ) -> int:
        stmt = select(func.count()).select_from(_JE).where(_JE.c.job_instance_id == job_instance.id)
        with self._read(conn) as c:
            return int(c.execute(stmt).scalar_one())

    def _job_executions(
        self, c: Connection, *where: Any, limit: int | None = None
    ) -> list[JobExecution]:
        stmt = (
            select(
                _JE,
                _JI.c.job_name,
                _JI.c.job_key,
                _JI.c.version.label("instance_version"),
                _JC.c.short_context,
                _JC.c.serialized_context,
            )
            .join(_JI, _JI.c.job_instance_id == _JE.c.job_instance_id)
            .outerjoin(_JC, _JC.c.job_execution_id == _JE.c.job_execution_id)
            .where(*where)
            .order_by(_JE.c.create_time.desc(), _JE.c.job_execution_id.desc())
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        rows = c.execute(stmt).all()
        if not rows:
            return []
        ids = [int(r._mapping["job_execution_id"]) for r in rows]
        params: dict[int, dict[str, JobParameter]] = {i: {} for i in ids}
        for batch in _batches(ids):
            for p in c.execute(
                select(_JP)
                .where(_JP.c.job_execution_id.in_(batch))
                .order_by(_JP.c.job_execution_id, _JP.c.parameter_name)
            ).all():
                pm = p._mapping
                params[int(pm["job_execution_id"])][pm["parameter_name"]] = JobParameter(
                    parse_value(pm["parameter_type"], pm["parameter_value"] or ""),
                    identifying=bool(pm["identifying"]),
                )
        result = []
        for row in rows:
            m = row._mapping
            execution_id = int(m["job_execution_id"])
            result.append(
                JobExecution(
                    id=execution_id,
                    job_instance=JobInstance(
                        id=int(m["job_instance_id"]),
                        job_name=m["job_name"],
                        job_key=m["job_key"],
                        version=int(m["instance_version"]),
                    ),
                    parameters=JobParameters(params[execution_id]),
                    **_execution_fields(m),
                )
            )
        return result

    # --- step executions ---------------------------------------------------------------------

    def create_step_execution(
        self,
        job_execution: JobExecution,
        step_name: str,
        context: ExecutionContext | None = None,
        conn: Connection | None = None,
    ) -> StepExecution:
        return self.create_step_executions(job_execution, [(step_name, context)], conn)[0]

    def create_step_executions(
        self,
        job_execution: JobExecution,
        steps: Sequence[tuple[str, ExecutionContext | None]],
        conn: Connection | None = None,
    ) -> list[StepExecution]:
        """Insert many step executions (e.g. a step's partitions) and their contexts in bulk."""
        if not steps:
            return []
        names = [name for name, _ in steps]
        if len(set(names)) != len(names):
            raise ValueError("step execution names created together must be unique")
        now = utcnow()
        rows = [
            {
                "version": 0,
                "step_name": name,
                "job_execution_id": job_execution.id,
                "create_time": now,
                "status": BatchStatus.STARTING.value,
                "exit_code": ExitStatus.EXECUTING.code,
                "exit_message": "",
                "last_updated": now,
                **{counter: 0 for counter in COUNTER_NAMES},
            }
            for name in names
        ]
        with self.transaction(conn) as c:
            if len(rows) == 1:
                ids = [self._insert_id(c, _SE, _SE.c.step_execution_id, rows[0])]
            elif c.dialect.insert_executemany_returning_sort_by_parameter_order:
                ids = [
                    int(i)
                    for i in c.execute(
                        insert(_SE).returning(
                            _SE.c.step_execution_id, sort_by_parameter_order=True
                        ),
                        rows,
                    ).scalars()
                ]
            else:
                c.execute(insert(_SE), rows)
                by_name: dict[str, int] = {}
                for batch in _batches(names):
                    for row in c.execute(
                        select(_SE.c.step_execution_id, _SE.c.step_name).where(
                            _SE.c.job_execution_id == job_execution.id,
                            _SE.c.step_name.in_(batch),
                        )
                    ).all():
                        by_name[row[1]] = max(by_name.get(row[1], 0), int(row[0]))
                ids = [by_name[name] for name in names]
            contexts = [ctx if ctx is not None else ExecutionContext() for _, ctx in steps]
            c.execute(
                insert(_SC),
                [
                    {"step_execution_id": i, **_context_columns(ctx)}
                    for i, ctx in zip(ids, contexts, strict=True)
                ],
            )
        result = []
        for step_id, name, ctx in zip(ids, names, contexts, strict=True):
            ctx.clear_dirty()
            result.append(
                StepExecution(
                    id=step_id,
                    step_name=name,
                    job_execution=job_execution,
                    create_time=now,
                    last_updated=now,
                    execution_context=ctx,
                )
            )
        return result

    def update_step_execution(
        self, execution: StepExecution, conn: Connection | None = None
    ) -> None:
        """Persist status, exit status, times and counters; bumps ``version``."""
        now = utcnow()
        where = [_SE.c.step_execution_id == execution.id, _SE.c.version == execution.version]
        if execution.write_guard is not None:
            where.append(execution.write_guard)
        stmt = (
            update(_SE)
            .where(*where)
            .values(
                version=_SE.c.version + 1,
                start_time=execution.start_time,
                end_time=execution.end_time,
                status=execution.status.value,
                exit_code=_clip(execution.exit_status.code),
                exit_message=_clip(execution.exit_status.description),
                last_updated=now,
                **execution.counters(),
            )
        )
        with self.transaction(conn) as c:
            if c.execute(stmt).rowcount != 1:
                guard = (
                    " or its write guard no longer holds"
                    if execution.write_guard is not None
                    else ""
                )
                raise OptimisticLockingFailureError(
                    f"step execution {execution.id} ({execution.step_name!r}, version "
                    f"{execution.version}) was updated by someone else{guard}; "
                    f"this update was refused"
                )
        execution.version += 1
        execution.last_updated = now

    def update_step_execution_context(
        self, execution: StepExecution, conn: Connection | None = None
    ) -> None:
        where = [_SC.c.step_execution_id == execution.id]
        if execution.write_guard is not None:
            where.append(execution.write_guard)
        stmt = update(_SC).where(*where).values(**_context_columns(execution.execution_context))
        with self.transaction(conn) as c:
            if c.execute(stmt).rowcount != 1:
                raise OptimisticLockingFailureError(
                    f"the context of step execution {execution.id} ({execution.step_name!r}) "
                    f"could not be updated: the row is gone or its write guard no longer holds"
                )
        execution.execution_context.clear_dirty()

    def get_step_execution(
        self, execution_id: int, conn: Connection | None = None
    ) -> StepExecution | None:
        """One step execution with its context, its job execution and that job's parameters."""
        with self._read(conn) as c:
            job_id = c.execute(
                select(_SE.c.job_execution_id).where(_SE.c.step_execution_id == execution_id)
            ).scalar_one_or_none()
            if job_id is None:
                return None
            job_execution = self._job_executions(c, _JE.c.job_execution_id == job_id)[0]
            found = self._step_executions(c, job_execution, _SE.c.step_execution_id == execution_id)
        return found[0] if found else None

    def get_step_executions_by_ids(
        self, job_execution: JobExecution, ids: Sequence[int], conn: Connection | None = None
    ) -> list[StepExecution]:
        """Step executions of one job execution, reloaded, in the order of ``ids``."""
        found: dict[int, StepExecution] = {}
        with self._read(conn) as c:
            for batch in _batches(list(ids)):
                for se in self._step_executions(
                    c, job_execution, _SE.c.step_execution_id.in_(batch)
                ):
                    found[se.id] = se
        return [found[i] for i in ids if i in found]

    def get_step_executions(
        self, job_execution: JobExecution, conn: Connection | None = None
    ) -> list[StepExecution]:
        """Every step execution of a job execution, oldest first."""
        with self._read(conn) as c:
            return self._step_executions(
                c, job_execution, _SE.c.job_execution_id == job_execution.id
            )

    def get_last_step_execution(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> StepExecution | None:
        """The newest execution of ``step_name`` in any execution of the instance."""
        return self.get_last_step_executions(job_instance, [step_name], conn).get(step_name)

    def get_last_step_executions(
        self,
        job_instance: JobInstance,
        step_names: Sequence[str],
        conn: Connection | None = None,
        before_job_execution_id: int | None = None,
    ) -> dict[str, StepExecution]:
        """The newest execution of each named step in the instance (optionally only those of job
        executions older than ``before_job_execution_id``)."""
        result: dict[str, StepExecution] = {}
        with self._read(conn) as c:
            jobs: dict[int, JobExecution] = {}
            for batch in _batches(list(step_names)):
                where = [
                    _JE.c.job_instance_id == job_instance.id,
                    _SE.c.step_name.in_(batch),
                ]
                if before_job_execution_id is not None:
                    where.append(_SE.c.job_execution_id < before_job_execution_id)
                rows = c.execute(
                    select(_SE.c.step_execution_id, _SE.c.step_name, _SE.c.job_execution_id)
                    .join(_JE, _JE.c.job_execution_id == _SE.c.job_execution_id)
                    .where(*where)
                ).all()
                newest: dict[str, tuple[int, int]] = {}
                for step_id, name, job_id in rows:
                    if name not in newest or int(step_id) > newest[name][0]:
                        newest[name] = (int(step_id), int(job_id))
                by_job: dict[int, list[int]] = {}
                for step_id, job_id in newest.values():
                    by_job.setdefault(job_id, []).append(step_id)
                for job_id, step_ids in by_job.items():
                    if job_id not in jobs:
                        jobs[job_id] = self._job_executions(c, _JE.c.job_execution_id == job_id)[0]
                    for se in self._step_executions(
                        c, jobs[job_id], _SE.c.step_execution_id.in_(step_ids)
                    ):
                        result[se.step_name] = se
        return result

    def count_step_executions(
        self, job_instance: JobInstance, step_name: str, conn: Connection | None = None
    ) -> int:
        stmt = (
            select(func.count())
            .select_from(_SE.join(_JE, _JE.c.job_execution_id == _SE.c.job_execution_id))
            .where(_JE.c.job_instance_id == job_instance.id, _SE.c.step_name == step_name)
        )
        with self._read(conn) as c:
            return int(c.execute(stmt).scalar_one())

    def _step_executions(
        self, c: Connection, job_execution: JobExecution, *where: Any
    ) -> list[StepExecution]:
        stmt = (
            select(_SE, _SC.c.short_context, _SC.c.serialized_context)
            .outerjoin(_SC, _SC.c.step_execution_id == _SE.c.step_execution_id)
            .where(*where)
            .order_by(_SE.c.step_execution_id)
        )
        result = []
        for row in c.execute(stmt).all():
            m = row._mapping
            result.append(
                StepExecution(
                    id=int(m["step_execution_id"]),
                    step_name=m["step_name"],
                    job_execution=job_execution,
                    **_execution_fields(m),
                    **{counter: int(m[counter]) for counter in COUNTER_NAMES},
                )
            )
        return result
