"""The web dashboard (the ``web`` extra): ``dbcluster web --url U``.

Server-rendered pages on Starlette (run by uvicorn), read through :mod:`dbcluster.monitor`'s
bounded queries; templates, CSS and the small script that keeps a page live ship in this
package (no CDN). A page refreshes its live sections every ``refresh_s`` by fetching itself
again. ``/metrics`` serves the cluster's gauges (:mod:`dbcluster.web.gauges`).

Without a token the dashboard is read-only and public; with one (``--token``) reading it needs
the token too unless ``--public-read`` (:mod:`dbcluster.web.actions`). Every response carries
security headers (:mod:`dbcluster.web.security`) and every value a page shows is masked of
passwords (:mod:`dbcluster.masking`).
"""

from __future__ import annotations

from dbcluster.web.app import PARTITION_LIMIT, create_app

__all__ = ["PARTITION_LIMIT", "create_app"]
