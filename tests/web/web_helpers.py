"""A small HTTP client for the dashboard tests (imported by them)."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


class Served:
    """An app served on 127.0.0.1:<port>, with a small HTTP client (no redirects followed)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def request(
        self,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        req = urllib.request.Request(self.base + path, data=data, headers=headers or {})
        try:
            with _opener.open(req, timeout=30) as response:
                return Reply(response.status, response.read().decode(), dict(response.headers))
        except urllib.error.HTTPError as answered:
            return Reply(answered.code, answered.read().decode(), dict(answered.headers))

    def get(self, path: str, **headers: str) -> Reply:
        return self.request(path, headers=headers)

    def post(self, path: str, body: str = "", **headers: str) -> Reply:
        headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        return self.request(path, data=body.encode(), headers=headers)
