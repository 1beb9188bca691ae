"""Honest round-trip counting: what the driver really sends, not what SQLAlchemy executes.

SQLAlchemy's statement events miss what the driver does on its own (``BEGIN`` before the first
statement of a transaction, ``COMMIT``/``ROLLBACK``, pool pings, one event for an executemany
whose rows go one by one). This module counts below the driver instead:

- PostgreSQL, MySQL and MariaDB: :class:`CountingProxy`, a TCP proxy on the loopback interface
  that parses the client-to-server stream of the database's wire protocol. Point a URL at it with
  :meth:`CountingProxy.url_for`. It refuses TLS and GSS encryption (answering the request itself),
  so the stream stays readable; the server never sees the request.
- SQLite (no wire): :class:`SqliteTrace`, sqlite3's ``set_trace_callback`` on every connection,
  which sees each statement the SQLite library runs, those pysqlite issues itself included.

A *round trip* is one request the client waits on: a PostgreSQL simple ``Query`` or ``Sync`` (a
``FunctionCall`` too); a MySQL command that gets a reply (not ``COM_QUIT``, ``COM_STMT_CLOSE``
or ``COM_STMT_SEND_LONG_DATA``); a SQLite statement. Each executed statement is also counted by
kind (:data:`KINDS`): on PostgreSQL at ``Execute``, through the portal and prepared statement it
names, so a statement prepared once and executed many times is counted each time, and several
statements pipelined before one ``Sync`` are several statements in one round trip.

The proxy adds latency (a Python hop on every message): take timings without it and counts
through it.
"""

from __future__ import annotations

import asyncio
import re
import struct
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

#: Statement kinds, in report order.
KINDS = ("begin", "commit", "rollback", "ping", "select", "insert", "update", "delete", "other")

#: How much of a message's body the parsers keep (statement text beyond it is not needed to
#: classify, and is skipped without being buffered).
_PREFIX = 4096

_COMMENT = re.compile(r"\s+|/\*.*?\*/|--[^\n]*(?:\n|$)|\(", re.DOTALL)
_WORD = re.compile(r"[A-Za-z]+")
_DML = re.compile(r"\b(insert|update|delete)\b", re.IGNORECASE)
_PING = re.compile(r"^\s*(?:select\s+1\s*)?;?\s*$", re.IGNORECASE)


def classify_sql(text: str) -> str:
    """The kind (one of :data:`KINDS`) of a statement, by its first keyword.

    ``SELECT 1`` alone (what SQLAlchemy's pool sends to test a connection on every backend whose
    driver has no ping of its own) and the empty statement are pings; ``START TRANSACTION`` is a
    begin, ``END``/``ABORT`` PostgreSQL's spellings of commit/rollback; ``REPLACE`` an insert; a
    ``WITH`` statement is the first data-changing verb in it, else a select. Savepoints and
    everything else are ``other``."""
    if _PING.match(text):
        return "ping"
    position = 0
    while True:
        skipped = _COMMENT.match(text, position)
        if not skipped or skipped.end() == position:
            break
        position = skipped.end()
    word_match = _WORD.match(text, position)
    if not word_match:
        return "other"
    word = word_match.group(0).lower()
    if word in ("begin", "start"):
        return "begin"
    if word in ("commit", "end"):
        return "commit"
    if word in ("rollback", "abort"):
        rest = text[word_match.end() :].lstrip().lower()
        return "other" if rest.startswith(("to", "work to")) else "rollback"
    if word in ("select", "insert", "update", "delete"):
        return word
    if word == "replace":
        return "insert"
    if word == "with":
        dml = _DML.search(text, word_match.end())
        return dml.group(1).lower() if dml else "select"
    return "other"


