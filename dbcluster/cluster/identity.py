"""One membership of the cluster under one node id."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Identity:
    """A node id and whether it is fenced. Node ids are never reused: a node that was fenced
    rejoins under a new one, and nothing is ever written again under the old."""

    node_id: str
    joined_at: float = field(default_factory=time.monotonic)
    last_heartbeat_ok: float = field(default_factory=time.monotonic)
    fenced: threading.Event = field(default_factory=threading.Event)
    fence_reason: str = ""

    @property
    def is_fenced(self) -> bool:
        return self.fenced.is_set()
