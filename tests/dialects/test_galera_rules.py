"""The MySQL family's rules for a MariaDB Galera cluster (issue 34), and the errors a database
outage raises where SQLAlchemy does not wrap them.

Each server error is the exception PyMySQL itself makes from the server's error packet (its
``raise_mysql_exception``), with the number, SQLSTATE and text a Galera node sends.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from dbcluster.dialects import make_engine, provider_for_name
from dbcluster.testing.backends import Backend

ROOT = Path(__file__).resolve().parents[2]


def _server_error(errno: int, sqlstate: str, message: str) -> BaseException:
    """The exception PyMySQL raises for the server's error packet."""
    import pymysql

    packet = b"\xff" + struct.pack("<H", errno) + b"#" + sqlstate.encode() + message.encode()
    try:
        pymysql.err.raise_mysql_exception(packet)
    except pymysql.err.Error as error:
        return error
    raise AssertionError("PyMySQL raised nothing")


#: What a Galera node answers when it cannot serve, and what a certification failure looks like.
NOT_READY = (1047, "08S01", "WSREP has not yet prepared node for application use")
NOT_PRIMARY = (
    1180,
    "HY000",
    "Error while appending streaming replication fragment(provider status: Not connected to "
    "Primary Component)",
)
CERTIFICATION = (
    1213,
    "40001",
    "Deadlock found when trying to get lock; try restarting transaction",
)


@pytest.mark.parametrize("provider", ["mysql", "mariadb"])
@pytest.mark.parametrize("error", [NOT_READY, NOT_PRIMARY, CERTIFICATION], ids=str)
def test_a_galera_node_out_of_service_or_a_lost_certification_is_transient(
    provider: str, error: tuple[int, str, str]
) -> None:
    orig = _server_error(*error)
    wrapped = DBAPIError("COMMIT", None, orig)  # type: ignore[arg-type]
    assert provider_for_name(provider).is_transient(wrapped)


@pytest.mark.parametrize("provider", ["mysql", "mariadb"])
def test_errors_of_the_statement_itself_stay_permanent(provider: str) -> None:
    for error in [
        (1062, "23000", "Duplicate entry '1' for key 'PRIMARY'"),
        (1054, "42S22", "Unknown column 'x' in 'field list'"),
        (1146, "42S02", "Table 'test.nope' doesn't exist"),
    ]:
        wrapped = DBAPIError("SELECT 1", None, _server_error(*error))  # type: ignore[arg-type]
        assert not provider_for_name(provider).is_transient(wrapped)


def test_a_driver_error_sqlalchemy_did_not_wrap_is_classified_too() -> None:
    """A listener waits on the driver directly: what it raises when the server goes away is the
    driver's own exception, judged as its wrapped form would be."""
    import psycopg
    import pymysql

    lost = psycopg.OperationalError(
        "consuming input failed: server closed the connection unexpectedly"
    )
    assert provider_for_name("postgresql").is_transient(lost)
    shutdown = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert provider_for_name("postgresql").is_transient(shutdown)
    assert not provider_for_name("postgresql").is_transient(
        psycopg.errors.UniqueViolation("duplicate key")
    )
    assert provider_for_name("mariadb").is_transient(_server_error(*NOT_READY))
    assert provider_for_name("mariadb").is_transient(
        pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    )
    assert not provider_for_name("mariadb").is_transient(ValueError("not a driver's"))


