"""What a database server says about itself: its connection limit, its own statement and
transaction counters, and (when it runs on this machine) the CPU its processes used.

The server's counters are the honest count where a proxy cannot go cheaply (a thousand
connections): each server counts what it executed. They are server-wide (MariaDB) or
database-wide (PostgreSQL), so a measurement window is read beside a background window of the
same server with nothing of ours running.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from dbcluster.bench import counting
from dbcluster.bench.wire import KINDS, classify_sql

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> tuple[str, int, float] | None:
    """(command name, parent pid, CPU seconds used) of a local process, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    # After the name: state, ppid, ..., utime (14th field overall), stime (15th).
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _cpu_of_tree(root: int, names: tuple[str, ...]) -> float | None:
    """CPU seconds of ``root`` and its children, if ``root`` is a local process named one of
    ``names`` (a server on another machine: None)."""
    found = _proc_stat(root)
    if found is None or found[0] not in names:
        return None
    total = found[2]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != root:
            child = _proc_stat(int(entry))
            if child is not None and child[1] == root:
                total += child[2]
    return total


@dataclass
class Counters:
    """One reading of a server's counters: ``statements`` (None where the server does not
    count them), ``transactions`` (likewise), statements by kind, CPU seconds."""

    statements: int | None
    transactions: int | None
    by_kind: dict[str, int]
    cpu_s: float | None


class ServerProbe:
    """The default: a server we know nothing about (counts nothing, limits nothing)."""

    #: What the counters count, for the report.
    counts = "nothing: no server-side counters read for this database"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def max_connections(self) -> int | None:
        """The server's connection limit (None: no limit we know of)."""
        return None

    def reserved_connections(self) -> int:
        """Connections of the limit kept for administrators."""
        return 0

    def connections_in_use(self) -> int:
        return 0

    def read(self) -> Counters:
        return Counters(None, None, {}, None)

    def lock_waiters(self) -> int | None:
        """Sessions of this database waiting for a lock now (None: the probe cannot tell)."""
        return None