class RoundTrips:
    """Thread-safe tallies: ``round_trips``, ``statements``, one key per kind, ``connections``,
    and protocol detail under ``detail:`` keys."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def round_trip(self) -> None:
        with self._lock:
            self._counts["round_trips"] += 1

    def statement(self, kind: str) -> None:
        with self._lock:
            self._counts["statements"] += 1
            self._counts[kind] += 1

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


def summarize(counts: dict[str, int], per: float) -> dict[str, Any]:
    """``counts`` divided by ``per`` (partitions, rows, seconds) in report shape: round trips,
    statements, commits, and the statements by kind."""

    def share(value: int) -> float:
        return round(value / per, 3) if per else float("nan")

    return {
        "round_trips": share(counts.get("round_trips", 0)),
        "statements": share(counts.get("statements", 0)),
        "commits": share(counts.get("commit", 0)),
        "by_kind": {kind: share(counts.get(kind, 0)) for kind in KINDS},
    }


# --- stream parsing -----------------------------------------------------------------------------


class Session(Protocol):
    """One proxied connection's parser. Each feed returns (bytes onward, bytes back to the
    sender); the proxy forwards and answers exactly those."""

    def from_client(self, data: bytes) -> tuple[bytes, bytes]: ...

    def from_server(self, data: bytes) -> tuple[bytes, bytes]: ...


class _Framer:
    """Splits a byte stream into messages without buffering their bodies: ``header`` bytes are
    read first, ``body_length(header)`` bytes follow, of which the first :data:`_PREFIX` are
    kept. ``on_message(header, prefix, complete_body)`` is called at each message's end."""

    def __init__(
        self,
        header_size: int,
        body_length: Callable[[bytes], int],
        on_message: Callable[[bytes, bytes, bool], None],
    ) -> None:
        self.header_size = header_size
        self.body_length = body_length
        self.on_message = on_message
        self._header = bytearray()
        self._prefix = bytearray()
        self._remaining = -1  # body bytes still to come; -1 while reading a header
        self._length = 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._remaining < 0:
                take = min(self.header_size - len(self._header), len(view))
                self._header += view[:take]
                view = view[take:]
                if len(self._header) < self.header_size:
                    return
                self._length = self._remaining = self.body_length(bytes(self._header))
                self._prefix.clear()
            take = min(self._remaining, len(view))
            keep = min(take, max(0, _PREFIX - len(self._prefix)))
            self._prefix += view[:keep]
            view = view[take:]
            self._remaining -= take
            if self._remaining == 0:
                header, prefix = bytes(self._header), bytes(self._prefix)
                self._header.clear()
                self._remaining = -1
                self.on_message(header, prefix, len(prefix) == self._length)


def _cstring(data: bytes, start: int = 0) -> tuple[str, int]:
    """The NUL-terminated string at ``start`` (to the end if cut off) and the offset after it."""
    end = data.find(b"\0", start)
    if end < 0:
        return data[start:].decode("utf-8", "replace"), len(data)
    return data[start:end].decode("utf-8", "replace"), end + 1


_PG_SSL_REQUEST = 80877103
_PG_GSSENC_REQUEST = 80877104
_PG_CANCEL_REQUEST = 80877102