def test_a_session_on_an_unready_galera_node_is_dropped_alone() -> None:
    """1047/1180 leave the session useless until the node is Synced: the engine drops it (a
    disconnect), without dropping the pool's other sessions; other errors are left alone."""
    engine = make_engine("mariadb+pymysql://u@127.0.0.1:1/none")
    try:
        for error, dropped in [(NOT_READY, True), (NOT_PRIMARY, True), (CERTIFICATION, False)]:
            context = SimpleNamespace(
                original_exception=_server_error(*error),
                is_disconnect=False,
                invalidate_pool_on_disconnect=True,
            )
            for listener in engine.dialect.dispatch.handle_error:
                listener(context)
            assert context.is_disconnect is dropped
            assert context.invalidate_pool_on_disconnect is not dropped
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("error", "dropped"), [(NOT_READY, True), (NOT_PRIMARY, True), (CERTIFICATION, False)], ids=str
)
def test_a_statement_pairs_write_error_takes_the_rules_of_any_statement(
    open_test_backend: Callable[[str], Backend],
    monkeypatch: pytest.MonkeyPatch,
    error: tuple[int, str, str],
    dropped: bool,
) -> None:
    """The write of a read-then-write pair fails on the server (its error arrives when its
    result is read, after the request's execute returned): the error is transient and a
    1047/1180 drops the session, as for any statement (the pair wrapped the error itself and
    asked only the driver's lost-connection test, so a Galera node out of service left the
    session in the pool and its error looked permanent)."""
    import pymysql
    from sqlalchemy import select

    from dbcluster import schema
    from dbcluster.dialects import get_provider

    engine = open_test_backend("mariadb").new_engine(autocommit=True)
    try:
        provider = get_provider(engine)
        pair = provider.read_then_write(
            select(schema.nodes.c.node_id), provider.heartbeat("nobody", 0), engine.dialect
        )
        assert pair is not None
        with engine.connect() as conn:
            assert pair.run(conn, {})[1] == 0  # the pair works on this server

        # The server's answer to the write is the error: PyMySQL raises it when the write's
        # result is asked for (the first nextset after the request; execute's own nextset,
        # before it sends, and any later one read the wire as usual).
        nextset = pymysql.cursors.Cursor.nextset
        answered: list[bool] = []

        def write_fails(cursor: Any) -> bool | None:
            if cursor._executed is not None and not answered:
                answered.append(True)
                raise _server_error(*error)
            return nextset(cursor)

        monkeypatch.setattr(pymysql.cursors.Cursor, "nextset", write_fails)
        with engine.connect() as conn:
            with pytest.raises(DBAPIError) as raised:
                pair.run(conn, {})
            assert conn.invalidated is dropped
        assert provider.is_transient(raised.value)
        assert raised.value.connection_invalidated is dropped
        assert answered, "the write's error was never raised"
    finally:
        engine.dispose()


def test_reads_are_not_made_causal_on_a_server_that_is_not_galera(
    open_test_backend: Callable[[str], Backend],
) -> None:
    """Galera is told by the server (``wsrep_on``), on the engine's first connection."""
    from dbcluster.dialects import get_provider

    engine = open_test_backend("mariadb").new_engine()
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT @@wsrep_sync_wait")).scalar_one() == 0
        assert get_provider(engine).galera is False
    finally:
        engine.dispose()


#: What Galera does not have (MariaDB Galera Cluster, "Known Limitations").
_UNSUPPORTED = re.compile(
    r"LOCK\s+TABLES?|GET_LOCK|RELEASE_LOCK|IS_FREE_LOCK|\bXA\s+(START|BEGIN|END|PREPARE|COMMIT)"
    r"|begin_twophase|prepare_twophase|twophase\s*=\s*True",
    re.IGNORECASE,
)


def test_no_path_uses_what_galera_lacks() -> None:
    """No LOCK TABLES, GET_LOCK or XA transaction anywhere in the product."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "dbcluster").rglob("*.py"))
        if "testing" not in path.relative_to(ROOT).parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _UNSUPPORTED.search(line)
    ]
    assert found == []


def test_init_asks_again_when_a_replicated_ddl_aborts_its_metadata_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a Galera node, DDL runs in total order and aborts a concurrent local metadata read
    (``SHOW CREATE TABLE``) with a certification failure; ``init`` from several processes at once
    failed on it (the check before each CREATE was not tried again). Here every third existence
    check fails that way: the schema is still made, every table once."""
    from dbcluster import schema
    from dbcluster.dialects import ddl, get_provider

    engine = make_engine(f"sqlite:///{tmp_path / 'init.db'}")
    provider = get_provider(engine)
    aborted = _server_error(*CERTIFICATION)
    monkeypatch.setattr(provider, "is_transient", lambda exc: exc.orig is aborted)
    calls = {"n": 0}
    real_table_exists = ddl.DDLStatements._table_exists
    real_index_exists = ddl.DDLStatements._index_exists

    def aborting(real: Callable[..., bool]) -> Callable[..., bool]:
        def check(*args: object) -> bool:
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                raise DBAPIError("SHOW CREATE TABLE", None, aborted)  # type: ignore[arg-type]
            return real(*args)

        return staticmethod(check)  # type: ignore[return-value]

    monkeypatch.setattr(ddl.DDLStatements, "_table_exists", aborting(real_table_exists))
    monkeypatch.setattr(ddl.DDLStatements, "_index_exists", aborting(real_index_exists))
    monkeypatch.setattr(ddl, "SCHEMA_RETRY", replace(ddl.SCHEMA_RETRY, sleep=lambda s: None))
    tables, _ = provider.create_schema(engine)
    assert sorted(tables) == sorted(t.name for t in schema.ALL_TABLES)
    assert calls["n"] >= 3, "no existence check was aborted: the test proved nothing"
