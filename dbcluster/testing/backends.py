"""Live database backends for tests: from a URL in the environment, or from a container.

Each opened backend gets a database of its own (or, where the server cannot create one cheaply,
a clean set of dbcluster tables), so concurrent runs cannot collide. A backend that was named but
cannot be reached is an error; one that was not named is unavailable with its reason.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, delete, inspect
from sqlalchemy.engine import make_url

from dbcluster import schema
from dbcluster.dialects import QueryProvider, get_provider, make_engine, safe_url
from dbcluster.testing.app import ledger_metadata

#: The matrix used when no ``ci/backends.toml`` is at hand (a third party running the suite).
DEFAULT_MATRIX: dict[str, dict[str, str]] = {
    "sqlite": {"env": "DBCLUSTER_TEST_SQLITE_URL"},
    "postgresql": {"env": "DBCLUSTER_TEST_POSTGRESQL_URL", "image": "postgres:16-alpine"},
    "mariadb": {"env": "DBCLUSTER_TEST_MARIADB_URL", "image": "mariadb:11.4"},
    "mysql": {"env": "DBCLUSTER_TEST_MYSQL_URL", "image": "mysql:8.4"},
    "oracle": {"env": "DBCLUSTER_TEST_ORACLE_URL", "image": "gvenzl/oracle-free:23-slim"},
    "mssql": {
        "env": "DBCLUSTER_TEST_MSSQL_URL",
        "image": "mcr.microsoft.com/mssql/server:2022-latest",
    },
    "db2": {"env": "DBCLUSTER_TEST_DB2_URL", "image": "icr.io/db2_community/db2:11.5.9.0"},
}


class BackendUnavailable(Exception):
    """The backend cannot be used; ``named`` says whether the user asked for it."""

    def __init__(self, reason: str, *, named: bool) -> None:
        super().__init__(reason)
        self.named = named


@dataclass(frozen=True)
class BackendSpec:
    name: str
    env: str
    image: str | None = None
    service: str | None = None

    def configured_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        return (environ if environ is not None else os.environ).get(self.env) or None


def load_matrix(path: Path | None = None) -> list[BackendSpec]:
    raw: Mapping[str, Any] = DEFAULT_MATRIX
    if path is not None and path.exists():
        raw = tomllib.loads(path.read_text())
    return [
        BackendSpec(name, entry["env"], entry.get("image"), entry.get("service"))
        for name, entry in raw.items()
    ]


def label_for(spec: BackendSpec, specs: list[BackendSpec]) -> str:
    """The test id: ``mysql-on-mariadb`` when the MySQL provider is pointed at the MariaDB
    server (same host and port), else the backend name."""
    url = spec.configured_url()
    if spec.name != "mysql" or not url:
        return spec.name
    mariadb = next((s for s in specs if s.name == "mariadb"), None)
    other = mariadb.configured_url() if mariadb else None
    if other:
        a, b = make_url(url), make_url(other)
        if (a.host, a.port or 3306) == (b.host, b.port or 3306):
            return "mysql-on-mariadb"
    return spec.name


def _test_tables(engine: Engine) -> list[Table]:
    """The test application's tables that exist here, children first."""
    present = set(inspect(engine).get_table_names())
    return [t for t in reversed(ledger_metadata.sorted_tables) if t.name in present]


def reset_tables(engine: Engine) -> None:
    """Empty every dbcluster table, children first, and the test application's tables with
    them: their rows name job and step execution ids, which later runs may reuse."""
    # The schema version row stays: it describes the tables, not their contents.
    kept = schema.schema_version
    tables = [*_test_tables(engine), *(t for t in reversed(schema.ALL_TABLES) if t is not kept)]
    with engine.begin() as conn:
        for table in tables:
            conn.execute(delete(table))


def create_tables(engine: Engine) -> None:
    """The dbcluster tables as ``dbcluster init`` makes them: the provider's DDL, then the
    version row in a transaction of its own (a database may refuse DML on a table created in the
    still-open transaction, which ``metadata.create_all`` would ask of it)."""
    from dbcluster import migrations

    get_provider(engine).create_schema(engine)
    migrations.record_if_unrecorded(engine)


def drop_tables(engine: Engine) -> None:
    """Drop the dbcluster tables and the test application's tables with them.

    The pool is emptied first: ``drop_all``/``create_all`` ask whether each table exists by
    PRAGMA on SQLite, which a pooled connection answers from the schema it cached when it last
    read, missing DDL another connection made since (a table dropped, or made again)."""
    engine.dispose()
    ledger_metadata.drop_all(engine)
    schema.metadata.drop_all(engine)


@dataclass
class Backend:
    """An isolated, live database with the dbcluster tables in it."""

    name: str
    label: str
    url: str
    engine: Engine
    _cleanup: list[Any] = field(default_factory=list, repr=False)

    @property
    def provider(self) -> QueryProvider:
        return get_provider(self.engine)

    @property
    def safe_url(self) -> str:
        return safe_url(self.url)

    def new_engine(self, **kwargs: Any) -> Engine:
        return make_engine(self.url, **kwargs)

    def reset(self) -> None:
        reset_tables(self.engine)

    def close(self) -> None:
        self.engine.dispose()
        for action in reversed(self._cleanup):
            try:
                action()
            except Exception:  # noqa: BLE001 - best effort: the run is over
                pass


