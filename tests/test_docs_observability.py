"""docs/observability.md lists every metric a node and the dashboard expose."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")
pytest.importorskip("starlette", reason="the web extra is not installed")

from dbcluster.metrics import NODE_METRICS  # noqa: E402
from dbcluster.web.gauges import CLUSTER_METRICS  # noqa: E402

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "observability.md").read_text()


@pytest.mark.parametrize("name", [*NODE_METRICS, *CLUSTER_METRICS])
def test_the_observability_page_says_what_each_metric_means(name: str) -> None:
    assert f"`{name}`" in PAGE
