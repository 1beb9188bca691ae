"""PostgreSQL behind a pooler in transaction mode (``?dbcluster_pooler=transaction``: PgBouncer's
``pool_mode = transaction``, or any pooler that hands a server session to a client for one
transaction at a time).

Nothing a session keeps survives from one transaction to the next there, so:

- **Session limits go with each transaction** (PgBouncer 1.18 refuses the ``options`` startup
  parameter that carries them on a direct connection). A transaction's ``BEGIN`` goes out as
  ``BEGIN; SELECT set_config('lock_timeout', ..., true), set_config(...)`` in one simple query:
  the same one round trip as the ``BEGIN`` alone (:func:`pooled_connection_class`). A statement
  of an autocommit engine goes in one pipeline behind the same ``set_config`` read, both before
  one ``Sync``, which makes them one implicit transaction: one round trip, as the statement
  alone (:func:`limit_each_statement`).
- **No server-side prepared statements** (psycopg's ``prepare_threshold=None``): a statement
  prepared on one server session is unknown to the next.
- The provider keeps no session (``keeps_session`` False): a node listens for wake-ups only over
  a direct connection (``listen_url``), and an unclear ``COMMIT`` is judged without ending the
  server process by pid (the one the client sees is the pooler's), so no final write is
  pipelined with its ``COMMIT``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from dbcluster.dialects.base import SessionLimits


def pipelines() -> bool:
    """Whether psycopg has its pipeline mode here (libpq 14 or later), which an autocommit
    statement's limits ride on (:func:`limit_each_statement`)."""
    try:
        import psycopg
    except ImportError:
        return False
    return bool(psycopg.Pipeline.is_supported())


def limits_statement(limits: SessionLimits) -> bytes:
    """One statement that sets ``limits`` for the rest of the transaction it runs in (values are
    integers computed from settings, never user text)."""
    settings = [("lock_timeout", int(limits.lock_timeout_ms))]
    if limits.idle_in_transaction_ms is not None:
        settings.append(("idle_in_transaction_session_timeout", int(limits.idle_in_transaction_ms)))
    calls = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in settings)
    return f"SELECT {calls}".encode()


@functools.cache
def pooled_connection_class() -> type[Any]:
    """A psycopg connection whose every transaction begins with its session limits, in the
    round trip of its ``BEGIN`` (``dbcluster_limits``: the statement of
    :func:`limits_statement`; empty: a plain ``BEGIN``).

    psycopg begins a transaction itself, before the first statement of a non-autocommit
    connection, whichever path the statement takes (SQLAlchemy's or a prebuilt statement's
    cursor): this overrides that step (``_start_query``, psycopg 3.1 to 3.3; a test checks the
    limits are in force inside a transaction)."""
    import psycopg
    from psycopg import errors, generators, pq

    idle = pq.TransactionStatus.IDLE
    fatal = pq.ExecStatus.FATAL_ERROR

    class PooledConnection(psycopg.Connection):  # type: ignore[type-arg]
        dbcluster_limits: bytes = b""

        def _start_query(self) -> Any:
            limits = self.dbcluster_limits
            if not limits or self._autocommit or self.pgconn.transaction_status != idle:
                return (yield from super()._start_query())
            begin = self._get_tx_start_command()
            if self._pipeline:
                # Extended protocol: one statement per message, all before one Sync.
                yield from self._exec_command(begin)
                yield from self._exec_command(limits)
                yield from self._pipeline._sync_gen()
                return None
            self._check_connection_ok()
            self.pgconn.send_query(begin + b"; " + limits)
            for result in (yield from generators.execute(self.pgconn)):
                if result.status == fatal:
                    raise errors.error_from_result(result, encoding=self.pgconn._encoding)
            return None

    return PooledConnection


def connect(cparams: dict[str, Any], cargs: Any, limits: SessionLimits | None) -> Any:
    """A psycopg connection (see :func:`pooled_connection_class`) with ``limits`` on each of
    its transactions."""
    conn = pooled_connection_class().connect(*cargs, **cparams)
    if limits is not None:
        conn.dbcluster_limits = limits_statement(limits)
    return conn


def limit_each_statement(engine: Engine, limits: SessionLimits) -> None:
    """On an autocommit engine: each statement in one pipeline behind :func:`limits_statement`
    (one ``Sync``: one implicit transaction, one round trip). A connection not in autocommit
    mode at that moment is left to its transaction's ``BEGIN``.

    It replaces the engine's own dialect's ``do_execute`` (and its kin), which SQLAlchemy calls
    once every ``do_execute`` listener has let the statement through (a test's or the fault
    harness's see it first, as on any engine); ``dbcluster.prebuilt`` then keeps such an
    engine's statements off the driver's own path, which would pass it by."""
    setting = limits_statement(limits)
    dialect = engine.dialect

    def pipelined(cursor: Any, run: Callable[[], Any]) -> None:
        conn = cursor.connection
        if not getattr(conn, "autocommit", False):
            run()
            return
        with conn.pipeline():
            conn.cursor().execute(setting)
            run()

    execute, execute_no_params = dialect.do_execute, dialect.do_execute_no_params
    executemany = dialect.do_executemany

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        pipelined(cursor, lambda: execute(cursor, statement, parameters, context))

    def do_execute_no_params(cursor: Any, statement: str, context: Any = None) -> None:
        pipelined(cursor, lambda: execute_no_params(cursor, statement, context))

    def do_executemany(cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        pipelined(cursor, lambda: executemany(cursor, statement, parameters, context))

    dialect.do_execute = do_execute  # type: ignore[method-assign]
    dialect.do_execute_no_params = do_execute_no_params  # type: ignore[method-assign]
    dialect.do_executemany = do_executemany  # type: ignore[method-assign]
