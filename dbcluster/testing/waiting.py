"""Waiting on conditions with deadlines (never bare sleeps), for tests and benchmarks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any


def _time_scale() -> float:
    """``DBCLUSTER_TEST_TIME_SCALE`` (a number, at least 1; default 1): how much longer than
    the fast test settings (``app.FAST_SETTINGS``) a node may go without a heartbeat before
    it is judged, fences itself or is removed, and how much longer :func:`wait_for` waits by
    default. On a loaded 2-core host an in-process node's heartbeat can stall past
    the 900 ms the unscaled settings allow (the node then fences itself, correctly, and a test
    expecting an exact count, an unchanged node id or no takeover fails); a slow machine's CI
    sets a scale instead of every test guessing its own margin. Intervals are not scaled."""
    raw = os.environ.get("DBCLUSTER_TEST_TIME_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"DBCLUSTER_TEST_TIME_SCALE must be a number, not {raw!r}") from None
    if not 1 <= scale < float("inf"):
        raise ValueError(f"DBCLUSTER_TEST_TIME_SCALE must be at least 1 and finite, not {raw!r}")
    return scale


TIME_SCALE = _time_scale()
#: How long :func:`wait_for` waits when the caller names no deadline: long enough for any
#: condition a test expects "soon", stretched with the time scale on a loaded host.
DEFAULT_WAIT_S = 15.0 * TIME_SCALE


def wait_for(
    condition: Callable[[], Any],
    timeout: float | None = None,
    what: str = "condition",
    poll: float = 0.02,
) -> Any:
    """Return the first truthy value of ``condition()``; raise ``TimeoutError`` after
    ``timeout`` seconds (default :data:`DEFAULT_WAIT_S`)."""
    if timeout is None:
        timeout = DEFAULT_WAIT_S
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
