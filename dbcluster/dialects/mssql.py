"""SQL Server. ``DATETIME`` rounds to ~3 ms, so timestamps are ``DATETIME2(6)``; the clock is
``SYSUTCDATETIME()``. Staleness shifts the clock with ``DATEADD`` rather than taking a difference on
the column (``DATEDIFF`` overflows after ~24 days of milliseconds and defeats the index); DATEADD's
number is an ``int`` too, so the shift goes in whole days and the milliseconds left over.

SQLAlchemy's SQL Server compiler drops ``with_for_update()`` without a word: a locking read here
is a table hint, ``WITH (UPDLOCK, ROWLOCK)``, and a claim's ``WITH (UPDLOCK, READPAST, ROWLOCK)``
passes over the rows another claimer holds instead of queueing on them.

Text is ``NVARCHAR`` (``VARCHAR`` under a Latin-1 collation stores other characters as "?") in
the binary collation ``Latin1_General_100_BIN2``, so keys compare case- and accent-sensitively
whatever the database's default collation; ``NVARCHAR(n)`` counts UTF-16 code units."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from sqlalchemy import Integer, Select, bindparam, func, literal_column
from sqlalchemy.dialects import mssql
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider, SessionLimits

#: Error numbers worth repeating: deadlock victim (1205), lock request timeout (1222), snapshot
#: update conflict (3960); Azure SQL's failover family (40197 error processing the request, 40501
#: service busy, 40613 database not currently available); and DB-Library's (pymssql over FreeTDS)
#: lost or refused connection: timeout (20003), read or write failed (20004, 20006), unable to
#: connect (20009), the connection is dead (20047).
_TRANSIENT_NUMBERS = {1205, 1222, 3960, 40197, 40501, 40613, 20003, 20004, 20006, 20009, 20047}
#: Serialization failure, timeout, communication link failure, cannot connect, connection broken.
_TRANSIENT_SQLSTATES = {"40001", "HYT00", "HYT01", "08S01", "08001", "08003", "08004", "08007"}
#: pyodbc ends each diagnostic record with its native error number and the ODBC function, both in
#: parentheses: "[40001] ... Rerun the transaction. (1205) (SQLExecDirectW)" (records joined by
#: "; "). Only that number counts: the message itself may hold others, "The duplicate key value
#: is (20003)." of a 2627.
_NATIVE_NUMBER = re.compile(r"\((-?\d+)\) \(SQL\w*\)")
#: The database is read-only (3906: "Failed to update database ... because the database is
#: read-only"), as an availability group's readable secondary is after a failover moved the
#: primary away.
_READ_ONLY_NUMBERS = {3906}
_DAY_MS = 86_400_000
#: unixODBC's "[01000] ... Can't open lib 'ODBC Driver 18 for SQL Server' : file not found".
_MISSING_ODBC_DRIVER = re.compile(r"Can't open lib '([^']+)'")


class MSSQLProvider(QueryProvider):
    name = "mssql"
    #: ``WITH (UPDLOCK, READPAST, ROWLOCK)``: see :meth:`locked`.
    supports_skip_locked = True
    sqlalchemy_names = ("mssql",)
    example_url = "mssql+pyodbc://"
    default_port = 1433
    drivers: ClassVar[dict[str, str]] = {"pyodbc": "mssql", "pymssql": "mssql-pymssql"}
    system_libraries: ClassVar[dict[str, str]] = {
        "libodbc": "unixODBC (Debian/Ubuntu: apt-get install unixodbc; RHEL: dnf install "
        "unixODBC; macOS: brew install unixodbc) and Microsoft's msodbcsql18 package",
        "odbc32": "Microsoft ODBC Driver 18 for SQL Server",
    }
    min_server_version = (14,)  # SQL Server 2017
    text_collation = "Latin1_General_100_BIN2"
    text_length_unit = "utf16"
    alter_type_keeps_indexes = False

    def add_column_sql(self, table: str, column_spec: str) -> list[str]:
        return [f"ALTER TABLE {self.quote(table)} ADD {column_spec}"]

    def alter_column_type_sql(
        self, table: str, column: str, old_type: str, new_type: str, nullable: bool
    ) -> list[str]:
        null = "NULL" if nullable else "NOT NULL"
        return [
            f"ALTER TABLE {self.quote(table)} ALTER COLUMN {self.quote(column)} {new_type} {null}"
        ]

    def drop_primary_key_sql(self, table: str, name: str | None) -> list[str]:
        if name is not None:
            return [f"ALTER TABLE {self.quote(table)} DROP CONSTRAINT {self.quote(name)}"]
        # An unnamed key got a generated name (PK__batch_no__...): look it up.
        literal = table.replace("'", "''")
        return [
            "DECLARE @pk sysname = (SELECT name FROM sys.key_constraints "
            f"WHERE parent_object_id = OBJECT_ID('{literal}') AND type = 'PK'); "
            f"EXEC('ALTER TABLE {self.quote(table)} DROP CONSTRAINT ' + @pk)"
        ]

    @classmethod
    def text_type(cls, length: int) -> TypeEngine[Any]:
        return mssql.NVARCHAR(length, collation=cls.text_collation)

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "timestamp":
            return mssql.DATETIME2(precision=6)
        if kind == "long_text":
            return mssql.NVARCHAR(None)
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("SYSUTCDATETIME()")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        # DATEADD's number is an int (Msg 8115 past 2,147,483,647: ~24.8 days of milliseconds):
        # whole days first, then the milliseconds left over (each under a day's).
        days, rest = divmod(int(ms), _DAY_MS)
        shifted = self.now()
        if days:
            by_days = bindparam(None, -days, type_=Integer(), unique=True)
            shifted = func.dateadd(literal_column("day"), by_days, shifted)
        if rest or not days:
            by_ms = bindparam(None, -rest, type_=Integer(), unique=True)
            shifted = func.dateadd(literal_column("millisecond"), by_ms, shifted)
        return column < shifted

    def locked(self, stmt: Select[Any], *, skip_locked: bool = False) -> Select[Any]:
        """Update locks on the rows read, held to the end of the transaction (``UPDLOCK``), on
        rows only (``ROWLOCK``); with ``skip_locked``, rows another transaction holds are passed
        over (``READPAST``; it reads the latest committed rows with READ_COMMITTED_SNAPSHOT on
        too, since the update lock is taken on them)."""
        hints = "UPDLOCK, READPAST, ROWLOCK" if skip_locked else "UPDLOCK, ROWLOCK"
        (table,) = stmt.get_final_froms()
        return stmt.with_hint(table, f"WITH ({hints})", dialect_name="mssql")

    def connect_error_hint(self, error: BaseException) -> str | None:
        message = " ".join(str(a) for a in getattr(error, "args", ()))
        if "certificate verify failed" in message:
            return (
                "the server's TLS certificate is not trusted (ODBC Driver 18 encrypts and "
                "verifies by default): add TrustServerCertificate=yes to the URL's query for a "
                "self-signed certificate, or install one your machine trusts"
            )
        missing = _MISSING_ODBC_DRIVER.search(message)
        if missing or "[IM002]" in message:
            name = missing.group(1) if missing else "the ODBC driver named in the URL"
            return (
                f"unixODBC cannot load {name}: install Microsoft's ODBC driver (package "
                "msodbcsql18), or name an installed one in the URL's driver= parameter"
            )
        return None

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        args = getattr(orig, "args", ())
        # pyodbc: (sqlstate, "[sqlstate] [driver][SQL Server]message (number) (function)");
        # pymssql: (number, b"message").
        sqlstate = args[0] if args and isinstance(args[0], str) else None
        return sqlstate in _TRANSIENT_SQLSTATES or bool(_numbers(args) & _TRANSIENT_NUMBERS)

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        return bool(_numbers(getattr(orig, "args", ())) & _READ_ONLY_NUMBERS)

    def session_statements(self, limits: SessionLimits) -> list[str]:
        """``LOCK_TIMEOUT`` bounds every lock wait of the session (error 1222, transient). SQL
        Server has no idle-in-transaction timeout: a frozen session's locks last until its
        connection drops, so a DBA runs the database with READ_COMMITTED_SNAPSHOT (readers do
        not wait) and a job that ends long-idle blocking sessions."""
        return [f"SET LOCK_TIMEOUT {int(limits.lock_timeout_ms)}"]


def _numbers(args: tuple[Any, ...]) -> set[int]:
    """The server's error numbers in a driver error's ``args``: pymssql's (number, message) (its
    connect errors wrap that pair in one tuple); pyodbc's (sqlstate, message), whose diagnostic
    records each end with their native number before the ODBC function's name."""
    if len(args) == 1 and isinstance(args[0], tuple):
        args = args[0]
    if not args:
        return set()
    if isinstance(args[0], int):
        return {args[0]}
    message = " ".join(str(a) for a in args[1:])
    return {int(n) for n in _NATIVE_NUMBER.findall(message)}
