"""The dashboard's pages, /metrics and its token, served by uvicorn, on every reachable backend."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, select
from web_helpers import Served

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import Cluster
from dbcluster.schema import job_execution
from dbcluster.testing.app import FAST_SETTINGS, build_registry
from dbcluster.testing.backends import Backend
from dbcluster.testing.executions import insert_executions
from dbcluster.views import short_node
from dbcluster.web import app as web_app
from dbcluster.web import create_app


@pytest.fixture
def two_nodes(backend: Backend, ledger_engine: Engine) -> Iterator[tuple[Cluster, Cluster]]:
    registry = build_registry()
    nodes = (
        Cluster(backend.url, registry, FAST_SETTINGS).start(),
        Cluster(backend.url, registry, FAST_SETTINGS).start(),
    )
    yield nodes
    for node in nodes:
        node.stop(drain_timeout_ms=2000)


def cells(html: str) -> list[dict[str, str]]:
    """The partition grid's cells, as their data attributes."""
    found = re.findall(r'<span class="cell [^"]*"\s+([^>]*)>', html)
    return [dict(re.findall(r'data-(\w+)="([^"]*)"', attrs)) for attrs in found]


def gauges(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_pages_show_the_nodes_the_jobs_and_a_job_read_only(
    backend: Backend, two_nodes: tuple[Cluster, Cluster], serve: Callable[[Any], Served]
) -> None:
    a, b = two_nodes
    execution = a.launch("ledger", {"run": 1})
    assert execution.status is BatchStatus.COMPLETED
    site = serve(create_app(backend.engine, watch_interval_s=None))

    index = site.get("/")
    assert index.status == 200
    for cluster in (a, b):
        assert short_node(cluster.node.node_id) in index.body
    assert (
        "ACTIVE" in index.body and "read-only" in index.body and "No job is running" in index.body
    )

    jobs = site.get("/jobs")
    assert jobs.status == 200 and f'data-execution="{execution.id}"' in jobs.body
    assert f'data-execution="{execution.id}"' in site.get("/jobs?name=ledger&status=COMPLETED").body
    assert "No job execution matches" in site.get("/jobs?status=FAILED").body
    assert "No job execution matches" in site.get("/jobs?name=no-such-job").body

    page = site.get(f"/jobs/{execution.id}")
    assert page.status == 200
    grid = cells(page.body)
    assert len(grid) == 8 and {c["status"] for c in grid} == {"COMPLETED"}
    assert {c["node"] for c in grid} == {a.node.node_id, b.node.node_id}
    assert {c["attempt"] for c in grid} == {"1"}
    assert page.body.count('class="lane"') == 2  # the timeline: one lane per node
    assert "launched" in page.body  # the master history
    assert (
        "ledger.master" in page.body and "ledger.worker:" not in page.body.split("Steps")[1][:2000]
    )
    assert "/restart" not in page.body and "log in" not in page.body
    assert site.post(f"/jobs/{execution.id}/restart").status == 403
    assert site.get("/login").status == 404
    assert site.get("/jobs/987654321").status == 404
    assert (
        site.get("/static/app.js").status == 200 and "data-live" in site.get("/static/app.js").body
    )

    metrics = site.get("/metrics")
    assert metrics.status == 200
    found = gauges(metrics.body)
    assert found[("dbcluster_cluster_nodes", (("status", "ACTIVE"),))] == 2
    assert found[("dbcluster_cluster_jobs_in_flight", ())] == 0
    assert found[("dbcluster_cluster_capacity", ())] == 2 * FAST_SETTINGS.concurrency_limit


def test_a_job_page_reads_at_most_its_partition_limit(
    backend: Backend,
    two_nodes: tuple[Cluster, Cluster],
    serve: Callable[[Any], Served],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    execution = two_nodes[0].launch("ledger", {"run": 2})
    monkeypatch.setattr(web_app, "PARTITION_LIMIT", 3)
    page = serve(create_app(backend.engine, watch_interval_s=None)).get(f"/jobs/{execution.id}")
    assert len(cells(page.body)) == 3
    assert "the first 3 of 8" in page.body and "8 completed" in page.body


def test_the_jobs_list_pages_by_execution_id_and_filters(
    backend: Backend, serve: Callable[[Any], Served]
) -> None:
    insert_executions(backend.engine, 130)
    site = serve(create_app(backend.engine, watch_interval_s=None))
    seen: list[int] = []
    path: str | None = "/jobs"
    while path is not None:
        page = site.get(path)
        assert page.status == 200
        rows = [int(i) for i in re.findall(r'data-execution="(\d+)"', page.body)]
        assert len(rows) == (50 if len(seen) < 100 else 30)
        seen += rows
        older = re.search(r'href="([^"]+)" rel="next"', page.body)
        path = older.group(1).replace("&amp;", "&") if older else None
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == 130
    failed = re.findall(r'data-execution="(\d+)"', site.get("/jobs?status=FAILED").body)
    assert len(failed) == 13
    export = site.get("/jobs?name=export&limit=200").body
    assert len(re.findall(r'data-execution="(\d+)"', export)) == 26
    # A job's executions, a few per page: read in windows of ids, in order, none twice.
    named: list[int] = []
    path = "/jobs?name=export&limit=4"
    while path is not None:
        body = site.get(path).body
        named += [int(i) for i in re.findall(r'data-execution="(\d+)"', body)]
        older = re.search(r'href="([^"]+)" rel="next"', body)
        path = older.group(1).replace("&amp;", "&") if older else None
    assert len(named) == 26 and named == sorted(set(named), reverse=True)


def test_restart_is_offered_only_to_the_token(
    backend: Backend, serve: Callable[[Any], Served]
) -> None:
    insert_executions(backend.engine, 20)
    with backend.engine.connect() as conn:
        rows = conn.execute(select(job_execution.c.job_execution_id, job_execution.c.status)).all()
    failed = next(r.job_execution_id for r in rows if r.status == "FAILED")
    completed = next(r.job_execution_id for r in rows if r.status == "COMPLETED")
    restarted: list[int] = []

    class Recorder:
        def restart(self, execution_id: int) -> tuple[int, Any]:
            restarted.append(execution_id)
            return 4242, None

    app = create_app(
        backend.engine,
        token="s3cret",
        public_read=True,
        restarter=Recorder(),  # type: ignore[arg-type] - records what a restart would run
        watch_interval_s=None,
    )
    site = serve(app)
    anonymous = site.get(f"/jobs/{failed}").body
    assert "Log in</a> to restart" in anonymous and 'action="/jobs' not in anonymous
    assert site.post(f"/jobs/{failed}/restart").status == 403
    assert site.post(f"/jobs/{failed}/restart", Authorization="Bearer wrong").status == 403
    assert site.post("/login", "token=wrong").status == 403
    login = site.post("/login", "token=s3cret")
    assert login.status == 303
    cookie = login.headers["set-cookie"].split(";")[0]
    assert "s3cret" not in cookie and "httponly" in login.headers["set-cookie"].lower()
    page = site.get(f"/jobs/{failed}", Cookie=cookie).body
    assert f'action="/jobs/{failed}/restart"' in page
    # Another site's form cannot use the cookie.
    assert (
        site.post(f"/jobs/{failed}/restart", Cookie=cookie, Origin="http://evil.example").status
        == 403
    )
    assert restarted == []
    done = site.post(f"/jobs/{failed}/restart", Cookie=cookie)
    assert done.status == 303 and "pid+4242" in done.headers["location"]
    assert site.post(f"/jobs/{failed}/restart", Authorization="Bearer s3cret").status == 303
    assert restarted == [failed, failed]
    assert site.post(f"/jobs/{completed}/restart", Authorization="Bearer s3cret").status == 409
    assert "/restart" not in site.get(f"/jobs/{completed}", Cookie=cookie).body
