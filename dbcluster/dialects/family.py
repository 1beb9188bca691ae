"""What every statement family of the query provider shares.

:class:`~dbcluster.dialects.base.QueryProvider` is composed of statement families, one module
each (nodes, partitions, claims, coordination, launches, wake-ups, pruning, leases, fast paths,
DDL and migrations, scratch databases), each a mixin that builds the statements of one part of
the cluster from the provider's own hooks (the clock, "older than", the capability flags), which
``base.py`` defines. A provider still overrides one method at a time, whichever family it comes
from: the families are only where each method is written down.

This module is the floor under the families: the hooks several of them build with (the locking
read, "the node is gone", an INSERT that takes its values from a new row), and, for type
checkers, what they read of the provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import Insert, Select, Table, bindparam, exists, insert, literal, select
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import BindParameter, ClauseElement, ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.schema import nodes


def insert_from(table: Table, values: Mapping[str, Any], source: Any | None) -> Insert:
    """An INSERT of one row of ``values``; with ``source`` (a FROM clause of at most one row:
    a statement's CTE), an INSERT ... SELECT of those values from it, which ``values`` may
    take columns of and which writes nothing where ``source`` has no row (a launch's ownership
    rows in the statement that creates the execution, where its instance existed)."""
    if source is None:
        return insert(table).values(**values)
    return insert(table).from_select(
        list(values),
        select(*(_typed(table.c[name].type, value) for name, value in values.items())).select_from(
            source
        ),
    )


def _typed(type_: TypeEngine[Any], value: Any) -> Any:
    """``value`` as a column of a SELECT that fills a column of ``type_``: a constant or an
    untyped bound parameter takes that type (in a SELECT list the server would read an untyped
    parameter as text)."""
    if isinstance(value, BindParameter):
        if value.type._isnull:
            if value.required:
                return bindparam(value.key, type_=type_)
            return literal(value.value, type_=type_)
        return value
    if isinstance(value, ClauseElement):
        return value
    return literal(value, type_=type_)


class StatementFamily:
    """The base of every statement family (see the module's doc)."""

    if TYPE_CHECKING:
        # What the families read of the provider they are composed into; QueryProvider
        # (dialects/base.py) defines each.
        name: ClassVar[str]
        dialect: Dialect
        supports_skip_locked: ClassVar[bool]
        supports_multi_table_update: ClassVar[bool]
        scripts_commit: ClassVar[bool]
        reuses_ids: ClassVar[bool]

        def now(self) -> ColumnElement[datetime]: ...

        def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]: ...

        def is_transient(self, error: BaseException) -> bool: ...

    def skip_locked(self) -> bool:
        """Whether this server has ``SELECT ... FOR UPDATE SKIP LOCKED`` (see
        :attr:`supports_skip_locked`; a subclass may judge by server version)."""
        return self.supports_skip_locked

    def locked(self, stmt: Select[Any], *, skip_locked: bool = False) -> Select[Any]:
        """``stmt``, a read of one table, locking the rows it reads for update until its
        transaction ends; with ``skip_locked`` (only where :meth:`skip_locked`), passing over
        rows another transaction holds instead of waiting for them. SQL's ``FOR UPDATE [SKIP
        LOCKED]`` by default; a database whose dialect says it otherwise overrides this (SQL
        Server: table hints, which SQLAlchemy's ``with_for_update()`` does not render)."""
        return stmt.with_for_update(skip_locked=skip_locked)

    def _node_registered(self, node_id: Any) -> ColumnElement[bool]:
        """The node's own row is in the registry, held (where the database can lock a row a
        subquery reads) until the transaction ends, as a claim holds it: a removal of the node,
        which deletes that row before it moves the node's claimed partitions on, then waits for
        this transaction, or went first and is seen. Portable form: an unlocked read (see
        ``PostgreSQLProvider``'s)."""
        return exists().where(nodes.c.node_id == node_id)

    def _node_gone(self, node_column: ColumnElement[Any]) -> ColumnElement[bool]:
        """The node is absent from the registry. Orphan detection never depends on the dead
        node's own row still being there."""
        return ~exists().where(nodes.c.node_id == node_column)
