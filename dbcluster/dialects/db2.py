"""Db2 (LUW). The clock is ``CURRENT TIMESTAMP - CURRENT TIMEZONE`` (two words each, and a
TIMESTAMP(6) by default); staleness shifts it with ``ADD_SECONDS``, which takes fractional
seconds. SQLAlchemy names this dialect ``ibm_db_sa``.

In a Unicode database (the default) ``VARCHAR(n)`` counts bytes, so clipped text is measured in
UTF-8 bytes; text compares byte for byte under the default ``IDENTITY`` collation. Serialized
contexts are ``CLOB(1G)``: a bare ``CLOB`` holds 1 MB, and 1 GB is the largest LOB Db2 logs (a
longer one must be ``NOT LOGGED``, which crash recovery could not restore).

Two things ``ibm_db_sa`` (0.4.4, the newest) gets wrong are mended on every dialect this provider
serves (:meth:`Db2Provider.fit_dialect`), not for the whole process: it cannot compile a locking
read at all under SQLAlchemy 2 (it reads ``select.for_update``, which SQLAlchemy 2 removed), and
it quotes a reserved word as written, so the ``version`` columns were ``"version"`` in lower case,
a name no unquoted ``SELECT VERSION`` finds. Here a locking read is ``FOR UPDATE`` (``SKIP LOCKED
DATA`` where asked: claimers pass over each other's rows), and a reserved lower-case name is quoted
as Db2 folds it (``"VERSION"``).
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

from sqlalchemy import CLOB, Engine, Numeric, bindparam, cast, func
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import IdentifierPreparer, SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from dbcluster.dialects.base import QueryProvider, SessionLimits

#: Deadlock or lock timeout rollback (-911, reason 2 or 68), statement-level deadlock or timeout
#: (-913), transaction rolled back by a system error such as an HADR takeover (-1229, SQLSTATE
#: 40504), communication error (-30081, e.g. the connection refused), client reroute (-30108),
#: connection lost or agent not started (-1224, -30080).
_TRANSIENT_SQLCODES = {-911, -913, -1229, -30081, -30108, -1224, -30080}
_TRANSIENT_SQLSTATES = {"40001", "40504", "08001"}
#: ibm_db puts both in its message: "... SQLSTATE=40001 SQLCODE=-911"; the CLI prefix "SQL0911N"
#: carries the code too.
_SQLCODE = re.compile(r"SQLCODE=(-?\d+)|SQL(\d{4,5})N")
_SQLSTATE = re.compile(r"SQLSTATE=(\w{5})")
#: SQL1773N: the statement needs what a read-enabled HADR standby does not do (reason 5: a
#: write; reason 1: an isolation level above UR): the server reached is a standby, as a primary
#: is after a switchover (IBM, "Reads on standby restrictions").
_READ_ONLY_SQLCODES = {-1773}
#: Serialized execution contexts: the largest LOB Db2 logs.
_CLOB_BYTES = 1024**3


def _db2_classes() -> tuple[type[SQLCompiler], type[IdentifierPreparer]] | None:
    """ibm_db_sa's compiler and identifier preparer for Db2 LUW (None without ibm_db_sa)."""
    try:
        from ibm_db_sa.base import DB2Compiler, DB2IdentifierPreparer
    except ImportError:
        return None
    return DB2Compiler, DB2IdentifierPreparer


def _locking_compiler(base: type[SQLCompiler]) -> type[SQLCompiler]:
    class Db2LockingCompiler(base):  # type: ignore[misc, valid-type]
        """ibm_db_sa's compiler, with Db2's own clauses for a locking read."""

        def for_update_clause(self, select: Any, **kw: Any) -> str:
            lock = select._for_update_arg
            if lock.key_share and not lock.read:
                raise CompileError("Db2 has no FOR NO KEY UPDATE")
            if lock.read:
                # Db2 has no FOR SHARE: read stability, keeping share locks on what it read.
                clause = " WITH RS USE AND KEEP SHARE LOCKS"
            else:
                clause = " FOR UPDATE"
                if lock.of:
                    names = (self.preparer.quote(getattr(c, "name", str(c))) for c in lock.of)
                    clause += " OF " + ", ".join(names)
            if lock.skip_locked:
                # Under CS or RS (the default CS): rows another transaction holds are passed over.
                clause += " SKIP LOCKED DATA"
            elif lock.nowait:
                clause += " NOWAIT"  # Db2 11.5.6 and later
            return clause

    return Db2LockingCompiler


def _folding_preparer(base: type[IdentifierPreparer]) -> type[IdentifierPreparer]:
    class Db2FoldingPreparer(base):  # type: ignore[misc, valid-type]
        """Quotes a lower-case name that is a reserved word as Db2 folds an unquoted one
        (``version`` -> ``"VERSION"``): the column is then the one a DBA's ``SELECT VERSION``
        names."""

        def quote(self, ident: str) -> str:
            if (
                getattr(ident, "quote", None) is None
                and ident == ident.lower()
                and ident.lower() in self.reserved_words
                and ident[:1] not in self.illegal_initial_characters
                and self.legal_characters.match(ident)
            ):
                return self.quote_identifier(ident.upper())
            return super().quote(ident)

    return Db2FoldingPreparer


