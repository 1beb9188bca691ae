"""Fixtures for the dashboard: the app served by uvicorn on a loopback port, in this process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from web_helpers import Served

pytest.importorskip("starlette", reason="the web extra is not installed")
pytest.importorskip("uvicorn", reason="the web extra is not installed")

import uvicorn  # noqa: E402


@pytest.fixture
def serve() -> Iterator[Callable[[Any], Served]]:
    """Serve an ASGI app on a free loopback port until the test ends."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any) -> Served:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                pytest.fail("the dashboard did not start")
            time.sleep(0.02)
        servers.append((server, thread))
        return Served(f"http://127.0.0.1:{port}")

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)