#: Set to 0 to run only the backends named by URL (CI's matrix jobs, which start one database
#: each, must not start the others through testcontainers).
CONTAINERS_ENV = "DBCLUSTER_TEST_CONTAINERS"
_CONTAINERS_OFF = f"{CONTAINERS_ENV}=0 turns containers off"


def _containers_allowed() -> bool:
    return os.environ.get(CONTAINERS_ENV, "1") != "0"


def _container_engine_available() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no engine here"
        return False


def _start_container(spec: BackendSpec) -> tuple[str, Any]:
    """Start the spec's image with testcontainers; returns (URL, container)."""
    assert spec.image
    if spec.name == "postgresql":
        from testcontainers.postgres import PostgresContainer

        container: Any = PostgresContainer(spec.image, driver="psycopg")
        container.start()
        return container.get_connection_url(), container
    if spec.name in ("mysql", "mariadb"):
        from testcontainers.mysql import MySqlContainer

        container = MySqlContainer(spec.image, dialect="pymysql")
        container.start()
        url = container.get_connection_url()
        if spec.name == "mariadb":
            url = url.replace("mysql+pymysql://", "mariadb+pymysql://", 1)
        return url, container
    if spec.name == "oracle":
        from testcontainers.oracle import OracleDbContainer

        container = OracleDbContainer(spec.image)
        container.start()
        return container.get_connection_url(), container
    if spec.name == "mssql":
        from testcontainers.mssql import SqlServerContainer

        container = SqlServerContainer(spec.image, dialect="mssql+pyodbc")
        container.start()
        query = "?driver=ODBC+Driver+18+for+SQL+Server&TrustServerCertificate=yes"
        return container.get_connection_url() + query, container
    if spec.name == "db2":
        from testcontainers.db2 import Db2Container

        container = Db2Container(spec.image)
        container.start()
        return container.get_connection_url(), container
    raise BackendUnavailable(f"no container recipe for {spec.name}", named=False)


def _isolate(url: str, cleanup: list[Any]) -> str:
    """A URL to a database of this run's own, created by the provider's scratch-database hook
    where ``url`` points (on its server, or beside its file).

    Servers whose provider cannot create databases cheaply get the given database with the
    dbcluster tables dropped first."""
    admin = make_engine(url, isolation_level="AUTOCOMMIT")
    provider = get_provider(admin)
    if not provider.can_create_database:
        admin.dispose()
        return url
    scratch = provider.create_scratch_database(admin, f"dbc_{os.getpid()}_{uuid.uuid4().hex[:8]}")

    def drop() -> None:
        try:
            provider.drop_scratch_database(admin, scratch)
        finally:
            admin.dispose()

    cleanup.append(drop)
    return scratch.render_as_string(hide_password=False)


def open_backend(spec: BackendSpec, label: str | None = None) -> Backend:
    """Open the backend, in a database of its own, with freshly created dbcluster tables."""
    cleanup: list[Any] = []
    configured = spec.configured_url()
    if spec.name == "sqlite" and not configured:
        folder = tempfile.mkdtemp(prefix="dbcluster-test-")
        url = f"sqlite:///{folder}/dbcluster.db"
    elif configured:
        try:
            url = _isolate(configured, cleanup)
        except Exception as exc:  # noqa: BLE001 - reported with the reason
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise BackendUnavailable(
                f"{spec.env}={safe_url(configured)} cannot be reached: {reason}", named=True
            ) from exc
    elif spec.image and _containers_allowed() and _container_engine_available():
        try:
            url, container = _start_container(spec)
        except Exception as exc:  # noqa: BLE001
            raise BackendUnavailable(
                f"container {spec.image} for {spec.name} did not start: {exc}", named=True
            ) from exc
        cleanup.append(container.stop)
    else:
        why = "no container engine answers" if _containers_allowed() else _CONTAINERS_OFF
        raise BackendUnavailable(f"{spec.env} is not set and {why}", named=False)
    engine = make_engine(url)
    try:
        drop_tables(engine)
        create_tables(engine)
    except Exception as exc:
        engine.dispose()
        for action in reversed(cleanup):
            action()
        raise BackendUnavailable(f"{spec.name}: cannot create tables: {exc}", named=True) from exc
    return Backend(spec.name, label or spec.name, url, engine, cleanup)


def open_url(url: str, label: str | None = None) -> Backend:
    """Open a backend from a URL (the conformance suite's ``--dbcluster-url``): a database of its
    own where the server can create one, else the given database with fresh dbcluster tables."""
    cleanup: list[Any] = []
    try:
        isolated = _isolate(url, cleanup)
    except Exception as exc:  # noqa: BLE001 - reported with the reason
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise BackendUnavailable(
            f"{safe_url(url)} cannot be reached: {reason}", named=True
        ) from exc
    engine = make_engine(isolated)
    drop_tables(engine)
    create_tables(engine)
    name = get_provider(engine).name
    return Backend(name, label or name, isolated, engine, cleanup)
