"""Where a DAO's statements run: in a caller's transaction, in a transaction of their own, or (a
read outside any transaction) on the reader; and how an unclear commit is judged."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Select, select

from dbcluster.batch.dao.statements import INSERT, INSERT_RETURNING
from dbcluster.batch.exceptions import OptimisticLockingFailureError
from dbcluster.batch.transactions import Transactions

F = TypeVar("F", bound=Callable[..., Any])


class Connections:
    """The engine a repository writes with, the reader it reads with outside a transaction (an
    autocommit engine of the same database makes each statement one round trip: no BEGIN, no
    ROLLBACK), and its step and job :class:`Transactions`."""

    def __init__(
        self,
        engine: Engine,
        transactions: Transactions,
        reader: Engine,
        locked: Callable[[Select[Any]], Select[Any]] | None = None,
    ) -> None:
        self.engine = engine
        self.reader = reader
        self.transactions = transactions
        #: A read made a locking read (the provider's ``locked``; as it is where none was
        #: given): what judges an unclear commit, so that it waits for a transaction still
        #: committing the row and reads the latest committed version, never a stale snapshot.
        self.locked: Callable[[Select[Any]], Select[Any]] = locked or _as_is

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
    def read(self, conn: Connection | None) -> Iterator[Connection]:
        """``conn`` itself if given, else a connection of the reader."""
        if conn is not None:
            yield conn
        else:
            with self.reader.connect() as own:
                yield own

    @staticmethod
    def insert_id(conn: Connection, table: Any, values: dict[str, Any]) -> int:
        """Insert a row of ``table`` (a job instance, job execution or step execution) and
        return its new key."""
        if conn.dialect.insert_returning:
            return int(conn.execute(INSERT_RETURNING[table.name], values).scalar_one())
        result = conn.execute(INSERT[table.name], values)
        return int(result.inserted_primary_key[0])


def _as_is(stmt: Select[Any]) -> Select[Any]:
    return stmt


class Dao:
    """A data access object: one kind of record's statements, run on :class:`Connections`."""

    def __init__(self, db: Connections) -> None:
        self.db = db


def retried_read(method: F) -> F:
    """A read method of a :class:`Dao` that, when it runs on its own connection (no ``conn``
    given), is repeated on transient errors under the repository's retry policy. Inside a
    caller's transaction it runs once: the caller's transaction decides."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def read(self: Dao, *args: Any, **kwargs: Any) -> Any:
        if signature.bind(self, *args, **kwargs).arguments.get("conn") is not None:
            return method(self, *args, **kwargs)
        return self.db.transactions.read(lambda: method(self, *args, **kwargs), method.__name__)

    return read  # type: ignore[return-value]


def version_is(
    table: Any,
    key: Any,
    execution_id: int,
    version: int,
    what: str,
    locked: Callable[[Select[Any]], Select[Any]] = _as_is,
) -> Callable[[Connection], bool]:
    """Verifier of an unclear commit: the execution's row (``key`` = ``execution_id`` in
    ``table``) carries ``version``, read by a locking read (``locked``: see
    :attr:`Connections.locked`). A row at any other version than that or the one before was
    written by someone else. The read is built when an unclear commit is judged, not before
    every transaction of every step."""

    def verify(conn: Connection) -> bool:
        read = locked(select(table.c.version).where(key == execution_id))
        return judge_version(conn.execute(read).scalar_one_or_none(), version, what)

    return verify


def judge_version(found: Any, version: int, what: str) -> bool:
    """True where ``found`` is ``version``, False where it is the one before; raises otherwise."""
    if found is not None and int(found) == version:
        return True
    if found is not None and int(found) == version - 1:
        return False
    raise OptimisticLockingFailureError(
        f"{what} is at version {found}, neither {version - 1} nor {version}: someone else wrote it"
    )
