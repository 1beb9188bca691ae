"""Schema versions and migrations (``dbcluster migrate``).

The database records its schema's revision in ``batch_schema_version`` (one row). Revisions live
one per file in :mod:`dbcluster.migrations.versions`, linked by ``revision`` and ``down_revision``
(Alembic's shape); 0001 is the released 0.1.0 schema, which had no version table: a database with
the 0.1.0 tables and no version row is at 0001.

:func:`upgrade` applies the revisions a database lacks, each in one transaction where the
database's DDL is transactional (``QueryProvider.transactional_ddl``), and records each;
:func:`upgrade_sql` prints the same statements for a DBA without connecting.
:func:`require_current_schema` is the check a node makes once at start: one read of the version
row. The SQL of each revision for each database is checked in as
``schemas/migrations/<revision>.<database>.sql`` (a test keeps it current).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from types import ModuleType

from sqlalchemy import Connection, Engine, inspect, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from dbcluster import schema
from dbcluster.dialects import get_provider, safe_url
from dbcluster.dialects.base import QueryProvider
from dbcluster.dialects.ddl import SCHEMA_RETRY
from dbcluster.errors import SchemaMissingError, SchemaVersionError
from dbcluster.migrations import versions
from dbcluster.migrations.baseline import TABLES_0_1_0
from dbcluster.migrations.ops import Operations

__all__ = [
    "HEAD",
    "Revision",
    "current_version",
    "init",
    "record_if_unrecorded",
    "require_current_schema",
    "revisions",
    "upgrade",
    "upgrade_sql",
]


@dataclass(frozen=True)
class Revision:
    revision: str
    down_revision: str | None
    #: The dbcluster release whose schema this revision makes.
    release: str
    doc: str
    upgrade: Callable[[Operations], None]

    @property
    def title(self) -> str:
        return self.doc.strip().splitlines()[0] if self.doc.strip() else self.revision


def _load(module: ModuleType) -> Revision:
    return Revision(
        module.revision,
        module.down_revision,
        module.release,
        module.__doc__ or "",
        module.upgrade,
    )


@cache
def revisions() -> tuple[Revision, ...]:
    """Every revision, oldest first, checked to form one chain."""
    found = [
        _load(importlib.import_module(f"{versions.__name__}.{info.name}"))
        for info in pkgutil.iter_modules(versions.__path__)
        if info.name.startswith("r")
    ]
    by_parent = {r.down_revision: r for r in found}
    if len(by_parent) != len(found):
        raise RuntimeError("two migration revisions share a down_revision: the chain forks")
    chain: list[Revision] = []
    parent: str | None = None
    while parent in by_parent:
        chain.append(by_parent[parent])
        parent = chain[-1].revision
    if len(chain) != len(found):
        raise RuntimeError("a migration revision is not linked into the chain from 0001")
    return tuple(chain)


#: The newest revision: the schema ``schema.py`` declares (a test checks they agree).
HEAD = schema.SCHEMA_VERSION


def _known() -> list[str]:
    return [r.revision for r in revisions()]


def current_version(conn: Connection) -> str | None:
    """The database's schema revision; None when it has no dbcluster tables.

    A version row says. Without one, the tables tell: all of 0.1.0's and no
    ``batch_job_masters`` (0.2.0's) is 0001, the schema 0.1.0 made, which had no version table;
    anything else is the current layout, its version not yet recorded (an ``init`` cut short or
    still running in another process: ``dbcluster init`` completes it)."""
    inspector = inspect(conn)
    present = {name.lower() for name in inspector.get_table_names()}
    if schema.schema_version.name in present:
        row = conn.execute(select(schema.schema_version.c.version_num)).scalar()
        if row is not None:
            return str(row)
        return HEAD  # 0.1.0 had no version table
    if not present & {t.name for t in schema.ALL_TABLES}:
        return None
    if set(TABLES_0_1_0) <= present and schema.job_masters.name not in present:
        return "0001"
    return HEAD


def init(engine: Engine) -> tuple[list[str], list[str]]:
    """What ``dbcluster init`` does: create the dbcluster tables (and indexes) that are missing
    and record the schema's version; (the tables, the indexes) it created. Safe to repeat and
    to run from several processes at once. On an older schema it raises, saying to migrate."""
    with engine.connect() as conn:
        version = current_version(conn)
    if version not in (None, HEAD):
        require_current_schema(engine)  # says to migrate or to upgrade
    made = get_provider(engine).create_schema(engine)
    record_if_unrecorded(engine)  # an init cut short made the tables only
    return made


def record_if_unrecorded(engine: Engine) -> None:
    """Record the current version where the current tables exist without it (after
    ``create_schema``), in a transaction of its own: never in one that ran DDL. Several
    processes may run it at once: the key keeps one row, and a transient error (SQLite's "database
    is locked" when a read upgrades to a write another process made first) is tried again."""
    provider = get_provider(engine)

    def record() -> None:
        try:
            with engine.begin() as conn:
                if not _has_row(conn):
                    conn.execute(provider.record_schema_version(HEAD))
        except IntegrityError:
            pass  # another process recorded it first

    retry = replace(SCHEMA_RETRY, retry_on=provider.is_transient)
    retry.call(record, "recording the schema version")


def _pending(version: str, where: str) -> list[Revision]:
    known = _known()
    if version not in known:
        raise SchemaVersionError(
            f"the database {where} has dbcluster schema {version}, newer than this dbcluster "
            f"knows ({HEAD}): upgrade dbcluster"
        )
    return list(revisions()[known.index(version) + 1 :])


def _record(op: Operations, version: str, had_row: bool) -> None:
    table = schema.schema_version
    if had_row:
        op.execute(update(table).values(version_num=version, applied_time=op.provider.now()))
    else:
        op.execute(op.provider.record_schema_version(version))


def _has_row(conn: Connection) -> bool:
    if not inspect(conn).has_table(schema.schema_version.name):
        return False
    return conn.execute(select(schema.schema_version.c.version_num)).first() is not None


#: A node that heartbeated this recently counts as running (``migrate`` refuses without --force).
LIVE_NODE_MS = 60_000


def upgrade(engine: Engine, *, to: str = HEAD, force: bool = False) -> list[Revision]:
    """Apply the revisions the database lacks, up to ``to``; returns those applied (none on a
    current database).

    Refuses while a node heartbeated in the last minute (unless ``force``): a node of the older
    release does not know the new columns, a table rebuilt under it (MySQL, MariaDB) blocks it,
    and one of this release refuses the old schema anyway. Stop the cluster first."""
    provider = get_provider(engine)
    where = safe_url(engine.url)
    with engine.connect() as conn:
        version = current_version(conn)
        had_row = _has_row(conn)
        live = (
            conn.execute(provider.count_live_nodes(LIVE_NODE_MS)).scalar()
            if version not in (None, HEAD) and not force
            else 0
        )
    if version is None:
        raise SchemaMissingError(
            f"the database {where} has no dbcluster tables; run `dbcluster init` to create them"
        )
    if version == HEAD and not had_row:
        raise SchemaVersionError(
            f"the database {where} has this dbcluster's tables without a recorded version; run "
            "`dbcluster init` with the same --url (it creates what is missing and records it)"
        )
    pending = _pending(version, where)
    if live:
        raise SchemaVersionError(
            f"{live} dbcluster node(s) of the database {where} heartbeated in the last "
            f"{LIVE_NODE_MS // 1000} s: stop every node before migrating (or pass --force)"
        )
    if to not in _known():
        raise SchemaVersionError(f"there is no schema revision {to!r}")
    pending = [r for r in pending if r.revision <= to]
    applied: list[Revision] = []
    for revision in pending:
        # Transactional DDL: the revision and its version row commit together or not at all.
        # Elsewhere each DDL statement commits on its own; the steps are idempotent.
        with engine.begin() as conn:
            op = Operations(provider, conn)
            revision.upgrade(op)
            _record(op, revision.revision, had_row=_has_row(conn))
        # What cannot share the revision's transaction (Db2's REORG of a retyped table).
        for statement in op.after_commit:
            with engine.begin() as conn:
                conn.exec_driver_sql(statement)
        applied.append(revision)
    return applied


def upgrade_sql(provider: QueryProvider, *, from_version: str = "0001", to: str = HEAD) -> str:
    """The SQL that brings a database at ``from_version`` to ``to``, for a DBA (no connection)."""
    pending = [r for r in _pending(from_version, "given") if r.revision <= to]
    lines = [
        f"-- dbcluster schema migration for {provider.name}: {from_version} -> {to} "
        "(generated by `dbcluster migrate --sql`)",
        "-- Stop every dbcluster node first. "
        + (
            "Run each revision in one transaction (DDL is transactional here)."
            if provider.transactional_ddl
            else "DDL commits statement by statement here: if a revision stops half way, "
            "restore or finish it by hand (or run `dbcluster migrate`, whose steps check "
            "what is already done)."
        ),
    ]
    had_row = from_version >= "0002"
    for revision in pending:
        op = Operations(provider, None)
        revision.upgrade(op)
        _record(op, revision.revision, had_row=had_row)
        had_row = True
        lines.append(f"\n-- revision {revision.revision} ({revision.release}): {revision.title}")
        lines.extend(f"\n{provider.script_line(statement)}" for statement in op.statements)
        if op.after_commit or provider.scripts_commit:
            lines.append(f"\n{provider.script_line('COMMIT')}")
        if op.after_commit:
            lines.append("\n-- once the revision has committed, each on its own:")
            lines.extend(f"\n{provider.script_line(statement)}" for statement in op.after_commit)
    return "\n".join(lines) + "\n"


def require_current_schema(engine: Engine) -> None:
    """Raise unless the database's schema is this dbcluster's: one read of the version row
    (the tables are looked at only when that read fails, to say what to do)."""
    version: str | None
    try:
        with engine.connect() as conn:
            version = conn.execute(select(schema.schema_version.c.version_num)).scalar()
    except DBAPIError:
        version = None
    if version == HEAD:
        return
    where = safe_url(engine.url)
    if version is None:
        with engine.connect() as conn:
            version = current_version(conn)
        if version is None:
            raise SchemaMissingError(
                f"the database {where} has no dbcluster tables; run `dbcluster init` with the "
                "same --url first"
            )
        if version == HEAD:  # the tables are current (or some missing), their version unrecorded
            raise SchemaVersionError(
                f"the database {where} does not record its dbcluster schema version; run "
                "`dbcluster init` with the same --url"
            )
    _pending(version, where)  # a newer schema: says to upgrade dbcluster
    release = next(r.release for r in revisions() if r.revision == version)
    raise SchemaVersionError(
        f"the database {where} has dbcluster schema {version} (dbcluster {release}), this "
        f"dbcluster needs {HEAD}: "
        "run `dbcluster migrate` with the same --url (stop the cluster's nodes first)"
    )
