"""A database that is away, then back: a loopback port that refuses connections until the test
says the server is back, then forwards each connection to the real server (imported by the
tests). Deterministic: the port is bound from the start (nobody else can take it) and refuses
because nothing listens on it yet, as a stopped server's port does."""

from __future__ import annotations

import socket
import threading


class ComingBack:
    """A port that refuses connections until :meth:`come_back` (``with`` closes it)."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> ComingBack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def come_back(self, host: str, port: int) -> None:
        """From now on, accept connections and forward each to ``host:port``."""
        self._listener.listen(64)
        threading.Thread(
            target=self._accept, args=(host, port), name="coming-back", daemon=True
        ).start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sockets, self._open = [self._listener, *self._open], []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, host: str, port: int) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection((host, port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed.is_set():
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(source, target), name="coming-back-pump", daemon=True
                ).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            try:
                target.shutdown(socket.SHUT_WR)
            except OSError:
                pass