class PostgresSession:
    """The PostgreSQL frontend/backend protocol, version 3, client side.

    Before the startup message: an ``SSLRequest`` or ``GSSENCRequest`` is answered ``N``
    (not supported) by the proxy, and the client goes on in plain text; a ``CancelRequest``
    passes through. After it, typed messages: ``Q`` (simple query), ``S`` (Sync) and ``F``
    (function call) are round trips; ``P`` (Parse) names a statement, ``B`` (Bind) a portal
    on it, ``E`` (Execute) runs a portal, and is counted by the statement's kind."""

    def __init__(self, counts: RoundTrips) -> None:
        self.counts = counts
        self._startup = bytearray()
        self._typed = False
        self._opaque = False
        self._statements: dict[str, str] = {}
        self._portals: dict[str, str] = {}
        self._framer = _Framer(5, lambda h: struct.unpack("!I", h[1:5])[0] - 4, self._message)

    def from_server(self, data: bytes) -> tuple[bytes, bytes]:
        return data, b""

    def from_client(self, data: bytes) -> tuple[bytes, bytes]:
        if self._opaque:
            return data, b""
        if self._typed:
            self._framer.feed(data)
            return data, b""
        self._startup += data
        onward, back = bytearray(), bytearray()
        while not self._typed and not self._opaque and len(self._startup) >= 8:
            length, code = struct.unpack("!II", self._startup[:8])
            if length < 8:  # not the protocol we know: pass it on unparsed
                self._opaque = True
                break
            if len(self._startup) < length:
                break
            message = bytes(self._startup[:length])
            del self._startup[:length]
            if code in (_PG_SSL_REQUEST, _PG_GSSENC_REQUEST):
                back += b"N"
                self.counts.add("detail:encryption_refused")
            elif code == _PG_CANCEL_REQUEST:
                onward += message
                self._opaque = True
            else:
                onward += message
                self.counts.add("connections")
                self._typed = True
        if self._typed or self._opaque:
            rest = bytes(self._startup)
            self._startup.clear()
            onward += rest
            if self._typed and rest:
                self._framer.feed(rest)
        return bytes(onward), bytes(back)

    def _message(self, header: bytes, body: bytes, complete: bool) -> None:
        kind = header[:1]
        if kind == b"Q":
            self.counts.round_trip()
            self.counts.statement(classify_sql(_cstring(body)[0]))
        elif kind == b"P":
            name, offset = _cstring(body)
            self._statements[name] = classify_sql(_cstring(body, offset)[0])
        elif kind == b"B":
            portal, offset = _cstring(body)
            self._portals[portal] = self._statements.get(_cstring(body, offset)[0], "other")
        elif kind == b"E":
            self.counts.statement(self._portals.get(_cstring(body)[0], "other"))
        elif kind == b"S":
            self.counts.round_trip()
        elif kind == b"F":
            self.counts.round_trip()
            self.counts.statement("other")
        elif kind == b"C" and body[:1] == b"S":
            self._statements.pop(_cstring(body, 1)[0], None)


_MYSQL_CLIENT_SSL = 0x0800
_MYSQL_MAX_PACKET = 0xFFFFFF
#: Commands the server does not answer: not round trips.
_MYSQL_NO_REPLY = {0x01: "COM_QUIT", 0x18: "COM_STMT_SEND_LONG_DATA", 0x19: "COM_STMT_CLOSE"}
_MYSQL_COMMANDS = {
    0x02: "COM_INIT_DB",
    0x03: "COM_QUERY",
    0x0E: "COM_PING",
    0x11: "COM_CHANGE_USER",
    0x16: "COM_STMT_PREPARE",
    0x17: "COM_STMT_EXECUTE",
    0x1A: "COM_STMT_RESET",
    0x1C: "COM_STMT_FETCH",
    0x1F: "COM_RESET_CONNECTION",
    **_MYSQL_NO_REPLY,
}


def _mysql_length(header: bytes) -> int:
    return int.from_bytes(header[:3], "little")


