"""The round-trip counters: the wire parsers against the real servers (PostgreSQL with psycopg,
MariaDB with PyMySQL) and against hand-built streams, and SQLite's trace."""

from __future__ import annotations

import os
import sqlite3
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from dbcluster.bench.wire import (
    CountingProxy,
    MySQLSession,
    PostgresSession,
    RoundTrips,
    SqliteTrace,
    classify_sql,
    summarize,
)
from dbcluster.dialects import make_engine
from dbcluster.testing.waiting import wait_for

PG_URL = os.environ.get("DBCLUSTER_TEST_POSTGRESQL_URL")
MARIADB_URL = os.environ.get("DBCLUSTER_TEST_MARIADB_URL")


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("BEGIN", "begin"),
        ("BEGIN IMMEDIATE", "begin"),
        ("start transaction", "begin"),
        ("COMMIT", "commit"),
        ("ROLLBACK", "rollback"),
        ("ROLLBACK TO SAVEPOINT sa_1", "other"),
        ("SAVEPOINT sa_1", "other"),
        ("SELECT 1", "ping"),
        (";", "ping"),
        ("SELECT 1 FROM batch_nodes", "select"),
        ("  /* hint */ select now()", "select"),
        ("-- comment\nUPDATE batch_nodes SET x = 1", "update"),
        ("(SELECT a FROM t) UNION (SELECT b FROM u)", "select"),
        ("INSERT INTO t VALUES (1)", "insert"),
        ("REPLACE INTO t VALUES (1)", "insert"),
        ("DELETE FROM t", "delete"),
        ("WITH c AS (SELECT id FROM t) UPDATE t SET x = 1 FROM c", "update"),
        ("WITH c AS (SELECT id FROM t) SELECT * FROM c", "select"),
        ("SET SESSION innodb_lock_wait_timeout = 3", "other"),
        ("PRAGMA foreign_keys = ON", "other"),
        ("", "ping"),
    ],
)
def test_classify_sql(statement: str, kind: str) -> None:
    assert classify_sql(statement) == kind


# --- hand-built streams -------------------------------------------------------------------------


