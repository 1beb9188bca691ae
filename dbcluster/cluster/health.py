"""Health and readiness of a node, and a small HTTP server for its probes (and its metrics).

- ``/healthz``: 200 while the node heartbeats under a live id; 503 when it is fenced (its row was
  removed, or it could not heartbeat for ``unreachable_threshold``), draining (a graceful stop
  began) or its heartbeat is older than ``unreachable_threshold``. A Kubernetes liveness probe
  that restarts a pod on 503 restarts a node that no longer takes part.
- ``/readyz``: 200 when the node can take work: healthy, with a worker (capacity above 0) whose
  poller runs and whose claims work (see :mod:`dbcluster.cluster.worker`). A node busy with
  ``concurrency_limit`` partitions is still ready (it will poll again as soon as one ends); its
  body says how many slots are free.

Both answer JSON with what they judged. The server is the standard library's, one thread per
request, so it needs no extra and never touches the database.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dbcluster.cluster.context import NodeContext
    from dbcluster.cluster.worker import Worker

log = logging.getLogger("dbcluster.node")

#: status code, body, content type
Response = tuple[int, bytes, str]


class Probed(Protocol):
    """What the probes read of a node (a :class:`~dbcluster.cluster.node.Node` is one): its
    context (membership, settings), its capacity and its worker (None: it runs no
    partitions)."""

    @property
    def context(self) -> NodeContext: ...

    @property
    def capacity(self) -> int: ...

    @property
    def worker(self) -> Worker | None: ...


def _state(node: Probed) -> dict[str, Any]:
    membership = node.context.membership
    identity = membership.current
    age = None if identity is None else time.monotonic() - identity.last_heartbeat_ok
    return {
        "node_id": None if identity is None else identity.node_id,
        "fenced": membership.is_fenced,
        "fence_reason": None if identity is None else identity.fence_reason or None,
        "draining": membership.stopping,
        "heartbeat_age_s": None if age is None else round(age, 3),
        "load": 0 if node.worker is None else node.worker.load,
        "capacity": node.capacity,
    }


def health(node: Probed) -> tuple[bool, dict[str, Any]]:
    """Whether the node is alive in the cluster, and what that was judged from."""
    state = _state(node)
    limit_s = node.context.settings.unreachable_threshold / 1000
    if state["node_id"] is None:
        reason = "not joined"
    elif state["fenced"]:
        reason = f"fenced: {state['fence_reason'] or 'no reason given'}"
    elif state["draining"]:
        reason = "draining: a graceful stop began"
    elif state["heartbeat_age_s"] >= limit_s:
        reason = f"no heartbeat for {state['heartbeat_age_s']:.1f} s"
    else:
        reason = None
    return reason is None, {**state, "status": "ok" if reason is None else reason}


def readiness(node: Probed) -> tuple[bool, dict[str, Any]]:
    """Whether the node can take work now."""
    ok, state = health(node)
    worker = node.worker
    if ok and (worker is None or node.capacity <= 0):
        ok, state["status"] = False, "takes no partitions (capacity 0)"
    elif ok and worker is not None and worker.stopped:
        ok, state["status"] = False, "its poller stopped"
    elif ok and worker is not None and worker.withdrawn is not None:
        ok, state["status"] = False, f"takes no partitions for now: {worker.withdrawn}"
    state["free_slots"] = max(0, node.capacity - state["load"])
    return ok, state


def _json(ok: bool, body: dict[str, Any]) -> Response:
    return 200 if ok else 503, json.dumps(body).encode(), "application/json"


def probe_routes(node: Probed) -> dict[str, Callable[[], Response]]:
    """``/healthz`` and ``/readyz`` of ``node``."""
    return {
        "/healthz": lambda: _json(*health(node)),
        "/readyz": lambda: _json(*readiness(node)),
    }


class EndpointServer:
    """Serves GET routes (path -> a function returning a :data:`Response`) on a thread."""

    def __init__(self, host: str, port: int, routes: dict[str, Callable[[], Response]]) -> None:
        self.routes = dict(routes)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                route = owner.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, body, kind = 404, b"not found\n", "text/plain"
                else:
                    try:
                        status, body, kind = route()
                    except Exception as exc:  # noqa: BLE001 - one failed probe, not the node
                        log.exception("endpoint %s failed", self.path)
                        status, body, kind = 500, f"{exc}\n".encode(), "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("endpoint: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="dbcluster-endpoints", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on (the one the system chose, when started on port 0)."""
        return int(self._server.server_address[1])

    def start(self) -> EndpointServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