class MySQLSession:
    """The MySQL client/server protocol (MySQL and MariaDB).

    Packets are a 3-byte length, a sequence id and a payload; a payload of 16 MB or more is
    split into packets of exactly ``0xFFFFFF`` bytes followed by a shorter one, which are one
    packet to us. Connection phase: the server's greeting (its ``CLIENT_SSL`` capability
    cleared, so the client does not switch to TLS), the client's handshake response, then
    auth-switch and auth-more-data exchanges until the server's OK (or ERR). Command phase: each
    client packet with sequence id 0 starts a command; ``COM_QUERY`` is counted by its text's
    kind, ``COM_PING`` as a ping, ``COM_STMT_EXECUTE`` by the kind of the text its statement id
    was prepared from (read from the server's prepare reply)."""

    def __init__(self, counts: RoundTrips) -> None:
        self.counts = counts
        self._phase = "greeting"  # greeting -> auth -> command; opaque after a TLS switch
        self._greeting = bytearray()
        self._client_continues = False
        self._server_continues = False
        self._prepared: dict[int, str] = {}
        self._preparing: str | None = None
        self._client = _Framer(4, _mysql_length, self._client_packet)
        self._server = _Framer(4, _mysql_length, self._server_packet)

    def from_client(self, data: bytes) -> tuple[bytes, bytes]:
        if self._phase != "opaque":
            self._client.feed(data)
        return data, b""

    def from_server(self, data: bytes) -> tuple[bytes, bytes]:
        if self._phase == "opaque":
            return data, b""
        if self._phase != "greeting":
            self._server.feed(data)
            return data, b""
        self._greeting += data
        if len(self._greeting) < 4 or len(self._greeting) < 4 + _mysql_length(self._greeting):
            return b"", b""
        length = _mysql_length(self._greeting)
        packet = bytearray(self._greeting[: 4 + length])
        rest = bytes(self._greeting[4 + length :])
        self._greeting.clear()
        self.counts.add("connections")
        version_end = packet.find(0, 5)
        flags_at = version_end + 1 + 4 + 8 + 1
        if length and packet[4] == 0x0A and version_end > 0 and flags_at + 2 <= len(packet):
            # Protocol 10: version string, thread id, 8 scramble bytes, filler, capabilities.
            flags = int.from_bytes(packet[flags_at : flags_at + 2], "little")
            packet[flags_at : flags_at + 2] = (flags & ~_MYSQL_CLIENT_SSL).to_bytes(2, "little")
            self._phase = "auth"
        else:  # an ERR packet instead of a greeting (too many connections, host blocked)
            self._phase = "closed"
        if rest:
            self._server.feed(rest)
        return bytes(packet) + rest, b""

    def _client_packet(self, header: bytes, payload: bytes, complete: bool) -> None:
        continuation = self._client_continues
        self._client_continues = _mysql_length(header) == _MYSQL_MAX_PACKET
        if continuation:
            return
        if self._phase == "auth":
            flags = int.from_bytes(payload[:4], "little")
            if flags & _MYSQL_CLIENT_SSL and _mysql_length(header) == 32:
                self._phase = "opaque"  # an SSLRequest: TLS follows, which we cannot read
                self.counts.add("detail:unparsed_connections")
            return
        if self._phase != "command" or header[3] != 0 or not payload:
            return
        code = payload[0]
        name = _MYSQL_COMMANDS.get(code, f"COM_0x{code:02x}")
        self.counts.add(f"detail:{name}")
        if code in _MYSQL_NO_REPLY:
            if code == 0x19:
                self._prepared.pop(int.from_bytes(payload[1:5], "little"), None)
            return
        self.counts.round_trip()
        if code == 0x03:
            self.counts.statement(classify_sql(payload[1:].decode("utf-8", "replace")))
        elif code == 0x0E:
            self.counts.statement("ping")
        elif code == 0x16:
            self._preparing = classify_sql(payload[1:].decode("utf-8", "replace"))
        elif code == 0x17:
            self.counts.statement(
                self._prepared.get(int.from_bytes(payload[1:5], "little"), "other")
            )
        else:
            self.counts.statement("other")

    def _server_packet(self, header: bytes, payload: bytes, complete: bool) -> None:
        continuation = self._server_continues
        self._server_continues = _mysql_length(header) == _MYSQL_MAX_PACKET
        if continuation or not payload:
            return
        if self._phase == "auth":
            # 0x00 OK ends authentication, 0xFF ERR ends the connection; 0xFE (auth switch)
            # and 0x01 (auth more data) ask the client for another auth packet.
            if payload[0] == 0x00:
                self._phase = "command"
            elif payload[0] == 0xFF:
                self._phase = "closed"
        elif self._phase == "command" and self._preparing is not None:
            kind, self._preparing = self._preparing, None
            if payload[0] == 0x00 and len(payload) >= 5:
                self._prepared[int.from_bytes(payload[1:5], "little")] = kind


PROTOCOLS: dict[str, Callable[[RoundTrips], Session]] = {
    "postgresql": PostgresSession,
    "mysql": MySQLSession,
    "mariadb": MySQLSession,
}


