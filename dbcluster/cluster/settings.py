"""Cluster settings: the Java reference's defaults, in milliseconds, overridable in code and by
``DBCLUSTER_<NAME>`` environment variables.

A duration in a variable (or a command-line option) is a number of milliseconds (``3000``) or
a number with a unit: ``500ms``, ``30s``, ``2m``, ``1h``, ``30d`` (also ``w``; fractions such
as ``1.5s`` too). A ``DBCLUSTER_*`` variable that dbcluster does not read is named in one
warning, with the nearest known name (:func:`unknown_variables`).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from dbcluster.errors import ConfigurationError

FAILOVER_MODES = ("takeover", "abandon")
#: Settings that are text, not milliseconds.
_TEXT = ("node_id_prefix", "master_failover", "listen_url")
#: Settings that are counts, not milliseconds.
_COUNTS = ("concurrency_limit", "prefetch_multiplier", "commit_group_size")
#: Settings that are on or off (``DBCLUSTER_<NAME>``: true/false, yes/no, on/off, 1/0).
_FLAGS = ("carried_wakeups",)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: Settings whose None means "derived from the others".
_DERIVED = ("idle_transaction_timeout",)
#: Settings whose None means "off".
_OPTIONAL = ("prune_after", "listen_url")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
#: How a duration is written, for messages.
DURATION_FORMS = "500ms, 30s, 2m, 1h, 30d"


def parse_duration(text: str, *, bare: str = "ms", what: str = "duration") -> int:
    """Milliseconds of a duration: a number with a unit (``500ms``, ``30s``, ``2m``, ``1h``,
    ``30d``, ``2w``; ``1.5s``), or a bare number, read in the unit ``bare`` (milliseconds
    wherever milliseconds were taken before units were; seconds for options that took
    seconds). A negative or malformed one is a :class:`ConfigurationError` naming ``what``."""
    raw = "" if text is None else str(text)
    if raw.strip().startswith("-"):
        raise ConfigurationError(f"invalid {what} {raw!r}: it must not be negative")
    found = _DURATION.match(raw)
    if found is None:
        raise ConfigurationError(
            f"invalid {what} {raw!r}: use a number and a unit, e.g. {DURATION_FORMS} "
            f"(a bare number is {_UNIT_NAMES[bare]})"
        )
    unit = (found.group(2) or bare).lower()
    return round(float(found.group(1)) * _UNIT_MS[unit])


_UNIT_NAMES = {"ms": "milliseconds", "s": "seconds"}


_AGE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|w)\s*$", re.IGNORECASE)


def parse_age(text: str) -> int:
    """Milliseconds of an age like ``30d``, ``12h``, ``90m``, ``45s`` (or ``w``, ``ms``): a
    whole number whose unit must be given (an age decides what is deleted: a bare ``30`` is
    more likely days than milliseconds, so it is refused). A negative, unit-less or malformed
    one is a :class:`ConfigurationError`."""
    if (text or "").strip().startswith("-"):
        raise ConfigurationError(f"invalid age {text!r}: an age must not be negative")
    found = _AGE.match(text or "")
    if found is None:
        raise ConfigurationError(
            f"invalid age {text!r}: use a whole number and a unit, e.g. 30d, 12h, 90m, 45s"
        )
    return int(found.group(1)) * _UNIT_MS[found.group(2).lower()]


def host_name() -> str:
    """This machine's name (a node's registered host, the default node id prefix)."""
    return socket.gethostname() or "node"


@dataclass(frozen=True)
class ClusterSettings:
    heartbeat_interval: int = 3000
    task_polling_interval: int = 1000
    #: How often an idle node polls while its wake-ups arrive (PostgreSQL's LISTEN/NOTIFY, its
    #: listening connection up): the bound on what a lost notification costs. Without
    #: wake-ups, or while the listener is down, it polls every ``task_polling_interval``.
    wakeup_poll_interval: int = 10000
    unreachable_threshold: int = 10000
    cleanup_threshold: int = 30000
    sweep_interval: int = 5000
    master_check_interval: int = 500
    orphan_check_interval: int = 1000
    stranded_master_scan_interval: int = 10000
    concurrency_limit: int = 10
    node_id_prefix: str = field(default_factory=host_name)
    #: How long a graceful stop waits for running partitions before stopping them.
    drain_timeout: int = 30000
    #: How long a master waits for a live node to place a transferable partition on.
    no_node_timeout: int = 60000
    #: How long a dbcluster session may sit idle inside an open transaction before the server
    #: ends it (where the database can): a frozen process must not hold a partition's row until
    #: the cleanup threshold. None: ``unreachable_threshold``. Keep transactions shorter.
    idle_transaction_timeout: int | None = None
    #: How long a PENDING partition waits for the node it was placed on before any node with
    #: free capacity may claim it (a partition of a node silent for ``unreachable_threshold``
    #: may be claimed at once).
    work_stealing_delay: int = 5000
    #: Partitions a node may hold per slot of ``concurrency_limit``, running or claimed ahead
    #: to start as slots free up, while its recent partitions are short and transferable (see
    #: ``cluster/worker.py``); 1 (the default): it claims only for free slots. Claimed ahead,
    #: a partition is CLAIMED: if its node is killed, it moves when the node is removed
    #: (``cleanup_threshold``), not when the node turns unreachable as an unclaimed one does.
    prefetch_multiplier: int = 1
    #: Up to this many short partitions of a tasklet step declared ``transactional`` run in one
    #: transaction on a slot (grouped commits: docs/cluster.md); 1: each in its own.
    commit_group_size: int = 8
    #: Where wake-ups carry a payload (PostgreSQL): a placement's wake-up also carries the job
    #: and step executions of partitions of a tasklet step declared ``transactional``, and an
    #: idle node runs them at once, their claim riding in their first transaction
    #: (docs/cluster.md). Any role that may connect to the database may LISTEN: with secrets in
    #: job parameters or partition contexts, turn this off (wake-ups then name ids only).
    carried_wakeups: bool = True
    #: What a survivor does with a job whose master is gone: ``takeover`` (it becomes the master
    #: under the next epoch and finishes the job in the same execution) or ``abandon`` (it fails
    #: the job, to be restarted).
    master_failover: str = "takeover"
    #: Nodes prune finished executions that ended longer ago than this (one node at a time,
    #: see ``cluster/maintenance/pruner.py``); None: they do not.
    prune_after: int | None = None
    #: How often the pruning node looks for executions to prune.
    prune_interval: int = 60000
    #: A URL to the same database that reaches the server directly (not through a pooler in
    #: transaction mode), for the node's one listening connection (wake-ups): see
    #: docs/databases.md, "PgBouncer". None: the node listens on a connection of its own URL
    #: where that keeps its session, and polls otherwise. Never printed (it may hold a password).
    listen_url: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "node_id_prefix":
                if not isinstance(value, str) or not value or len(value) > 60:
                    raise ConfigurationError(
                        "node_id_prefix must be 1 to 60 characters (the node id adds a uuid)"
                    )
                continue
            if f.name == "listen_url":
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    raise ConfigurationError("listen_url must be a database URL, or unset")
                continue
            if f.name == "master_failover":
                if value not in FAILOVER_MODES:
                    raise ConfigurationError(
                        f"master_failover must be one of {', '.join(FAILOVER_MODES)}, not {value!r}"
                    )
                continue
            if f.name in _FLAGS:
                if not isinstance(value, bool):
                    raise ConfigurationError(f"{f.name} must be true or false, not {value!r}")
                continue
            if value is None and f.name in _DERIVED + _OPTIONAL:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigurationError(f"{f.name} must be an integer, not {value!r}")
            minimum = 0 if f.name == "concurrency_limit" else 1
            if value < minimum:
                raise ConfigurationError(f"{f.name} must be at least {minimum}, not {value}")
        if self.unreachable_threshold <= self.heartbeat_interval:
            raise ConfigurationError(
                f"unreachable_threshold ({self.unreachable_threshold} ms) must be above "
                f"heartbeat_interval ({self.heartbeat_interval} ms), or live nodes look dead"
            )
        if self.cleanup_threshold <= self.unreachable_threshold:
            raise ConfigurationError(
                f"cleanup_threshold ({self.cleanup_threshold} ms) must be above "
                f"unreachable_threshold ({self.unreachable_threshold} ms)"
            )
        limit = self.cleanup_threshold - self.heartbeat_interval
        if self.idle_transaction_ms >= limit:
            raise ConfigurationError(
                f"idle_transaction_timeout ({self.idle_transaction_ms} ms) must be below "
                f"cleanup_threshold - heartbeat_interval ({limit} ms): a frozen node's "
                f"transaction must end before its partitions can move"
            )

    @property
    def idle_transaction_ms(self) -> int:
        """The idle-in-transaction bound in force (see ``idle_transaction_timeout``)."""
        if self.idle_transaction_timeout is not None:
            return self.idle_transaction_timeout
        return self.unreachable_threshold

    @property
    def coordination_lock_timeout_ms(self) -> int:
        """Lock wait bound of coordination statements (heartbeats, claims, sweeps, master
        writes): short, so a heartbeat stuck behind a lock is repeated well inside the
        unreachable threshold."""
        return min(5000, max(100, self.unreachable_threshold // 3))

    @property
    def work_lock_timeout_ms(self) -> int:
        """Lock wait bound of step transactions: as long as a frozen holder can keep a lock
        where the server ends idle transactions."""
        return self.idle_transaction_ms

    def with_overrides(self, **changes: Any) -> ClusterSettings:
        return replace(self, **changes)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> ClusterSettings:
        """Defaults, then ``DBCLUSTER_<NAME>`` variables, then ``overrides``."""
        env = os.environ if environ is None else environ
        warn_unknown_variables(env)
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f"DBCLUSTER_{f.name.upper()}"
            raw = env.get(name)
            if raw is None:
                continue
            if f.name in _FLAGS:
                flag = raw.strip().lower()
                if flag not in _TRUE + _FALSE:
                    raise ConfigurationError(f"{name} must be true or false, not {raw!r}")
                values[f.name] = flag in _TRUE
            elif f.name in _TEXT:
                values[f.name] = raw
            elif f.name in _COUNTS:
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise ConfigurationError(
                        f"{name} must be a whole number, not {raw!r}"
                    ) from None
            else:
                values[f.name] = parse_duration(raw, what=name)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def recovery_floor_ms(self) -> int:
        """The least time before a killed node's transferable partitions can move: it must be
        removed (cleanup threshold) and a master must notice (orphan check)."""
        return self.cleanup_threshold + self.orphan_check_interval


# --- the DBCLUSTER_* variables ----------------------------------------------------------------

#: Every ``DBCLUSTER_*`` variable dbcluster reads besides the settings above (docs/cli.md).
VARIABLES = (
    "DBCLUSTER_URL",
    "DBCLUSTER_APP",
    "DBCLUSTER_CONNECT_TIMEOUT",
    "DBCLUSTER_OTEL",
    "DBCLUSTER_ACCEPT_LAUNCHES",
    "DBCLUSTER_LOG_LEVEL",
    "DBCLUSTER_LOG_FORMAT",
    "DBCLUSTER_WEB_TOKEN",
    "DBCLUSTER_WEB_PUBLIC_READ",
    "DBCLUSTER_DEMO_URL",
    "DBCLUSTER_SUITE_URL",
)
#: Families of variables read by the test, benchmark and fault-injection tools.
VARIABLE_PREFIXES = ("DBCLUSTER_TEST_", "DBCLUSTER_BENCH_", "DBCLUSTER_FAULT_", "DBCLUSTER_CI_")
_warned: set[str] = set()
log = logging.getLogger("dbcluster.settings")


def known_variables() -> list[str]:
    return [*VARIABLES, *(f"DBCLUSTER_{f.name.upper()}" for f in fields(ClusterSettings))]


def unknown_variables(names: Iterable[str]) -> list[str]:
    """One line for each ``DBCLUSTER_*`` name that dbcluster does not read, with the nearest
    known name where one is close (a misspelled setting is otherwise silently ignored)."""
    known = known_variables()
    lines = []
    for name in sorted(n for n in names if n.startswith("DBCLUSTER_")):
        if name in known or name.startswith(VARIABLE_PREFIXES):
            continue
        # Compared without the prefix that every name shares.
        near = difflib.get_close_matches(name[10:], [k[10:] for k in known], n=1, cutoff=0.6)
        hint = f" (did you mean DBCLUSTER_{near[0]}?)" if near else ""
        lines.append(f"unknown environment variable {name} is ignored{hint}")
    return lines


def warn_unknown_variables(environ: Mapping[str, str], echo: Any = None) -> None:
    """Warn once per process about each unknown ``DBCLUSTER_*`` variable: through ``echo``
    (the command line's one line on stderr) or, without it, a logged WARNING."""
    for line in unknown_variables(environ):
        if line in _warned:
            continue
        _warned.add(line)
        if echo is not None:
            echo(f"warning: {line}")
        else:
            log.warning("%s", line)
