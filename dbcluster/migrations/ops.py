"""The operations a revision's ``upgrade(op)`` calls: dialect-neutral, compiled per database.

SQL comes from SQLAlchemy's DDL constructs compiled by the database's dialect; what they cannot
say (adding, renaming or retyping a column, dropping an unnamed primary key) comes from the
provider's migration hooks. Online, every operation first checks whether it is already done (a
table, column or index that exists is left alone), so a revision cut short on a database whose
DDL commits on its own (MySQL, MariaDB, Oracle) completes when ``dbcluster migrate`` runs again;
where the provider can, each statement also checks for itself
(:meth:`~dbcluster.dialects.base.QueryProvider.unless_present`), which keeps a DBA's script
re-runnable too. Offline (``--sql``) every statement is collected instead, for a DBA to run.

What must wait until the revision has committed (Db2 reorganizing a retyped table) is collected
in :attr:`Operations.after_commit`, run each in a transaction of its own after the revision's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Connection, Index, MetaData, PrimaryKeyConstraint, Table, inspect
from sqlalchemy.schema import (
    AddConstraint,
    CreateIndex,
    CreateTable,
    DropConstraint,
    DropIndex,
    UniqueConstraint,
)
from sqlalchemy.types import NullType

from dbcluster.dialects.base import QueryProvider
from dbcluster.migrations.baseline import Baseline, Key


class Operations:
    """Runs (``conn`` given) or collects (``conn`` None) one revision's statements."""

    def __init__(self, provider: QueryProvider, conn: Connection | None) -> None:
        self.provider = provider
        self.dialect = provider.dialect
        self.conn = conn
        #: Every statement issued (online) or to issue (offline), in order.
        self.statements: list[str] = []
        #: Statements to run once the revision has committed, each in a transaction of its own.
        self.after_commit: list[str] = []

    # --- running --------------------------------------------------------------------------------

    def execute(self, statement: Any) -> None:
        """Run (or collect) a statement: SQL text or a SQLAlchemy construct."""
        sql = self._sql(statement)
        self.statements.append(sql)
        if self.conn is not None:
            self.conn.exec_driver_sql(sql)

    def _inspect(self) -> Any:
        # A fresh inspector each time: its answers are cached and DDL changes them.
        return inspect(self.conn)

    def has_table(self, name: str) -> bool:
        """Whether the table exists (offline: never, so every statement is printed)."""
        return self.conn is not None and self._inspect().has_table(name)

    def has_column(self, table: str, column: str) -> bool:
        if self.conn is None:
            return False
        return column.lower() in {c["name"].lower() for c in self._inspect().get_columns(table)}

    def has_index(self, table: str, name: str) -> bool:
        if self.conn is None:
            return False
        found = {str(i["name"]).lower() for i in self._inspect().get_indexes(table) if i["name"]}
        return name.lower() in found

    # --- operations -----------------------------------------------------------------------------

    def _sql(self, statement: Any) -> str:
        return statement if isinstance(statement, str) else self.provider.literal_sql(statement)

    def create_table(self, table: Table) -> None:
        """Create a table and its indexes."""
        if not self.has_table(table.name):
            sql = self._sql(CreateTable(table))
            for guarded in self.provider.unless_present("table", table.name, None, [sql]):
                self.execute(guarded)
        for index in sorted(table.indexes, key=lambda i: i.name or ""):
            self.create_index(index)

    def create_index(self, index: Index) -> None:
        if index.table is None or index.name is None:
            raise ValueError("a migration's index needs a name and a table")
        table, name = index.table.name, str(index.name)
        if not self.has_index(table, name):
            sql = self._sql(CreateIndex(index))
            for guarded in self.provider.unless_present("index", table, name, [sql]):
                self.execute(guarded)

    def add_column(self, table: str, column: Column[Any]) -> None:
        """Add a column. A NOT NULL column needs a ``server_default`` for the rows already there
        (SQLite, and every database with rows, refuse it otherwise); it stays the column's
        default."""
        if not column.nullable and column.server_default is None:
            raise ValueError(f"{table}.{column.name} is NOT NULL: give it a server_default")
        if self.has_column(table, column.name):
            return
        Table(table, MetaData(), column)  # the compiler renders a column of a table
        spec = self.dialect.ddl_compiler(self.dialect, None).get_column_specification(column)
        added = self.provider.add_column_sql(table, spec)
        for sql in self.provider.unless_present("column", table, column.name, added):
            self.execute(sql)

    def respell_columns(self, table: Table, old: Baseline) -> None:
        """Rename the columns of ``table`` whose name this dialect now writes otherwise than
        ``old`` did (Db2: the reserved ``version``, quoted ``"version"`` by 0.1.0, is now
        ``"VERSION"``, the column an unquoted ``VERSION`` names). The rest are left alone."""
        for column in table.columns:
            written = old.column_names.get((table.name, column.name))
            now = self.provider.quote(column.name)
            if written is not None and written != now:
                for sql in self.provider.rename_column_sql(table.name, written, now):
                    self.execute(sql)

    def retype_columns(self, table: Table, names: list[str], old: Baseline) -> None:
        """Give ``names`` of ``table`` the types ``table`` declares, where this database renders
        them differently from ``old`` (the schema they come from); the rest are left alone.

        Where the database cannot alter a column an index or key covers
        (:attr:`~dbcluster.dialects.base.QueryProvider.alter_type_keeps_indexes` false), those of
        ``old`` are dropped first and created again after."""
        changes = []
        for name in names:
            column = table.c[name]
            new_type = self.dialect.type_compiler_instance.process(column.type)
            old_type = old.column_types[(table.name, name)]
            if new_type != old_type:
                changes.append((name, old_type, new_type, bool(column.nullable)))
        if not changes:
            return
        keys: list[Key] = []
        if not self.provider.alter_type_keeps_indexes:
            keys = old.keys_on(table.name, {name for name, *_ in changes})
            for key in keys:
                self._drop_key(key)
        for name, old_type, new_type, nullable in changes:
            for sql in self.provider.alter_column_type_sql(
                table.name, name, old_type, new_type, nullable
            ):
                self.execute(sql)
        for key in keys:
            self._create_key(key)
        for sql in self.provider.after_alter_sql(table.name):
            if sql not in self.after_commit:
                self.after_commit.append(sql)

    # --- keys around a retype -------------------------------------------------------------------

    @staticmethod
    def _key_table(key: Key) -> tuple[Table, Any]:
        """A stand-in table holding just the key's columns, and the key as a construct."""
        table = Table(key.table, MetaData(), *(Column(c, NullType()) for c in key.columns))
        if key.kind == "index":
            return table, Index(key.name, *(table.c[c] for c in key.columns))
        if key.kind == "unique":
            return table, UniqueConstraint(*key.columns, name=key.name)
        return table, PrimaryKeyConstraint(*key.columns, name=key.name)

    def _drop_key(self, key: Key) -> None:
        table, construct = self._key_table(key)
        if key.kind == "index":
            self.execute(DropIndex(construct))
        elif key.kind == "primary":
            for sql in self.provider.drop_primary_key_sql(key.table, key.name):
                self.execute(sql)
        else:
            table.append_constraint(construct)
            self.execute(DropConstraint(construct))

    def _create_key(self, key: Key) -> None:
        table, construct = self._key_table(key)
        if key.kind == "index":
            self.execute(CreateIndex(construct))
        else:
            table.append_constraint(construct)
            self.execute(AddConstraint(construct))
