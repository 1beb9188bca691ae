"""Who reads the dashboard, what its responses tell browsers, what its pages never show, and how
its actions answer for an execution that is not there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError
from web_helpers import Served

from dbcluster.batch.parameters import as_job_parameters
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import job_execution
from dbcluster.testing.backends import Backend
from dbcluster.testing.executions import insert_executions
from dbcluster.web import app as web_app
from dbcluster.web import create_app
from dbcluster.web.actions import Stopper

TOKEN = "s3cret-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


class Recorder:
    """A restarter that records what it was asked to restart."""

    def __init__(self) -> None:
        self.restarted: list[int] = []

    def restart(self, execution_id: int) -> tuple[int, Any]:
        self.restarted.append(execution_id)
        return 4242, None


def _ids(backend: Backend) -> dict[str, int]:
    """One execution id per status of :func:`insert_executions`."""
    with backend.engine.connect() as conn:
        rows = conn.execute(select(job_execution.c.job_execution_id, job_execution.c.status)).all()
    return {r.status: r.job_execution_id for r in rows}


@pytest.mark.backends("sqlite")
def test_a_token_guards_reading_unless_public_read(
    backend: Backend, serve: Callable[[Any], Served]
) -> None:
    insert_executions(backend.engine, 20)
    failed = _ids(backend)["FAILED"]
    site = serve(create_app(backend.engine, token=TOKEN, watch_interval_s=None))

    # Anonymous: every page sends the browser to the login form (and back after it).
    for path in ("/", "/jobs?status=FAILED", f"/jobs/{failed}", "/jobs/987654321"):
        answer = site.get(path)
        assert answer.status == 303, (path, answer.status)
        location = urlsplit(answer.headers["location"])
        assert location.path == "/login" and parse_qs(location.query)["next"] == [path]
        assert "failed on purpose" not in answer.body and "FAILED" not in answer.body
    metrics = site.get("/metrics")
    assert metrics.status == 401 and metrics.headers["www-authenticate"].startswith("Bearer")
    assert "dbcluster_cluster" not in metrics.body
    assert site.get("/static/app.css").status == 200  # no data in the assets
    form = site.get(f"/login?next=/jobs/{failed}")
    assert form.status == 200 and f'name="next" value="/jobs/{failed}"' in form.body
    assert site.get("/", Authorization="Bearer wrong").status == 303

    # With the token: the header, or the cookie of a login that returns to the page asked for.
    page = site.get(f"/jobs/{failed}", **BEARER)
    assert page.status == 200 and "failed on purpose" in page.body
    assert site.get("/metrics", **BEARER).status == 200
    login = site.post("/login", f"token={TOKEN}&next=/jobs/{failed}")
    assert login.status == 303 and login.headers["location"] == f"/jobs/{failed}"
    cookie = login.headers["set-cookie"].split(";")[0]
    assert site.get("/jobs", Cookie=cookie).status == 200
    assert site.get("/jobs/987654321", Cookie=cookie).status == 404
    # A login never sends the browser to another site.
    for elsewhere in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        sent = site.post("/login", f"token={TOKEN}&next={elsewhere}")
        assert sent.status == 303 and sent.headers["location"] == "/", elsewhere

    # --public-read: pages and metrics are open, actions still need the token.
    recorder = Recorder()
    public = serve(
        create_app(
            backend.engine,
            token=TOKEN,
            public_read=True,
            restarter=recorder,  # type: ignore[arg-type]
            watch_interval_s=None,
        )
    )
    assert public.get(f"/jobs/{failed}").status == 200
    assert public.get("/metrics").status == 200
    assert public.post(f"/jobs/{failed}/restart").status == 403
    assert recorder.restarted == []

    # Without a token: read-only, and public.
    assert serve(create_app(backend.engine, watch_interval_s=None)).get("/").status == 200


@pytest.mark.backends("sqlite")
def test_every_response_carries_the_security_headers(
    backend: Backend, serve: Callable[[Any], Served]
) -> None:
    insert_executions(backend.engine, 5)
    site = serve(
        create_app(backend.engine, token=TOKEN, restarter=Recorder(), watch_interval_s=None)  # type: ignore[arg-type]
    )
    answers = {
        "page": site.get("/", **BEARER),
        "login redirect": site.get("/jobs"),
        "not found": site.get("/jobs/987654321", **BEARER),
        "no route": site.get("/nowhere"),
        "metrics": site.get("/metrics", **BEARER),
        "action refused": site.post("/jobs/1/restart"),
        "static": site.get("/static/app.js"),
    }
    for what, answer in answers.items():
        headers = {k.lower(): v for k, v in answer.headers.items()}
        csp = headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, what
        assert "default-src 'none'" in csp and "'unsafe-eval'" not in csp, what
        assert headers.get("x-frame-options") == "DENY", what
        assert headers.get("x-content-type-options") == "nosniff", what
        assert headers.get("referrer-policy") == "no-referrer", what
        if what != "static":
            assert headers.get("cache-control") == "no-store", what
    # The pages inline no script, which the policy would block.
    assert "<script>" not in answers["page"].body and "<script src=" in answers["page"].body


@pytest.mark.backends("sqlite")
def test_restart_and_stop_of_an_unknown_execution_answer_404_and_of_the_wrong_one_409(
    backend: Backend, serve: Callable[[Any], Served]
) -> None:
    insert_executions(backend.engine, 20)
    ids = _ids(backend)
    recorder = Recorder()
    site = serve(
        create_app(
            backend.engine,
            token=TOKEN,
            restarter=recorder,  # type: ignore[arg-type]
            stopper=Stopper(backend.url),
            watch_interval_s=None,
        )
    )
    for action in ("restart", "stop"):
        missing = site.post(f"/jobs/987654321/{action}", **BEARER)
        assert missing.status == 404, (action, missing.status, missing.body)
        assert "no job execution with id 987654321" in missing.body
        assert "Traceback" not in missing.body
        # Without the token, whether it exists is not told.
        assert site.post(f"/jobs/987654321/{action}").status == 403
    assert site.post(f"/jobs/{ids['COMPLETED']}/restart", **BEARER).status == 409
    assert site.post(f"/jobs/{ids['COMPLETED']}/stop", **BEARER).status == 409
    assert recorder.restarted == []
    # A token without an application: reads and stops, but no restarts.
    no_app = serve(create_app(backend.engine, token=TOKEN, watch_interval_s=None))
    refused = no_app.post(f"/jobs/{ids['FAILED']}/restart", **BEARER)
    assert refused.status == 403 and "--app" in refused.body
    assert "/restart" not in no_app.get(f"/jobs/{ids['FAILED']}", **BEARER).body


@pytest.mark.backends("sqlite")
def test_pages_never_show_a_password(
    backend: Backend, serve: Callable[[Any], Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = JobRepository(backend.engine)
    params = as_job_parameters(
        {"source": "postgresql://etl:pa55word@db.example/sales", "dsn": "DSN=x;PWD=pa55word;"}
    )
    execution = repository.create_job_execution(
        repository.create_job_instance("export", params), params
    )
    execution.status = BatchStatus.FAILED
    repository.update_job_execution(execution)
    with backend.engine.begin() as conn:
        conn.execute(
            update(job_execution)
            .where(job_execution.c.job_execution_id == execution.id)
            .values(exit_message="cannot connect to postgres:pa55word@db.example/sales")
        )
    site = serve(create_app(backend.engine, watch_interval_s=None))
    page = site.get(f"/jobs/{execution.id}")
    assert page.status == 200 and "db.example" in page.body
    assert "pa55word" not in page.body and "***" in page.body
    assert "pa55word" not in site.get("/jobs").body

    # The database error on the 503 page, as a driver that echoes its connection string says it.
    def down(engine: Any) -> Any:
        raise OperationalError(
            "SELECT 1", {}, Exception("connection failed: host=db user=etl password=pa55word")
        )

    monkeypatch.setattr(web_app, "cluster_status", down)
    unavailable = site.get("/")
    assert unavailable.status == 503 and "connection failed" in unavailable.body
    assert "pa55word" not in unavailable.body and "password=***" in unavailable.body
