"""Cluster settings: the Java reference's defaults, in milliseconds, overridable in code and by
``DBCLUSTER_<NAME>`` environment variables."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from dbcluster.errors import ConfigurationError


def _host_name() -> str:
    return socket.gethostname() or "node"


@dataclass(frozen=True)
class ClusterSettings:
    heartbeat_interval: int = 3000
    task_polling_interval: int = 1000
    unreachable_threshold: int = 10000
    cleanup_threshold: int = 30000
    sweep_interval: int = 5000
    master_check_interval: int = 500
    orphan_check_interval: int = 1000
    stranded_master_scan_interval: int = 10000
    concurrency_limit: int = 10
    node_id_prefix: str = field(default_factory=_host_name)
    #: How long a graceful stop waits for running partitions before stopping them.
    drain_timeout: int = 30000
    #: How long a master waits for a live node to place a transferable partition on.
    no_node_timeout: int = 60000

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

    def with_overrides(self, **changes: Any) -> ClusterSettings:
        return replace(self, **changes)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> ClusterSettings:
        """Defaults, then ``DBCLUSTER_<NAME>`` variables, then ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"DBCLUSTER_{f.name.upper()}")
            if raw is None:
                continue
            if f.name == "node_id_prefix":
                values[f.name] = raw
                continue
            try:
                values[f.name] = int(raw)
            except ValueError:
                raise ConfigurationError(
                    f"DBCLUSTER_{f.name.upper()} must be an integer (milliseconds), not {raw!r}"
                ) from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def recovery_floor_ms(self) -> int:
        """The least time before a killed node's transferable partitions can move: it must be
        removed (cleanup threshold) and a master must notice (orphan check)."""
        return self.cleanup_threshold + self.orphan_check_interval
