"""A third-party provider for a database whose new table takes no DML (no INSERT, UPDATE, DELETE
or SELECT) until the transaction that created it has committed, as Firebird's does ("Table
unknown BATCH_SCHEMA_VERSION"). SQLite under ``ddlapart:///path`` stands in for it: the engine
refuses such a statement the way that database would, so any code path of dbcluster that writes
a row in a transaction of DDL fails here (``dbcluster init``, the conformance suite's set-up).
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, ClassVar

from sqlalchemy import Engine, event
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from dbcluster.dialects.sqlite import SQLiteProvider

_CREATED = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?(\w+)", re.I)
_DML = re.compile(r"^\s*(?:WITH\b.*?\b)?(INSERT|UPDATE|DELETE|SELECT|REPLACE)\b", re.I | re.S)
#: The tables created by the transaction still open on a connection.
_KEY = "ddlapart_created"


class DDLApartDialect(SQLiteDialect_pysqlite):
    """SQLAlchemy's dialect for ``ddlapart://`` URLs (it compiles as SQLite does)."""

    name = "ddlapart"
    supports_statement_cache = True


class DDLApartProvider(SQLiteProvider):
    name = "ddlapart"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("ddlapart",)
    example_url = "ddlapart://"
    supports_multiple_processes = True
    network_backend = False
    can_create_database = False

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        super().configure_engine(engine, coordination=coordination, autocommit=autocommit)
        if autocommit:
            return  # every statement commits on its own: nothing is ever pending

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            conn.info[_KEY] = set()

        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _end(conn: Any) -> None:
            conn.info.pop(_KEY, None)

        @event.listens_for(engine, "before_cursor_execute")
        def _refuse(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            created = conn.info.get(_KEY)
            if created is None:
                return
            made = _CREATED.match(statement)
            if made:
                created.add(made.group(1).lower())
                return
            if created and _DML.match(statement):
                touched = {name for name in created if re.search(rf"\b{name}\b", statement, re.I)}
                if touched:
                    raise sqlite3.OperationalError(
                        f"Table unknown {sorted(touched)[0].upper()}: created by this "
                        "transaction, which has not committed"
                    )