@functools.cache
def _mended() -> tuple[type[SQLCompiler], type[IdentifierPreparer]] | None:
    found = _db2_classes()
    if found is None:
        return None
    compiler, preparer = found
    return _locking_compiler(compiler), _folding_preparer(preparer)


class _SizedClob(CLOB):
    """A CLOB that keeps its length in the DDL (ibm_db_sa renders a bare ``CLOB``: 1 MB)."""

    cache_ok = True


@compiles(_SizedClob, "ibm_db_sa")
def _render_sized_clob(type_: _SizedClob, compiler: Any, **kw: Any) -> str:
    return f"CLOB({type_.length})"


class Db2Provider(QueryProvider):
    name = "db2"
    sqlalchemy_names = ("ibm_db_sa", "db2")
    example_url = "db2+ibm_db://"
    default_port = 50000
    can_create_database = False
    drivers: ClassVar[dict[str, str]] = {"ibm_db": "db2", "ibm_db_dbi": "db2"}
    min_server_version = (11, 5)

    text_length_unit = "byte"
    #: ibm_db_sa has no AUTOCOMMIT isolation level: single statements run in short transactions.
    supports_autocommit = False
    #: ``SELECT ... FOR UPDATE SKIP LOCKED DATA`` (Db2 9.7 and later, under CS or RS).
    supports_skip_locked = True

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        self.fit_dialect(dialect)

    @staticmethod
    def fit_dialect(dialect: Dialect) -> None:
        """Give ``dialect`` (an ibm_db_sa dialect for Db2 LUW) the compiler that renders a
        locking read and the identifier preparer that quotes reserved names as Db2 folds them
        (see the module's doc). A dialect of another kind is left as it is."""
        mended = _mended()
        if mended is None:
            return
        compiler, preparer = mended
        original_compiler, original_preparer = _db2_classes()  # type: ignore[misc]
        # Only ibm_db_sa's own classes are replaced: a dialect that brings its own is its own.
        if dialect.statement_compiler is original_compiler:
            dialect.statement_compiler = compiler
        if type(dialect.identifier_preparer) is original_preparer:
            dialect.identifier_preparer = preparer(dialect)

    def configure_engine(
        self, engine: Engine, *, coordination: bool = False, autocommit: bool = False
    ) -> None:
        super().configure_engine(engine, coordination=coordination, autocommit=autocommit)
        self.fit_dialect(engine.dialect)

    def after_alter_sql(self, table: str) -> list[str]:
        """A table whose columns a revision retyped is reorganized once that revision's ALTERs
        committed (SET DATA TYPE, other than a longer VARCHAR, is a REORG-recommended change):
        REORG cannot run in the transaction of an uncommitted ALTER of its table, and
        a table left with REORG-recommended changes refuses more of them (and, after three,
        access) until it is."""
        return [f"CALL SYSPROC.ADMIN_CMD('REORG TABLE {table}')"]

    @classmethod
    def offline_dialect(
        cls, dialect_class: type[Dialect], server_version: tuple[int, ...] | None = None
    ) -> Dialect:
        # ibm_db_sa decides some DDL from the server it is connected to; compile for Db2 LUW.
        dialect = super().offline_dialect(dialect_class, server_version)
        dialect.dbms_name = "DB2/LINUXX8664"
        dialect.dbms_ver = "{:02}.{:02}.0900".format(*(dialect.server_version_info + (0,))[:2])
        return dialect

    @classmethod
    def column_type(cls, kind: str) -> TypeEngine[Any] | None:
        if kind == "long_text":
            return _SizedClob(_CLOB_BYTES)
        return None

    def now(self) -> ColumnElement[Any]:
        return self._clock("(CURRENT TIMESTAMP - CURRENT TIMEZONE)")

    def older_than(self, column: ColumnElement[Any], ms: int) -> ColumnElement[bool]:
        # A parameter marker inside a function's arguments has no type the server can infer
        # (SQL0418N at prepare time): cast it.
        shift = bindparam(None, -ms / 1000, type_=Numeric(18, 3), unique=True)
        return column < func.add_seconds(self.now(), cast(shift, Numeric(18, 3)))

    def _is_transient_driver_error(self, orig: BaseException | None) -> bool:
        message = str(orig or "")
        if _sqlcodes(message) & _TRANSIENT_SQLCODES:
            return True
        return any(m.group(1) in _TRANSIENT_SQLSTATES for m in _SQLSTATE.finditer(message))

    def _is_read_only_driver_error(self, orig: BaseException | None) -> bool:
        return bool(_sqlcodes(str(orig or "")) & _READ_ONLY_SQLCODES)

    def session_statements(self, limits: SessionLimits) -> list[str]:
        """``CURRENT LOCK TIMEOUT`` (whole seconds) bounds every lock wait of the session
        (SQL0911N reason 68, transient). Db2 has no per-session idle-in-transaction timeout; a
        DBA bounds idle connections with a WLM threshold (``CONNECTIONIDLETIME``)."""
        return [f"SET CURRENT LOCK TIMEOUT = {max(1, -(-int(limits.lock_timeout_ms) // 1000))}"]


def _sqlcodes(message: str) -> set[int]:
    """The SQLCODEs an ibm_db message names ("... SQLSTATE=40001 SQLCODE=-911", "SQL0911N")."""
    return {int(m.group(1)) if m.group(1) else -int(m.group(2)) for m in _SQLCODE.finditer(message)}
