"""What every dashboard response carries to keep browsers from misusing it.

- ``Content-Security-Policy``: scripts, styles, images and fetches from the dashboard itself
  only (the pages inline no script; bar widths are ``style`` attributes), forms post only to
  it, no ``<base>``, and no page of another site may frame it (``frame-ancestors 'none'``).
- ``X-Frame-Options: DENY``: the same for browsers that predate ``frame-ancestors``.
- ``X-Content-Type-Options: nosniff``: a response is only what its type says.
- ``Referrer-Policy: no-referrer``: a page's address (execution ids, filters) is not sent to a
  link's target.
- ``Cache-Control: no-store`` on everything but the static assets: pages hold job parameters
  and errors, which no shared cache should keep.
"""

from __future__ import annotations

from typing import Any

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """ASGI middleware adding :data:`HEADERS` (and ``Cache-Control: no-store`` outside
    ``/static/``) to every HTTP response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = list(HEADERS)
        if not scope.get("path", "").startswith("/static/"):
            extra.append((b"cache-control", b"no-store"))

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                headers = list(message.get("headers", []))
                headers += [(name, value) for name, value in extra if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def local_path(target: str | None) -> str:
    """``target`` if it is a path on this site (where a login may send the browser back to),
    else ``/``: never another site (``//host``, ``https://host``, ``/\\host``)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    if any(ch in target for ch in "\r\n\\"):
        return "/"
    return target