def _pg(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def _pg_stream() -> bytes:
    startup = struct.pack("!II", 8, 80877103)  # SSLRequest, answered by the proxy
    params = b"user\0postgres\0database\0test\0\0"
    startup += struct.pack("!II", 8 + len(params), 196608) + params
    return startup + b"".join(
        [
            _pg(b"Q", b"BEGIN\0"),
            _pg(b"P", b"s1\0UPDATE t SET a = $1\0\0\0"),
            _pg(b"S", b""),
            _pg(b"B", b"\0s1\0\0\0\0\0\0\0"),
            _pg(b"E", b"\0\0\0\0\0"),
            _pg(b"S", b""),
            # Pipelined: two executions of an unnamed insert, one Sync.
            _pg(b"P", b"\0INSERT INTO t VALUES ($1)\0\0\0"),
            _pg(b"B", b"\0\0\0\0\0\0\0\0"),
            _pg(b"E", b"\0\0\0\0\0"),
            _pg(b"B", b"\0\0\0\0\0\0\0\0"),
            _pg(b"E", b"\0\0\0\0\0"),
            _pg(b"S", b""),
            _pg(b"Q", b"COMMIT\0"),
            _pg(b"X", b""),
        ]
    )


PG_EXPECTED = {
    "connections": 1,
    "detail:encryption_refused": 1,
    "round_trips": 5,
    "statements": 5,
    "begin": 1,
    "update": 1,
    "insert": 2,
    "commit": 1,
}


@pytest.mark.parametrize("chunk", [1, 7, 1 << 16])
def test_postgres_parser_on_a_built_stream_in_any_chunking(chunk: int) -> None:
    counts = RoundTrips()
    session = PostgresSession(counts)
    stream = _pg_stream()
    onward, back = bytearray(), bytearray()
    for at in range(0, len(stream), chunk):
        to_server, to_client = session.from_client(stream[at : at + chunk])
        onward += to_server
        back += to_client
    assert counts.snapshot() == PG_EXPECTED
    assert bytes(back) == b"N"
    assert bytes(onward) == stream[8:]  # everything but the SSLRequest reaches the server


def _my(seq: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "little") + bytes([seq]) + payload


def _greeting(capabilities: int) -> bytes:
    body = b"\x0a" + b"10.11.0-MariaDB\0" + b"\1\0\0\0" + b"12345678" + b"\0"
    return _my(0, body + capabilities.to_bytes(2, "little") + b"\x21\x02\x00" + b"\0" * 13)


def test_mysql_parser_handles_auth_prepared_statements_and_split_packets() -> None:
    counts = RoundTrips()
    session = MySQLSession(counts)
    greeting, _ = session.from_server(_greeting(0xFFFF))
    flags_at = greeting.index(b"\0", 5) + 1 + 4 + 8 + 1
    assert int.from_bytes(greeting[flags_at : flags_at + 2], "little") == 0xFFFF & ~0x0800
    session.from_client(_my(1, (0x000FA68D).to_bytes(4, "little") + b"\0" * 60))
    session.from_server(_my(2, b"\xfeauth_switch\0salt"))  # auth switch: still authenticating
    session.from_client(_my(3, b"scrambled"))
    session.from_server(_my(4, b"\x00\x00\x00\x02\x00\x00\x00"))  # OK: command phase
    session.from_client(_my(0, b"\x03BEGIN"))
    session.from_client(_my(0, b"\x16UPDATE t SET a = ?"))
    session.from_server(_my(1, b"\x00\x07\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"))
    session.from_client(_my(0, b"\x17\x07\x00\x00\x00\x00\x01\x00\x00\x00"))
    session.from_client(_my(0, b"\x19\x07\x00\x00\x00"))  # close: no reply
    # A 16 MB query is one command in two packets; the second one's sequence id is 1.
    big = b"\x03INSERT INTO t VALUES ('" + b"x" * (0xFFFFFF + 10) + b"')"
    stream = _my(0, big[:0xFFFFFF]) + _my(1, big[0xFFFFFF:])
    for at in range(0, len(stream), 1 << 20):
        session.from_client(stream[at : at + (1 << 20)])
    session.from_client(_my(0, b"\x0e"))  # COM_PING
    session.from_client(_my(0, b"\x03COMMIT") + _my(0, b"\x01"))  # and COM_QUIT: no reply
    snapshot = counts.snapshot()
    assert {k: v for k, v in snapshot.items() if not k.startswith("detail:")} == {
        "connections": 1,
        "round_trips": 6,
        "statements": 5,
        "begin": 1,
        "update": 1,
        "insert": 1,
        "ping": 1,
        "commit": 1,
    }
    assert snapshot["detail:COM_STMT_PREPARE"] == 1
    assert snapshot["detail:COM_STMT_CLOSE"] == snapshot["detail:COM_QUIT"] == 1


def test_mysql_ssl_request_makes_the_connection_opaque() -> None:
    counts = RoundTrips()
    session = MySQLSession(counts)
    session.from_server(_greeting(0xFFFF))
    session.from_client(_my(1, (0x0800 | 0x0200).to_bytes(4, "little") + b"\0" * 28))
    session.from_client(_my(0, b"\x03SELECT 1"))  # TLS bytes in reality: not parsed
    assert counts.snapshot() == {"connections": 1, "detail:unparsed_connections": 1}


# --- real servers -------------------------------------------------------------------------------


def _settle(proxy: CountingProxy, key: str, value: int) -> dict[str, int]:
    """The proxy counts on its own thread: wait until ``key`` reaches ``value``."""
    wait_for(lambda: proxy.counts.snapshot().get(key, 0) >= value, 10, f"{key} >= {value}")
    return proxy.counts.snapshot()


def _kinds(snapshot: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in snapshot.items() if not k.startswith("detail:")}


@pytest.fixture
def pg_proxy() -> Iterator[CountingProxy]:
    if not PG_URL:
        pytest.skip("DBCLUSTER_TEST_POSTGRESQL_URL is not set")
    with CountingProxy.for_url(PG_URL) as proxy:
        yield proxy


@pytest.fixture
def mariadb_proxy() -> Iterator[CountingProxy]:
    if not MARIADB_URL:
        pytest.skip("DBCLUSTER_TEST_MARIADB_URL is not set")
    with CountingProxy.for_url(MARIADB_URL) as proxy:
        yield proxy


def test_psycopg_begin_select_commit_through_the_proxy(pg_proxy: CountingProxy) -> None:
    import psycopg

    assert PG_URL
    url = make_url(PG_URL)
    conn = psycopg.connect(
        host="127.0.0.1", port=pg_proxy.port, user=url.username, dbname=url.database
    )
    try:
        _settle(pg_proxy, "connections", 1)
        pg_proxy.counts.reset()
        with conn.cursor() as cur:
            cur.execute("SELECT 42")  # psycopg sends BEGIN first, on its own
            assert cur.fetchall() == [(42,)]
        conn.commit()
        assert _kinds(_settle(pg_proxy, "commit", 1)) == {
            "round_trips": 3,
            "statements": 3,
            "begin": 1,
            "select": 1,
            "commit": 1,
        }
        pg_proxy.counts.reset()
        with conn.cursor() as cur:
            cur.execute("CREATE TEMPORARY TABLE wire_t (a int)")
            cur.executemany("INSERT INTO wire_t VALUES (%s)", [(1,), (2,), (3,)])
        conn.rollback()
        found = _kinds(_settle(pg_proxy, "rollback", 1))
        assert found["insert"] == 3  # each row executed, however many round trips carried them
        assert found["begin"] == found["rollback"] == 1
    finally:
        conn.close()


def test_sqlalchemy_pool_ping_is_counted_on_postgresql(pg_proxy: CountingProxy) -> None:
    assert PG_URL
    engine = make_engine(pg_proxy.url_for(PG_URL), pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 2"))
        _settle(pg_proxy, "rollback", 1)
        pg_proxy.counts.reset()
        with engine.connect() as conn:  # a checkout: the pre-ping
            conn.execute(text("SELECT 2"))
        found = _kinds(_settle(pg_proxy, "rollback", 1))
        assert found == {
            "round_trips": 4,
            "statements": 4,
            "ping": 1,
            "begin": 1,
            "select": 1,
            "rollback": 1,
        }
    finally:
        engine.dispose()


def test_pymysql_begin_select_commit_and_ping_through_the_proxy(
    mariadb_proxy: CountingProxy,
) -> None:
    import pymysql

    assert MARIADB_URL
    url = make_url(MARIADB_URL)
    conn = pymysql.connect(
        host="127.0.0.1",
        port=mariadb_proxy.port,
        user=url.username,
        password=url.password or "",
        database=url.database,
    )
    try:
        _settle(mariadb_proxy, "connections", 1)
        mariadb_proxy.counts.reset()
        conn.begin()
        with conn.cursor() as cur:
            cur.execute("SELECT 42")
            assert cur.fetchall() == ((42,),)
        conn.commit()
        conn.ping()
        found = _kinds(_settle(mariadb_proxy, "ping", 1))
        assert found == {
            "round_trips": 4,
            "statements": 4,
            "begin": 1,
            "select": 1,
            "commit": 1,
            "ping": 1,
        }
        mariadb_proxy.counts.reset()
        with conn.cursor() as cur:
            cur.execute("CREATE TEMPORARY TABLE wire_t (a int)")
            cur.executemany("UPDATE wire_t SET a = %s WHERE a = %s", [(1, 2), (2, 3), (3, 4)])
        conn.rollback()
        found = _kinds(_settle(mariadb_proxy, "rollback", 1))
        assert found["update"] == 3  # PyMySQL sends an UPDATE executemany row by row
        assert found["round_trips"] == 5
    finally:
        conn.close()


def test_sqlalchemy_pool_ping_is_counted_on_mariadb(mariadb_proxy: CountingProxy) -> None:
    assert MARIADB_URL
    engine = make_engine(mariadb_proxy.url_for(MARIADB_URL), pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 2"))
        _settle(mariadb_proxy, "rollback", 1)
        mariadb_proxy.counts.reset()
        with engine.connect() as conn:
            conn.execute(text("SELECT 2"))
        found = _kinds(_settle(mariadb_proxy, "rollback", 1))
        assert found == {"round_trips": 3, "statements": 3, "ping": 1, "select": 1, "rollback": 1}
    finally:
        engine.dispose()


# --- SQLite -------------------------------------------------------------------------------------


def test_sqlite_trace_sees_what_pysqlite_issues_itself(tmp_path: Path) -> None:
    """pysqlite's own implicit BEGIN, its COMMIT and ROLLBACK, and each row of an executemany."""
    trace = SqliteTrace()
    conn = sqlite3.connect(tmp_path / "raw.db")
    trace._on_connect(conn, None)
    conn.execute("CREATE TABLE t (a INTEGER)")
    trace.counts.reset()
    conn.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), (3,)])  # pysqlite: BEGIN first
    conn.commit()
    conn.execute("UPDATE t SET a = 0")
    conn.rollback()
    conn.close()
    assert trace.counts.snapshot() == {
        "round_trips": 8,
        "statements": 8,
        "begin": 2,
        "insert": 3,
        "commit": 1,
        "update": 1,
        "rollback": 1,
    }


def test_sqlite_trace_on_an_engine_counts_begin_commit_and_pings(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'e.db'}", pool_pre_ping=True)
    trace = SqliteTrace().install(engine)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (a INTEGER)"))
        trace.counts.reset()
        with engine.begin() as conn:  # a checkout (ping), then dbcluster's explicit BEGIN
            conn.execute(text("INSERT INTO t VALUES (:a)"), [{"a": 1}, {"a": 2}])
        found = trace.counts.snapshot()
        assert found == {
            "round_trips": 5,
            "statements": 5,
            "ping": 1,
            "begin": 1,
            "insert": 2,
            "commit": 1,
        }
        assert summarize(found, 2)["by_kind"]["insert"] == 1.0
    finally:
        trace.remove()
        engine.dispose()


def test_mysql_error_instead_of_a_greeting_passes_through() -> None:
    """A server that refuses at once (too many connections) sends ERR, not a greeting."""
    counts = RoundTrips()
    session = MySQLSession(counts)
    refusal = _my(0, b"\xff\x10\x04Too many connections")
    assert session.from_server(refusal) == (refusal, b"")
    session.from_client(_my(0, b"\x03SELECT 1"))
    assert counts.snapshot() == {"connections": 1}
