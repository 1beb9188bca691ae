"""Waiting on conditions with deadlines (never bare sleeps), for tests and benchmarks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def wait_for(
    condition: Callable[[], Any], timeout: float = 15.0, what: str = "condition", poll: float = 0.02
) -> Any:
    """Return the first truthy value of ``condition()``; raise ``TimeoutError`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def in_thread(work: Callable[[], Any]) -> dict[str, Any]:
    """Run ``work`` on a daemon thread; the dict gets ``result`` or ``error``, and ``thread``."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    out["thread"] = thread
    thread.start()
    return out
