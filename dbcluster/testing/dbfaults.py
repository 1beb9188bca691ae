"""Faults of the database itself for ``dbcluster chaos``: a restart, a crash, a switchover, a
Galera node killed and rejoined (issue 34).

The harness does not know how the database is run: each kind is a command the user gives
(``--db-restart 'ci/ha.sh pg restart 3'``). Commands run one at a time, in plan order, on a
thread of their own (a restart takes seconds; the run's loop goes on meanwhile), without a shell:
the string is split like a command line, and ``{node}`` is replaced by the 1-based position of the
targeted database URL (``galera-kill``). Each fault's record says when its command started and
ended, its exit status and the tail of its output.

Also here: the scan of the node logs that the report's "quiet logs" line rests on.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Database fault kinds. ``dbrestart``/``dbcrash``/``switchover``: the database (every URL of
#: the run) goes away and comes back, through the user's command. ``galera-kill``: one node of a
#: multi-URL cluster is killed, then rejoined after the fault's duration.
DB_KINDS = ("dbrestart", "dbcrash", "switchover", "galera-kill")
#: The option that gives each kind's command (``galera-kill`` needs ``--db-rejoin`` too).
DB_OPTIONS = {
    "dbrestart": "--db-restart",
    "dbcrash": "--db-crash",
    "switchover": "--db-switchover",
    "galera-kill": "--db-kill",
}
#: Seconds one database command may take before it is killed (and recorded as failed).
COMMAND_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DbControl:
    """The commands that act on the database (each a command line; ``None``: not available)."""

    restart: str | None = None
    crash: str | None = None
    switchover: str | None = None
    kill: str | None = None
    rejoin: str | None = None

    def command_for(self, kind: str) -> str | None:
        return {
            "dbrestart": self.restart,
            "dbcrash": self.crash,
            "switchover": self.switchover,
            "galera-kill": self.kill,
        }[kind]

    def available(self) -> tuple[str, ...]:
        """The database kinds these commands make possible."""
        kinds = [k for k in DB_KINDS if self.command_for(k)]
        if "galera-kill" in kinds and not self.rejoin:
            kinds.remove("galera-kill")
        return tuple(kinds)

    def missing(self, kinds: Iterable[str]) -> list[str]:
        """One message per requested database kind whose command is not given."""
        out = []
        for kind in kinds:
            if kind not in DB_KINDS:
                continue
            if not self.command_for(kind):
                out.append(f"fault kind {kind} needs {DB_OPTIONS[kind]} COMMAND")
            elif kind == "galera-kill" and not self.rejoin:
                out.append("fault kind galera-kill needs --db-rejoin COMMAND too")
        return out


def command_line(command: str, node: int | None = None) -> list[str]:
    """The argument list of ``command`` (``{node}`` replaced), split as a shell would split it."""
    if node is not None:
        command = command.replace("{node}", str(node))
    return shlex.split(command)


def run_command(command: str, node: int | None = None, cwd: str | Path | None = None) -> dict:
    """Run one database command to its end; what it did, for the report."""
    args = command_line(command, node)
    began = time.monotonic()
    try:
        done = subprocess.run(
            args,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        code: int | None = done.returncode
        output = (done.stdout + done.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired as exc:
        code = None
        output = f"timed out after {COMMAND_TIMEOUT_S:.0f} s: {exc}"
    except OSError as exc:
        code = None
        output = f"could not run {args[0]!r}: {exc}"
    return {
        "command": " ".join(shlex.quote(a) for a in args),
        "exit_code": code,
        "seconds": round(time.monotonic() - began, 3),
        "output_tail": output.strip()[-600:],
    }


class DbFaultRunner:
    """Runs database faults one after another on a thread of its own.

    ``submit`` queues a fault (its record is filled in as it runs); ``busy`` says whether one is
    queued or running. ``now`` gives the run's clock (seconds since its start) for the records."""

    def __init__(self, control: DbControl, now: Callable[[], float], say: Callable[[str], None]):
        self.control = control
        self._now = now
        self._say = say
        self._queue: list[tuple[dict[str, Any], str, float, int | None]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._running = False
        self._thread = threading.Thread(target=self._run, name="db-faults", daemon=True)
        self._thread.start()

    def submit(self, record: dict[str, Any], kind: str, duration: float, node: int | None) -> None:
        with self._lock:
            self._queue.append((record, kind, duration, node))
        self._wake.set()

    def busy(self) -> bool:
        with self._lock:
            return self._running or bool(self._queue)

    def close(self, timeout: float = COMMAND_TIMEOUT_S) -> None:
        """Finish what is queued (a killed Galera node must be rejoined), then stop."""
        deadline = time.monotonic() + timeout
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.1)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            while True:
                with self._lock:
                    if not self._queue:
                        break
                    item = self._queue.pop(0)
                    self._running = True
                try:
                    self._apply(*item)
                finally:
                    with self._lock:
                        self._running = False

    def _apply(self, record: dict[str, Any], kind: str, duration: float, node: int | None) -> None:
        command = self.control.command_for(kind)
        assert command is not None
        record["started_s"] = round(self._now(), 3)
        steps = [run_command(command, node)]
        if kind == "galera-kill":
            self._say(f"fault {record['index']} galera-kill: node {node} down for {duration} s")
            time.sleep(duration)
            assert self.control.rejoin is not None
            steps.append(run_command(self.control.rejoin, node))
        record["ended_s"] = round(self._now(), 3)
        record["commands"] = steps
        record["ok"] = all(s["exit_code"] == 0 for s in steps)
        state = "done" if record["ok"] else "FAILED"
        self._say(
            f"fault {record['index']} {kind}: {state} in "
            f"{record['ended_s'] - record['started_s']:.1f} s ({steps[-1]['command']})"
        )