def protocol_for_url(url: str | URL) -> str | None:
    """The wire protocol of a URL's backend, or None when the proxy cannot count it (SQLite:
    use :class:`SqliteTrace`; other servers: not supported)."""
    backend = make_url(url).get_backend_name()
    return backend if backend in PROTOCOLS else None


# --- the proxy ----------------------------------------------------------------------------------


class CountingProxy:
    """A TCP proxy on ``127.0.0.1`` (an ephemeral port) to ``host:port`` that counts the round
    trips of every connection through it into :attr:`counts`. Runs an asyncio loop on a daemon
    thread: start with :meth:`start` or ``with``."""

    def __init__(
        self, host: str, port: int, protocol: str, counts: RoundTrips | None = None
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"no wire parser for {protocol!r}; known: {', '.join(PROTOCOLS)}")
        self.host, self.target_port, self.protocol = host, port, protocol
        self.counts = counts if counts is not None else RoundTrips()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @classmethod
    def for_url(cls, url: str | URL, counts: RoundTrips | None = None) -> CountingProxy:
        parsed = make_url(url)
        protocol = protocol_for_url(parsed)
        if protocol is None:
            raise ValueError(f"no wire parser for {parsed.get_backend_name()!r} URLs")
        default_port = 5432 if protocol == "postgresql" else 3306
        return cls(parsed.host or "127.0.0.1", parsed.port or default_port, protocol, counts)

    def url_for(self, url: str | URL) -> str:
        """``url`` with its host and port rewritten to this proxy."""
        parsed = make_url(url).set(host="127.0.0.1", port=self.port)
        return parsed.render_as_string(hide_password=False)

    def start(self) -> CountingProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="dbcluster-bench-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(timeout=10)

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        server_out: asyncio.StreamWriter | None = None
        try:
            server_in, server_out = await asyncio.open_connection(self.host, self.target_port)
            session = PROTOCOLS[self.protocol](self.counts)
            pumps = [
                asyncio.ensure_future(
                    self._pump(client_in, server_out, client_out, session.from_client)
                ),
                asyncio.ensure_future(
                    self._pump(server_in, client_out, server_out, session.from_server)
                ),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass  # the server refused, or the proxy stops: the client sees its socket close
        finally:
            for writer in (client_out, server_out):
                if writer is not None:
                    writer.close()
            self._connections.discard(task)

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader,
        onward: asyncio.StreamWriter,
        back: asyncio.StreamWriter,
        parse: Callable[[bytes], tuple[bytes, bytes]],
    ) -> None:
        try:
            while data := await source.read(65536):
                forward, answer = parse(data)
                if answer:
                    back.write(answer)
                    await back.drain()
                if forward:
                    onward.write(forward)
                    await onward.drain()
        except OSError:
            pass  # a reset connection ends this direction; _serve closes both


# --- SQLite -------------------------------------------------------------------------------------


class SqliteTrace:
    """Counts every statement the SQLite library runs on connections opened after
    :meth:`install`, through ``sqlite3.Connection.set_trace_callback``: each is a round trip
    (a call into the library), classified like the wire's. Statements that pysqlite issues by
    itself (the ``BEGIN`` of its implicit transactions, ``COMMIT`` and ``ROLLBACK``) are seen;
    an executemany is one statement per row."""

    def __init__(self, counts: RoundTrips | None = None) -> None:
        self.counts = counts if counts is not None else RoundTrips()
        self._targets: list[Any] = []

    def install(self, target: Any = Engine) -> SqliteTrace:
        """Trace the connections ``target`` (an engine, or every engine by default) opens."""
        event.listen(target, "connect", self._on_connect)
        self._targets.append(target)
        return self

    def remove(self) -> None:
        for target in self._targets:
            event.remove(target, "connect", self._on_connect)
        self._targets.clear()

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        if hasattr(dbapi_connection, "set_trace_callback"):  # other drivers pass untouched
            self.counts.add("connections")
            dbapi_connection.set_trace_callback(self.trace)

    def trace(self, statement: str) -> None:
        self.counts.round_trip()
        self.counts.statement(classify_sql(statement))
