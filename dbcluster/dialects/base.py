"""The query provider contract and everything portable about it.

A provider says how one database expresses each coordination statement; it holds no coordination
logic. Everything expressible in portable SQLAlchemy Core lives here, once. A subclass overrides
only what its database does differently: the clock, "older than N ms", column types, an upsert,
which driver errors are transient, and capability flags.

Statement builders return SQLAlchemy executables with bound parameters; the caller executes them
and judges the row count.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    DateTime,
    Delete,
    Engine,
    Insert,
    Select,
    Update,
    and_,
    delete,
    exists,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster import schema
from dbcluster.schema import job_coordination, nodes, partitions

# Statuses are plain strings in the database; these are the only spellings.
NODE_ACTIVE = "ACTIVE"
NODE_UNREACHABLE = "UNREACHABLE"

PARTITION_PENDING = "PENDING"
PARTITION_CLAIMED = "CLAIMED"
PARTITION_COMPLETED = "COMPLETED"
PARTITION_FAILED = "FAILED"
PARTITION_IN_FLIGHT = (PARTITION_PENDING, PARTITION_CLAIMED)

COORD_CREATED = "CREATED"
COORD_STARTED = "STARTED"
COORD_COMPLETED = "COMPLETED"
COORD_FAILED = "FAILED"
COORD_RECOVERING = "RECOVERING"
COORD_ABANDONED = "ABANDONED"
COORD_IN_FLIGHT = (COORD_CREATED, COORD_STARTED, COORD_RECOVERING)


class QueryProvider:
    """The portable provider. Subclasses set the class attributes and override what differs."""

    #: The name users type: ``dbcluster ddl --dialect NAME``.
    name: ClassVar[str] = ""
    #: SQLAlchemy dialect names (``engine.dialect.name``) this provider serves.
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ()
    #: URL used to build a dialect for compiling DDL without a server.
    example_url: ClassVar[str] = ""
    #: Driver module -> the pip extra that installs it.
    drivers: ClassVar[dict[str, str]] = {}

    # Capability flags (the conformance suite skips what a provider declares it cannot do).
    #: Several OS processes may share the database (false only for in-memory databases).
    supports_multiple_processes: ClassVar[bool] = True
    #: The database is reached over TCP, so a proxy can cut a node's connection.
    network_backend: ClassVar[bool] = True

    #: The server can create and drop a database cheaply (tests isolate each run in one).
    can_create_database: ClassVar[bool] = True

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    @classmethod
    def offline_dialect(cls, dialect_class: type[Dialect]) -> Dialect:
        """A dialect to compile statements and DDL with when no server is connected."""
        return dialect_class()

    # --- types ----------------------------------------------------------------------------------

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        """The concrete type for a schema type kind (``timestamp``, ``long_text``, ``id``).

        None means "the generic SQLAlchemy type is right here".
        """
        return None

    # --- the database clock ---------------------------------------------------------------------

    def now(self) -> ColumnElement[datetime]:
        """The database clock, in UTC, with at least millisecond precision."""
        raise NotImplementedError

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        """``column`` is more than ``ms`` milliseconds before the database clock.

        Compare the bare column with "now minus N" so an index on it can be used.
        """
        raise NotImplementedError

    def select_now(self) -> Select[Any]:
        return select(self.now().label("now"))

    # --- engine set-up --------------------------------------------------------------------------

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for ``create_engine`` that this database needs."""
        return {"pool_pre_ping": True}

    def private_to_engine(self, engine: Engine) -> bool:
        """The engine's database lives only inside that engine (an in-memory database): a second
        engine would see another, empty database."""
        return False

    def coordination_engine_options(self) -> dict[str, Any]:
        """Extra ``create_engine`` arguments for a node's own coordination engine: chiefly a
        lock wait bound, so a master or heartbeat never waits forever behind a row lock held by
        a stopped process (the wait fails as a transient error and is retried)."""
        return {}

    def configure_engine(self, engine: Engine, *, coordination: bool = False) -> None:
        """Per-engine set-up (connection pragmas, transaction begin statements)."""

    # --- transient errors -----------------------------------------------------------------------

    def is_transient(self, error: BaseException) -> bool:
        """Whether repeating the statement may succeed: deadlock, serialization failure, lock
        timeout, lost connection."""
        if isinstance(error, DBAPIError) and error.connection_invalidated:
            return True
        if isinstance(error, DBAPIError):
            return self._is_transient_driver_error(error.orig)
        return False

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        return False

    # --- DDL ------------------------------------------------------------------------------------

    def ddl_statements(self) -> list[str]:
        """Every CREATE statement for the dbcluster tables, parents first."""
        out: list[str] = []
        for table in schema.ALL_TABLES:
            out.append(str(CreateTable(table).compile(dialect=self.dialect)).strip())
            for index in sorted(table.indexes, key=lambda i: i.name or ""):
                out.append(str(CreateIndex(index).compile(dialect=self.dialect)).strip())
        return out

    def ddl_script(self) -> str:
        header = f"-- dbcluster schema for {self.name} (generated by `dbcluster ddl`)\n"
        return header + "".join(f"\n{stmt};\n" for stmt in self.ddl_statements())

    def create_tables(self, engine: Engine) -> list[str]:
        """Create the tables that are missing; safe when several processes run it at once.

        Returns the names of the tables this call created.
        """
        created: list[str] = []
        for table in schema.ALL_TABLES:
            if self._table_exists(engine, table.name):
                continue
            for retry in range(10):
                try:
                    with engine.begin() as conn:
                        table.create(conn, checkfirst=True)
                    created.append(table.name)
                    break
                except DBAPIError as exc:
                    # Another process created it between our check and our CREATE.
                    if self._table_exists(engine, table.name):
                        break
                    # Or holds the lock while it does (SQLite: "database is locked").
                    if retry < 9 and self.is_transient(exc):
                        time.sleep(0.05 * (retry + 1))
                        continue
                    raise
        return created

    @staticmethod
    def _table_exists(engine: Engine, name: str) -> bool:
        from sqlalchemy import inspect

        return inspect(engine).has_table(name)

    def create_database_sql(self, name: str) -> str:
        """DDL for a scratch database; ``name`` is generated, never user input."""
        return f"CREATE DATABASE {name}"

    def drop_database_sql(self, name: str) -> str:
        return f"DROP DATABASE {name}"

    # --- node registry --------------------------------------------------------------------------

    def register_node(self, conn: Connection, node_id: str, host: str, capacity: int = 0) -> None:
        """Insert the node ACTIVE, or refresh it if the id is already there."""
        values = self._node_values(host, capacity)
        refreshed = conn.execute(
            update(nodes).where(nodes.c.node_id == node_id).values(**values)
        ).rowcount
        if refreshed:
            return
        try:
            with conn.begin_nested():
                conn.execute(
                    insert(nodes).values(node_id=node_id, created_time=self.now(), **values)
                )
        except IntegrityError:
            conn.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))

    def _node_values(self, host: str, capacity: int) -> dict[str, Any]:
        return {
            "host": host,
            "capacity": capacity,
            "status": NODE_ACTIVE,
            "last_heartbeat": self.now(),
            "current_load": 0,
        }

    def heartbeat(self, node_id: str, load: int) -> Update:
        """Refresh the heartbeat; changes no row when the node was removed (then it must fence)."""
        return (
            update(nodes)
            .where(nodes.c.node_id == node_id)
            .values(last_heartbeat=self.now(), current_load=load, status=NODE_ACTIVE)
        )

    def set_node_capacity(self, node_id: str, capacity: int) -> Update:
        return update(nodes).where(nodes.c.node_id == node_id).values(capacity=capacity)

    def mark_unreachable(self, threshold_ms: int) -> Update:
        return (
            update(nodes)
            .where(
                nodes.c.status == NODE_ACTIVE,
                self.older_than(nodes.c.last_heartbeat, threshold_ms),
            )
            .values(status=NODE_UNREACHABLE)
        )

    def remove_stale(self, threshold_ms: int) -> Delete:
        return delete(nodes).where(
            nodes.c.status == NODE_UNREACHABLE,
            self.older_than(nodes.c.last_heartbeat, threshold_ms),
        )

    def deregister_node(self, node_id: str) -> Delete:
        return delete(nodes).where(nodes.c.node_id == node_id)

    def select_nodes(self, status: str | None = NODE_ACTIVE) -> Select[Any]:
        stmt = select(
            nodes.c.node_id,
            nodes.c.host,
            nodes.c.status,
            nodes.c.current_load,
            nodes.c.capacity,
            nodes.c.created_time,
            nodes.c.last_heartbeat,
        ).order_by(nodes.c.node_id)
        if status is not None:
            stmt = stmt.where(nodes.c.status == status)
        return stmt

    def select_nodes_with_age(self) -> Select[Any]:
        """Every node with the database clock beside it (heartbeat age is computed by the caller
        from two values read from the same clock)."""
        return self.select_nodes(None).add_columns(self.now().label("db_now"))

    # --- partitions -----------------------------------------------------------------------------

    def insert_partitions(self) -> Insert:
        """An executemany-able INSERT of PENDING partition rows; ``created_time`` and
        ``last_updated`` come from the database clock."""
        return insert(partitions).values(
            status=PARTITION_PENDING,
            attempt=1,
            created_time=self.now(),
            last_updated=self.now(),
        )

    def _guarded(
        self, step_execution_id: int, node_id: str, attempt: int, statuses: Iterable[str]
    ) -> ColumnElement[bool]:
        return and_(
            partitions.c.step_execution_id == step_execution_id,
            partitions.c.assigned_node == node_id,
            partitions.c.attempt == attempt,
            partitions.c.status.in_(list(statuses)),
        )

    def claim_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Update:
        """PENDING -> CLAIMED for this node and attempt. The worker runs the partition only when
        this changed exactly one row."""
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, [PARTITION_PENDING]))
            .values(status=PARTITION_CLAIMED, last_updated=self.now())
        )

    def finish_partition(
        self, step_execution_id: int, node_id: str, attempt: int, status: str
    ) -> Update:
        """CLAIMED -> COMPLETED or FAILED, only while this node still holds this attempt."""
        if status not in (PARTITION_COMPLETED, PARTITION_FAILED):
            raise ValueError(f"a partition finishes COMPLETED or FAILED, not {status}")
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, PARTITION_IN_FLIGHT))
            .values(status=status, last_updated=self.now())
        )

    def release_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Update:
        """Hand back a partition this node has not started: unassigned, next attempt, PENDING.
        Because it never ran, the master may place it anywhere, transferable or not."""
        return (
            update(partitions)
            .where(self._guarded(step_execution_id, node_id, attempt, PARTITION_IN_FLIGHT))
            .values(
                status=PARTITION_PENDING,
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                last_updated=self.now(),
            )
        )

    def release_pending_for_node(self, node_id: str) -> Update:
        """Hand back every partition assigned to a leaving node that it has not claimed."""
        return (
            update(partitions)
            .where(
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .values(
                assigned_node=None,
                attempt=partitions.c.attempt + 1,
                last_updated=self.now(),
            )
        )

    def reassign_partition(
        self, step_execution_id: int, from_node: str | None, attempt: int, to_node: str
    ) -> Update:
        """Move an orphaned partition to a live node under the next attempt."""
        owner = (
            partitions.c.assigned_node.is_(None)
            if from_node is None
            else partitions.c.assigned_node == from_node
        )
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id == step_execution_id,
                owner,
                partitions.c.attempt == attempt,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .values(
                status=PARTITION_PENDING,
                assigned_node=to_node,
                attempt=partitions.c.attempt + 1,
                last_updated=self.now(),
            )
        )

    def fail_orphaned_partition(
        self, step_execution_id: int, from_node: str | None, attempt: int
    ) -> Update:
        """A non-transferable partition whose node was lost after claiming it: FAILED."""
        owner = (
            partitions.c.assigned_node.is_(None)
            if from_node is None
            else partitions.c.assigned_node == from_node
        )
        return (
            update(partitions)
            .where(
                partitions.c.step_execution_id == step_execution_id,
                owner,
                partitions.c.attempt == attempt,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )

    def select_pending_for_node(self, node_id: str, limit: int) -> Select[Any]:
        """The poll: this node's PENDING rows with what a claim needs, oldest first."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.job_execution_id,
                partitions.c.master_step_execution_id,
                partitions.c.partition_name,
                partitions.c.attempt,
                partitions.c.transferable,
                job_coordination.c.worker_step_name,
            )
            .join(
                job_coordination,
                job_coordination.c.job_execution_id == partitions.c.job_execution_id,
            )
            .where(
                partitions.c.assigned_node == node_id,
                partitions.c.status == PARTITION_PENDING,
            )
            .order_by(partitions.c.step_execution_id)
            .limit(limit)
        )

    def _node_gone(self, node_column: ColumnElement[Any]) -> ColumnElement[bool]:
        """The node is absent from the registry. Orphan detection never depends on the dead
        node's own row still being there."""
        return ~exists().where(nodes.c.node_id == node_column)

    def select_orphaned_partitions(self, master_step_execution_id: int) -> Select[Any]:
        """In-flight partitions of one master step whose node is gone (or that were handed
        back and so have no node)."""
        return (
            select(
                partitions.c.step_execution_id,
                partitions.c.partition_name,
                partitions.c.assigned_node,
                partitions.c.attempt,
                partitions.c.status,
                partitions.c.transferable,
            )
            .where(
                partitions.c.master_step_execution_id == master_step_execution_id,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
                or_(
                    partitions.c.assigned_node.is_(None),
                    self._node_gone(partitions.c.assigned_node),
                ),
            )
            .order_by(partitions.c.step_execution_id)
        )

    def select_partition_counts(self, master_step_execution_id: int) -> Select[Any]:
        from sqlalchemy import func

        return (
            select(partitions.c.status, func.count().label("n"))
            .where(partitions.c.master_step_execution_id == master_step_execution_id)
            .group_by(partitions.c.status)
        )

    def select_in_flight_count(self, job_execution_id: int) -> Select[Any]:
        """How many partitions of a job execution are PENDING or CLAIMED."""
        from sqlalchemy import func

        return select(func.count()).where(
            partitions.c.job_execution_id == job_execution_id,
            partitions.c.status.in_(PARTITION_IN_FLIGHT),
        )

    def select_partitions(self, master_step_execution_id: int) -> Select[Any]:
        return (
            select(partitions)
            .where(partitions.c.master_step_execution_id == master_step_execution_id)
            .order_by(partitions.c.step_execution_id)
        )

    # --- job coordination -----------------------------------------------------------------------

    def insert_coordination(
        self,
        job_execution_id: int,
        master_node: str,
        master_step_execution_id: int,
        worker_step_name: str,
        status: str = COORD_STARTED,
    ) -> Insert:
        return insert(job_coordination).values(
            job_execution_id=job_execution_id,
            master_node=master_node,
            master_step_execution_id=master_step_execution_id,
            worker_step_name=worker_step_name,
            status=status,
            created_time=self.now(),
            updated_time=self.now(),
        )

    def set_coordination_status(
        self,
        job_execution_id: int,
        master_node: str,
        from_statuses: Sequence[str],
        to_status: str,
    ) -> Update:
        """Guarded on the master that owns the row, so a master that lost it changes nothing."""
        return (
            update(job_coordination)
            .where(
                job_coordination.c.job_execution_id == job_execution_id,
                job_coordination.c.master_node == master_node,
                job_coordination.c.status.in_(list(from_statuses)),
            )
            .values(status=to_status, updated_time=self.now())
        )

    def restart_coordination(
        self,
        job_execution_id: int,
        master_node: str,
        master_step_execution_id: int,
        worker_step_name: str,
    ) -> Update:
        """Point this master's existing coordination row at the job's next partitioned step."""
        return (
            update(job_coordination)
            .where(
                job_coordination.c.job_execution_id == job_execution_id,
                job_coordination.c.master_node == master_node,
                job_coordination.c.status.in_(COORD_IN_FLIGHT),
            )
            .values(
                master_step_execution_id=master_step_execution_id,
                worker_step_name=worker_step_name,
                status=COORD_STARTED,
                updated_time=self.now(),
            )
        )

    def fail_job_partitions(self, job_execution_id: int) -> Update:
        """Every in-flight partition of a job execution: FAILED (its master was lost). A worker
        still running one then finds its guard broken and commits nothing more."""
        return (
            update(partitions)
            .where(
                partitions.c.job_execution_id == job_execution_id,
                partitions.c.status.in_(PARTITION_IN_FLIGHT),
            )
            .values(status=PARTITION_FAILED, last_updated=self.now())
        )

    def partition_guard(
        self, step_execution_id: int, node_id: str, attempt: int
    ) -> ColumnElement[bool]:
        """True while this node still holds this attempt of the partition, CLAIMED, and is still
        registered. Added to every step-execution write of a running partition, it fences the
        chunk transaction: a node removed from the registry commits nothing more, even before
        it notices its removal and before a master has reassigned the partition."""
        return and_(
            exists().where(self._guarded(step_execution_id, node_id, attempt, [PARTITION_CLAIMED])),
            exists().where(nodes.c.node_id == node_id),
        )

    def select_stranded_masters(self) -> Select[Any]:
        """Coordination rows in flight whose master node is gone from the registry."""
        return self._select_coordination(
            job_coordination.c.status.in_(COORD_IN_FLIGHT),
            self._node_gone(job_coordination.c.master_node),
        )

    def select_recovering_owned_by(self, node_id: str) -> Select[Any]:
        """Recoveries this node claimed but did not finish (it is alive, so no one else will)."""
        return self._select_coordination(
            job_coordination.c.status == COORD_RECOVERING,
            job_coordination.c.master_node == node_id,
        )

    @staticmethod
    def _select_coordination(*where: ColumnElement[bool]) -> Select[Any]:
        return (
            select(
                job_coordination.c.job_execution_id,
                job_coordination.c.master_node,
                job_coordination.c.master_step_execution_id,
                job_coordination.c.status,
            )
            .where(*where)
            .order_by(job_coordination.c.job_execution_id)
        )

    def claim_stranded_master(
        self, job_execution_id: int, lost_master: str, status: str, new_owner: str
    ) -> Update:
        """Exactly one survivor wins: the row still names the lost master with the status read."""
        return (
            update(job_coordination)
            .where(
                job_coordination.c.job_execution_id == job_execution_id,
                job_coordination.c.master_node == lost_master,
                job_coordination.c.status == status,
            )
            .values(status=COORD_RECOVERING, master_node=new_owner, updated_time=self.now())
        )

    # --- helpers for subclasses -----------------------------------------------------------------

    @staticmethod
    def _clock(sql: str) -> ColumnElement[datetime]:
        """A constant clock expression (no user data in it) typed as a timestamp."""
        return literal_column(sql, type_=DateTime())


#: Kinds :meth:`QueryProvider.column_type` is asked about.
COLUMN_KINDS = ("timestamp", "long_text", "id")