#: A record's first line: the time (``2026-12-03T08:56:43.912Z``, as ``dbcluster.logs`` writes
#: it, or logging's default ``2026-12-03 08:56:43,912``), the level and the logger.
_ERROR_LINE = re.compile(r"^\S+(?: \S+)? (ERROR|CRITICAL) (\S+?):")
_WARNING_LINE = re.compile(r"^\S+(?: \S+)? WARNING (\S+?):")
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def scan_logs(paths: Iterable[Path]) -> dict[str, Any]:
    """ERROR (and CRITICAL) lines, WARNING lines and tracebacks in the node logs (the format of
    ``dbcluster worker``/``launch``: ``date time LEVEL logger: message``), with the most frequent
    ERROR messages. A chained traceback (an exception raised from another) counts once."""
    errors = warnings = tracebacks = 0
    messages: dict[str, int] = {}
    per_file: dict[str, dict[str, int]] = {}
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        counts = {"errors": 0, "warnings": 0, "tracebacks": 0}
        chained = False  # the next traceback is the cause of the one before (one record)
        for line in text.splitlines():
            if line.startswith(_CHAINED):
                chained = True
            elif line.startswith("Traceback (most recent call last)"):
                counts["tracebacks"] += 0 if chained else 1
                chained = False
            elif found := _ERROR_LINE.match(line):
                counts["errors"] += 1
                message = line[found.end() :].strip()
                key = f"{found.group(2)}: {re.sub(r'[0-9]+', 'N', message)[:100]}"
                messages[key] = messages.get(key, 0) + 1
            elif _WARNING_LINE.match(line):
                counts["warnings"] += 1
        errors += counts["errors"]
        warnings += counts["warnings"]
        tracebacks += counts["tracebacks"]
        if any(counts.values()):
            per_file[path.name] = counts
    top = sorted(messages.items(), key=lambda kv: -kv[1])[:15]
    return {
        "errors": errors,
        "warnings": warnings,
        "tracebacks": tracebacks,
        "top_errors": [{"message": m, "count": c} for m, c in top],
        "per_file": per_file,
    }


def first_execution_check(
    outcomes: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """Violations of "every job COMPLETED in its first execution": ``outcomes`` maps a job to its
    ``executions`` (statuses, oldest first) and ``relaunches`` (launch processes repeated before
    its execution existed)."""
    out = []
    for job, seen in outcomes.items():
        statuses = list(seen["executions"])
        if not statuses:
            out.append(f"{job}: no execution")
        elif len(statuses) > 1 or statuses[0] != "COMPLETED":
            out.append(f"{job}: executions {' -> '.join(statuses)}")
        if seen.get("relaunches"):
            out.append(
                f"{job}: its launch was repeated {seen['relaunches']} time(s) before its "
                "execution existed (the launch command failed)"
            )
    return out
