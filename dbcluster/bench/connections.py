"""The connections of ``bench ceiling``'s simulated nodes: one each, on engines they all share.

A real node builds its coordination statements once and SQLAlchemy compiles each once per
engine: a few milliseconds of CPU, once per process. A thousand simulated nodes in one
load-generator process, each with engines and a store of its own, would build and compile
everything a thousand times over, and that compiling, not the database, would set how many nodes
the generator can drive (it took most of the generator's CPU at 2,000 nodes). So the nodes of a
process share their engines and :class:`~dbcluster.cluster.store.CoordinationStore`, whose
statements take the node's id as a bound parameter, and :class:`NodePool` hands each node a
connection of its own: the database still sees one session per node, as from real nodes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import ConnectionPoolEntry, Pool

from dbcluster.cluster.settings import ClusterSettings
from dbcluster.cluster.store import CoordinationStore
from dbcluster.dialects import make_engine, provider_for_url
from dbcluster.dialects.base import SessionLimits

#: The simulated node this thread runs a call of (see :func:`as_node`).
_CURRENT: ContextVar[int | None] = ContextVar("dbcluster_simulated_node", default=None)


@contextmanager
def as_node(index: int) -> Iterator[None]:
    """The statements this thread sends meanwhile go over node ``index``'s own connection."""
    token = _CURRENT.set(index)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class NodePool(Pool):
    """One connection per simulated node (the node :func:`as_node` names), kept for the node's
    life. A node has one call running at a time, so its connection is never out twice; a
    second checkout while it is out is a bug in the generator and raises."""

    def __init__(self, creator: Any, **kw: Any) -> None:
        super().__init__(creator, **kw)
        self._records: dict[int, ConnectionPoolEntry] = {}
        self._owners: dict[int, int] = {}  # id(record) -> node
        self._out: set[int] = set()
        #: Nodes released while their connection was out: it closes as it comes back.
        self._closing: set[int] = set()
        self._lock = threading.Lock()

    def recreate(self) -> NodePool:
        return self.__class__(
            self._creator,
            recycle=self._recycle,
            echo=self.echo,
            pre_ping=self._pre_ping,
            logging_name=self._orig_logging_name,
            reset_on_return=self._reset_on_return,
            _dispatch=self.dispatch,
            dialect=self._dialect,
        )

    def status(self) -> str:
        return f"NodePool id:{id(self)} connections: {len(self._records)} out: {len(self._out)}"

    def _do_get(self) -> ConnectionPoolEntry:
        node = _CURRENT.get()
        if node is None:
            raise RuntimeError("a simulated node's statement ran outside as_node()")
        with self._lock:
            if node in self._out:
                raise RuntimeError(f"simulated node {node} checked its connection out twice")
            self._out.add(node)
            record = self._records.get(node)
        if record is None:
            try:
                record = self._create_connection()
            except BaseException:
                with self._lock:
                    self._out.discard(node)
                raise
            with self._lock:
                self._records[node] = record
                self._owners[id(record)] = node
        return record

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        with self._lock:
            node = self._owners.get(id(record))
            if node is None:
                return
            self._out.discard(node)
            if node not in self._closing:
                return
        self.release(node)

    def release(self, node: int) -> None:
        """Close node ``node``'s connection (the node is done); one still out (a call left
        running as the generator stops) closes as it comes back."""
        with self._lock:
            if node in self._out:
                self._closing.add(node)
                return
            self._closing.discard(node)
            record = self._records.pop(node, None)
            if record is not None:
                self._owners.pop(id(record), None)
        if record is not None:
            record.close()

    def dispose(self) -> None:
        with self._lock:
            records = list(self._records.values())
            self._records.clear()
            self._owners.clear()
        for record in records:
            record.close()


class NodeEngines:
    """The engines and stores the simulated nodes of one process share (see the module doc):
    an autocommit engine for single statements, where the database has one, and a
    transactional one, each giving every node a connection of its own. ``plain``: connections
    without session settings and without server-side prepared statements (PostgreSQL through
    PgBouncer in transaction mode carries neither)."""

    def __init__(self, url: str, settings: ClusterSettings, plain: bool = False) -> None:
        self.url = url
        self.plain = plain
        self.limits = (
            None
            if plain
            else SessionLimits(settings.coordination_lock_timeout_ms, settings.idle_transaction_ms)
        )
        self._lock = threading.Lock()
        self._engines: dict[bool, Engine] = {}
        self._stores: dict[bool, CoordinationStore] = {}

    def store(self, maintains: bool) -> CoordinationStore:
        """The store of a node that sweeps (``maintains``: single statements on the autocommit
        engine, transactions on the transactional one) or of one that does not (everything on
        the autocommit engine, where the database has one)."""
        with self._lock:
            store = self._stores.get(maintains)
            if store is None:
                auto = None
                if provider_for_url(self.url).supports_autocommit:
                    auto = self._engine(autocommit=True)
                coordination = auto if auto is not None and not maintains else None
                if coordination is None:
                    coordination = self._engine(autocommit=False)
                store = self._stores[maintains] = CoordinationStore(coordination, autocommit=auto)
            return store

    def _engine(self, *, autocommit: bool) -> Engine:
        engine = self._engines.get(autocommit)
        if engine is not None:
            return engine
        engine = make_engine(
            self.url,
            coordination=True,
            limits=self.limits,
            autocommit=autocommit,
            ping=False,
            poolclass=NodePool,
        )
        if self.plain:

            @event.listens_for(engine, "connect")
            def _unprepared(dbapi_connection: Any, record: Any) -> None:
                if hasattr(dbapi_connection, "prepare_threshold"):  # psycopg
                    dbapi_connection.prepare_threshold = None

        self._engines[autocommit] = engine
        return engine

    def release(self, node: int) -> None:
        """Close node ``node``'s connections."""
        with self._lock:
            engines = list(self._engines.values())
        for engine in engines:
            pool = engine.pool
            if isinstance(pool, NodePool):
                pool.release(node)

    def dispose(self) -> None:
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
            self._stores.clear()
        for engine in engines:
            engine.dispose()
