"""The web dashboard (the ``web`` extra): ``dbcluster web --url U``.

Server-rendered pages on Starlette (run by uvicorn), read through :mod:`dbcluster.monitor`'s
bounded queries; templates, CSS and the small script that keeps a page live ship in this
package (no CDN). A page refreshes its live sections every ``refresh_s`` by fetching itself
again. ``/metrics`` serves the cluster's gauges (:mod:`dbcluster.web.gauges`).
"""

from __future__ import annotations

from dbcluster.web.app import PARTITION_LIMIT, create_app

__all__ = ["PARTITION_LIMIT", "create_app"]