class PostgresProbe(ServerProbe):
    """``pg_stat_database`` (this database's commits and rollbacks: each is a transaction) and,
    where the server preloads it, ``pg_stat_statements`` (every statement, by its text, BEGIN
    and COMMIT included). CPU: the postmaster and its children, found through our backend's pid."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._statements = self._enable_statements()
        self.counts = (
            "pg_stat_statements calls (statements) and pg_stat_database xact_commit + "
            "xact_rollback (transactions), this database only"
            if self._statements
            else "pg_stat_database xact_commit + xact_rollback (transactions), this database "
            "only; statements not counted (pg_stat_statements is not preloaded)"
        )
        with engine.connect() as conn:
            backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        found = _proc_stat(backend)
        self._postmaster = found[1] if found is not None and found[0] == "postgres" else None

    def _enable_statements(self) -> bool:
        try:
            with self.engine.begin() as conn:
                conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            with self.engine.connect() as conn:
                conn.execute(text("SELECT count(*) FROM pg_stat_statements")).scalar_one()
            return True
        except Exception:  # noqa: BLE001 - not preloaded or not installed: transactions only
            return False

    def max_connections(self) -> int | None:
        with self.engine.connect() as conn:
            return int(conn.execute(text("SHOW max_connections")).scalar_one())

    def reserved_connections(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text("SHOW superuser_reserved_connections")).scalar_one())

    def connections_in_use(self) -> int:
        with self.engine.connect() as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            return int(conn.execute(text(query)).scalar_one())

    def lock_waiters(self) -> int | None:
        with self.engine.connect() as conn:
            query = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            return int(conn.execute(text(query)).scalar_one())

    def read(self) -> Counters:
        by_kind: dict[str, int] = {}
        statements: int | None = None
        with self.engine.connect() as conn:
            transactions = int(
                conn.execute(
                    text(
                        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                        "WHERE datname = current_database()"
                    )
                ).scalar_one()
            )
            if self._statements:
                rows = conn.execute(
                    text(
                        "SELECT query, calls FROM pg_stat_statements "
                        "WHERE dbid = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database())"
                    )
                ).all()
                statements = 0
                for query, calls in rows:
                    kind = classify_sql(query or "")
                    by_kind[kind] = by_kind.get(kind, 0) + int(calls)
                    statements += int(calls)
        cpu = _cpu_of_tree(self._postmaster, ("postgres",)) if self._postmaster else None
        return Counters(statements, transactions, by_kind, cpu)


_MYSQL_KINDS = {
    "Com_begin": "begin",
    "Com_commit": "commit",
    "Com_rollback": "rollback",
    "Com_admin_commands": "ping",
    "Com_select": "select",
    "Com_insert": "insert",
    "Com_update": "update",
    "Com_delete": "delete",
}


class MySQLProbe(ServerProbe):
    """``SHOW GLOBAL STATUS``: ``Questions`` (statements clients sent), the ``Com_*`` counters
    by kind (``Com_admin_commands`` counts pings), commits and rollbacks as transactions
    (``Com_commit`` + ``Com_rollback``; statements autocommitted on their own are not among
    them). Server-wide. CPU: the server process, found through ``@@pid_file``."""

    counts = (
        "SHOW GLOBAL STATUS Questions (statements) and Com_commit + Com_rollback "
        "(transactions), server-wide"
    )

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._pid: int | None = None
        with engine.connect() as conn:
            pid_file = conn.execute(text("SELECT @@pid_file")).scalar()
        try:
            self._pid = int(Path(str(pid_file)).read_text().strip())
        except (OSError, ValueError):
            self._pid = None

    def max_connections(self) -> int | None:
        with self.engine.connect() as conn:
            return int(conn.execute(text("SELECT @@max_connections")).scalar_one())

    def _status(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(text("SHOW GLOBAL STATUS")).all()
        return {name: int(value) for name, value in rows if str(value).isdigit()}

    def connections_in_use(self) -> int:
        return self._status().get("Threads_connected", 0)

    def lock_waiters(self) -> int | None:
        with self.engine.connect() as conn:
            query = (
                "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
            )
            return int(conn.execute(text(query)).scalar_one())

    def read(self) -> Counters:
        status = self._status()
        by_kind = {kind: status.get(name, 0) for name, kind in _MYSQL_KINDS.items()}
        transactions = by_kind["commit"] + by_kind["rollback"]
        cpu = _cpu_of_tree(self._pid, ("mariadbd", "mysqld")) if self._pid else None
        return Counters(status.get("Questions"), transactions, by_kind, cpu)


class SqliteProbe(ServerProbe):
    """SQLite has no server: the library's statement trace in the processes that use it counts
    for it, each written to one of ``trace_files`` (see :func:`dbcluster.bench.counting.dump`)."""

    counts = "sqlite3's statement trace in the load generator (every statement the library ran)"

    def __init__(self, engine: Engine, trace_files: list[str]) -> None:
        super().__init__(engine)
        self.trace_files = trace_files

    def read(self) -> Counters:
        found: dict[str, int] = {}
        for path in self.trace_files:
            for key, value in counting.read_file(path).get("round_trips", {}).items():
                found[key] = found.get(key, 0) + value
        return Counters(
            found.get("statements", 0),
            found.get("commit", 0) + found.get("rollback", 0),
            {k: found.get(k, 0) for k in KINDS},
            None,
        )


PROBES: dict[str, Callable[[Engine], ServerProbe]] = {
    "postgresql": PostgresProbe,
    "mysql": MySQLProbe,
    "mariadb": MySQLProbe,
}


def probe_for(engine: Engine) -> ServerProbe:
    return PROBES.get(engine.url.get_backend_name(), ServerProbe)(engine)


def rates(before: Counters, after: Counters, seconds: float) -> dict[str, Any]:
    """Per-second rates between two readings (None where a counter is not read)."""

    def rate(a: float | None, b: float | None, scale: float = 1.0) -> float | None:
        if a is None or b is None or seconds <= 0:
            return None
        return round((b - a) / seconds * scale, 1)

    return {
        "statements_per_s": rate(before.statements, after.statements),
        "transactions_per_s": rate(before.transactions, after.transactions),
        "by_kind_per_s": {
            kind: rate(before.by_kind.get(kind, 0), after.by_kind[kind])
            for kind in KINDS
            if kind in after.by_kind
        },
        "cpu_percent": rate(before.cpu_s, after.cpu_s, 100.0),
    }
