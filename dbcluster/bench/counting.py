"""Counts the SQL statements a process executes through SQLAlchemy, by what they touch.

Installed on the :class:`~sqlalchemy.engine.Engine` class, so every engine of the process counts.
This is the statement *breakdown* (which table, which verb); it misses what the driver sends on
its own (``BEGIN``, ``ROLLBACK``, pool pings) and counts an executemany once: the honest round
trips come from :mod:`dbcluster.bench.wire`. On SQLite, whose round trips cannot be seen on a
wire, :func:`install_trace` adds the library's statement trace to the same process.

Worker processes started by the benchmark install both from the bench app module and write their
totals to a file (``DBCLUSTER_BENCH_COUNTS``) every few hundred milliseconds and at exit. Timed
passes run without the statement listeners (``DBCLUSTER_BENCH_STATEMENTS=0`` in the workers,
:func:`uninstall` in the bench process): the counting pass gives the breakdown.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from dbcluster.bench.wire import SqliteTrace

COORDINATION_TABLES = ("batch_partitions", "batch_nodes", "batch_job_coordination")

_lock = threading.Lock()
counts: Counter[str] = Counter()
_installed = False
#: SQLite's statement trace in this process, once :func:`install_trace` ran.
trace: SqliteTrace | None = None
#: More of what this process dumps beside its counts, by name (see :func:`also_dump`).
_sections: dict[str, Callable[[], Any]] = {}


_MAIN_TABLE = re.compile(
    r"^\s*(?:(update)\s+(\w+)|(insert)\s+into\s+(\w+)|(delete)\s+from\s+(\w+)|(select)\b.*?\bfrom\s+(\w+))",
    re.IGNORECASE | re.DOTALL,
)


def classify(statement: str) -> tuple[str, str]:
    """(category, detail): the category is ``coordination`` for a statement whose main table is
    a coordination table, ``repository`` for the job repository, ``other`` for the rest (user
    tables, clock reads); the detail is the verb and the main table."""
    match = _MAIN_TABLE.match(statement)
    if not match:
        return "other", statement.split(None, 1)[0].lower() if statement.strip() else "?"
    groups = [g for g in match.groups() if g]
    verb, table = groups[0].lower(), groups[1].lower()
    if table in COORDINATION_TABLES:
        kind = "coordination"
    elif table.startswith("batch_"):
        kind = "repository"
    else:
        kind = "other"
    return kind, f"{verb} {table}"


def _on_execute(
    conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
) -> None:
    kind, detail = classify(statement)
    with _lock:
        counts[kind] += 1
        counts["total"] += 1
        counts[f"  {detail}"] += 1


def _on_commit(conn: Any) -> None:
    with _lock:
        counts["commit"] += 1


def install() -> None:
    global _installed
    if _installed:
        return
    event.listen(Engine, "before_cursor_execute", _on_execute)
    event.listen(Engine, "commit", _on_commit)
    _installed = True


def uninstall() -> None:
    """Stop counting: a timed pass runs without the listeners (their cost is not dbcluster's)."""
    global _installed
    if not _installed:
        return
    event.remove(Engine, "before_cursor_execute", _on_execute)
    event.remove(Engine, "commit", _on_commit)
    _installed = False


@contextmanager
def statements_counted(on: bool) -> Iterator[None]:
    """Within: SQLAlchemy's statement events counted (``on``) or not; after: as before (the
    listeners are on every engine of the process, a test's too)."""
    was = _installed
    if on:
        install()
    else:
        uninstall()
    try:
        yield
    finally:
        if was:
            install()
        else:
            uninstall()


def install_trace() -> SqliteTrace:
    """Trace every SQLite connection this process opens from now on."""
    global trace
    if trace is None:
        trace = SqliteTrace().install()
    return trace


def snapshot() -> dict[str, int]:
    with _lock:
        return dict(counts)


def reset() -> None:
    with _lock:
        counts.clear()


class Encoded(str):
    """A section's value already in JSON (see :func:`also_dump`): a section that only grows
    encodes what is new since the last dump instead of all of it on every dump."""

    __slots__ = ()


def also_dump(name: str, section: Callable[[], Any] | None) -> None:
    """Have :func:`dump` write ``section()`` under ``name`` too (None: no more); a section may
    answer :class:`Encoded` JSON."""
    if section is None:
        _sections.pop(name, None)
    else:
        _sections[name] = section


def dump(path: str | Path) -> None:
    """Write ``{"at": unix time, "statements": ..., "round_trips": ...}`` atomically, with the
    sections of :func:`also_dump`."""
    target = Path(path)
    tmp = target.with_suffix(".tmp")
    round_trips = trace.counts.snapshot() if trace is not None else {}
    more = {name: section() for name, section in list(_sections.items())}
    plain = {name: value for name, value in more.items() if not isinstance(value, Encoded)}
    text = json.dumps(
        {"at": time.time(), "statements": snapshot(), "round_trips": round_trips, **plain}
    )
    encoded = [f"{json.dumps(name)}: {value}" for name, value in more.items() if name not in plain]
    if encoded:
        text = f"{text[:-1]}, {', '.join(encoded)}}}"
    tmp.write_text(text)
    os.replace(tmp, target)


def start_dumping(path: str, interval_s: float = 0.2) -> None:
    """Write this process's counts to ``path`` now, periodically and at exit."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            dump(path)

    threading.Thread(target=loop, name="dbcluster-bench-counts", daemon=True).start()
    atexit.register(lambda: (stop.set(), dump(path)))
    dump(path)


def read_file(path: str | Path) -> dict[str, Any]:
    """What :func:`dump` last wrote (empty before the first dump)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def read(path: str | Path) -> dict[str, int]:
    """The statement counts :func:`dump` last wrote."""
    return read_file(path).get("statements", {})
