"""Runs the provider's statements: short transactions on the coordination engine and single
statements on the autocommit engine, each repeated on transient errors by one
:class:`~dbcluster.retry.Retry`, and the statements themselves built once per store.

Every method of the store is one short transaction on the node's coordination engine, or one
statement on its autocommit engine (a read, a heartbeat: one round trip each, where the
database has an autocommit mode). Statements on the hot paths (heartbeat, poll, claim, a
partition's fence) are built once per store with bound parameters and reused. A guarded
transition whose first try may have committed before the error is re-checked from the row
(``verify``) rather than trusted to a second row count."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from dbcluster.batch.fence import Fence, hold
from dbcluster.dialects import QueryProvider, get_provider
from dbcluster.prebuilt import PrebuiltStatements
from dbcluster.retry import Retry

T = TypeVar("T")


class Connector:
    """The engines, the provider, the retry policy and the prepared statements of one store."""

    def __init__(
        self,
        engine: Engine,
        provider: QueryProvider | None = None,
        *,
        retries: int = 4,
        backoff_s: float = 0.05,
        autocommit: Engine | None = None,
    ) -> None:
        self.engine = engine
        self.provider = provider or get_provider(engine)
        #: Transient errors (as the provider classifies them) are tried ``retries`` times more.
        self.retry = Retry(self.provider.is_transient, attempts=retries + 1, pause_s=backoff_s)
        #: Single statements (reads, heartbeats) run here, each committing on its own; None:
        #: in a transaction of ``engine``.
        self.autocommit = autocommit
        self._prepared: dict[Any, Any] = {}
        #: The launch's statements of those, prebuilt (see :mod:`dbcluster.prebuilt`).
        self._prebuilt = PrebuiltStatements(engine.dialect)

    def execute(self, conn: Connection, stmt: Any) -> int:
        """Run a writing statement with a bounded lock wait; its row count."""
        rowcount = 0
        for part in self.provider.bounded(stmt):
            rowcount = conn.execute(part).rowcount
        return rowcount

    def prepared(self, key: Any, build: Callable[[], Any]) -> Any:
        """The statement ``build()`` makes, built once per store and ``key`` (with bound
        parameters for what varies; SQLAlchemy then reuses its compiled form)."""
        try:
            return self._prepared[key]
        except KeyError:
            stmt = self._prepared[key] = build()  # None too: "this database has none"
            return stmt

    def run(self, conn: Connection, key: Any, build: Callable[[], Any], params: Any) -> int:
        """Run a prepared writing statement (with its bounded lock wait); its row count."""
        rowcount = 0
        for part in self.prepared(("bounded", key), lambda: self.provider.bounded(build())):
            rowcount = conn.execute(part, params).rowcount
        return rowcount

    def write_one(self, key: Any, build: Callable[[], Any], params: Any, what: str) -> int:
        """One prepared writing statement that is harmless to repeat, committed on its own: one
        round trip on the autocommit engine (a transaction where the database has no
        autocommit, or bounds lock waits with a statement of its own); its row count."""
        bounded = self.prepared(("bounded", key), lambda: self.provider.bounded(build()))
        if self.autocommit is None or len(bounded) != 1:
            return self.transaction(lambda conn: self.run(conn, key, build, params), what)
        return self.alone(lambda conn: int(conn.execute(bounded[0], params).rowcount), what)

    def paired(self, key: Any, read: Callable[[], Any], write: Any) -> Any:
        """``read()`` then ``write`` as one request of the autocommit engine (the provider's
        ``read_then_write``, built once per ``key``), where the driver can send them so; else
        None (nothing was built)."""
        engine = self.autocommit
        if engine is None or not self.provider.supports_statement_pairs:
            return None
        return self.prepared(
            key, lambda: self.provider.read_then_write(read(), write, engine.dialect)
        )

    def run_pair(self, pair: Any, params: Any, what: str) -> tuple[Sequence[Any], int]:
        """A pair of :meth:`paired` on the autocommit engine, repeated on transient errors: the
        read's rows and the write's row count."""
        assert self.autocommit is not None
        return self.alone(lambda conn: pair.run(conn, params), what)  # type: ignore[no-any-return]

    def transaction(
        self,
        work: Callable[[Connection], T],
        what: str,
        verify: Callable[[Connection], T | None] | None = None,
        *,
        engine: Engine | None = None,
    ) -> T:
        """Run ``work`` in one transaction, repeating it on transient errors. After an error the
        first try may have committed: ``verify`` (when given) reads the outcome from the rows
        and its non-None answer is returned instead of repeating ``work``. ``engine``: the
        autocommit engine, for a ``work`` that is one statement (it commits on its own)."""
        run = self.retry.start(what)
        while True:
            try:
                if run.attempt > 1 and verify is not None:
                    with self.engine.connect() as conn:
                        found = verify(conn)
                    if found is not None:
                        return found
                if engine is not None:
                    with engine.connect() as conn:
                        return work(conn)
                with self.engine.begin() as conn:
                    return work(conn)
            except Exception as error:
                if not run.again(error):
                    raise

    def rows(self, stmt: Any, what: str, params: Any = None) -> Sequence[Any]:
        """A read: one statement on the autocommit engine (no BEGIN/ROLLBACK), repeated on
        transient errors."""
        return self.alone(lambda conn: conn.execute(stmt, params).all(), what)

    def prepared_rows(self, stmt: Any, what: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """:meth:`rows` of a statement built once (by :meth:`prepared`), run prebuilt where it
        can (see :mod:`dbcluster.prebuilt`): an idle node's poll and heartbeat are most of what
        it costs its process, and SQLAlchemy's lookup of a statement's compiled form cost more
        of the client than the driver did."""
        return self.alone(lambda conn: self._prebuilt.rows(conn, stmt, params), what)

    def alone(self, work: Callable[[Connection], T], what: str) -> T:
        """``work`` (one statement, or one request) on a connection of the autocommit engine,
        where it commits on its own (of the transactional engine where the database has no
        autocommit), repeated on transient errors."""
        engine = self.autocommit or self.engine

        def once() -> T:
            with engine.connect() as conn:
                return work(conn)

        return self.retry.call(once, what)

    def guarded(
        self,
        stmt: Any,
        what: str,
        verify: Callable[[Connection], bool],
        fence: Fence | None = None,
    ) -> bool:
        """A guarded UPDATE (after ``fence``, if any); True when it changed exactly one row."""

        def work(conn: Connection) -> bool:
            hold(fence, conn)
            return self.execute(conn, stmt) == 1

        return self.transaction(work, what, lambda conn: True if verify(conn) else None)
