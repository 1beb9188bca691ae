"""The dashboard's routes (see :mod:`dbcluster.web`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

try:
    import jinja2
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
except ImportError as missing:  # pragma: no cover - depends on the installed extras
    raise ImportError("the dashboard needs its extra: pip install 'dbcluster[web]'") from missing
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from dbcluster.batch.exceptions import NoSuchJobExecutionError
from dbcluster.batch.status import BatchStatus
from dbcluster.masking import mask_secrets, masked
from dbcluster.monitor import cluster_status, job_detail, job_page, registered_nodes
from dbcluster.views import fmt_age, fmt_counts, fmt_duration, fmt_time, short_node
from dbcluster.web.actions import SESSION_COOKIE, Access, Restarter, Stopper
from dbcluster.web.gauges import cluster_registry
from dbcluster.web.history import MoveWatcher
from dbcluster.web.security import SecurityHeaders, local_path
from dbcluster.web.timeline import layout

log = logging.getLogger("dbcluster.web")

#: At most this many partitions of a job are read for its page (their counts are all shown).
PARTITION_LIMIT = 2000
#: Job executions per page of the jobs list (``?limit=`` up to ``MAX_PAGE``).
PAGE = 50
MAX_PAGE = 200
STATUSES = [s.value for s in BatchStatus]
RESTARTABLE = {"FAILED", "STOPPED", "ABANDONED"}
STOPPABLE = {"STARTING", "STARTED"}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dbcluster.web", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        # Every value a page shows (parameters, exit messages, errors) without passwords.
        finalize=masked,
    )
    env.filters.update(
        age=fmt_age, node=short_node, time=fmt_time, counts=fmt_counts, duration=fmt_duration
    )
    return env


def create_app(
    engine: Engine,
    *,
    token: str | None = None,
    public_read: bool = False,
    restarter: Restarter | None = None,
    stopper: Stopper | None = None,
    refresh_s: float = 2.0,
    watch_interval_s: float | None = 1.0,
) -> Starlette:
    """The dashboard on ``engine``. Without ``token`` it is read-only and public. With a token,
    reading it (pages and /metrics) needs the token too, unless ``public_read``; actions
    always do: stops (with a ``stopper``) and restarts (with a ``restarter``).
    ``watch_interval_s``: how often the partitions in flight are sampled to see them move
    (None: never). Every response carries the headers of :mod:`dbcluster.web.security`."""
    if stopper is None and isinstance(restarter, Restarter):
        stopper = Stopper(restarter.url)
    env = _environment()
    access = Access(token)
    login_to_read = access.enabled and not public_read
    watcher = MoveWatcher(engine, watch_interval_s) if watch_interval_s is not None else None
    metrics = cluster_registry(engine)

    def allowed(request: Request) -> bool:
        return access.allowed(
            request.headers.get("authorization"), request.cookies.get(SESSION_COOKIE)
        )

    def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        body = env.get_template(template).render(
            request=request,
            refresh_ms=int(refresh_s * 1000),
            actions=access.enabled,
            allowed=allowed(request),
            flash=request.query_params.get("flash"),
            **context,
        )
        return HTMLResponse(body, status_code)

    def unavailable(error: DBAPIError) -> str:
        reason = mask_secrets(str(error.orig or error).strip().splitlines()[0])
        log.warning("cannot read the database: %s", reason)
        return reason

    def login_first(request: Request) -> Response | None:
        """Where reading needs the token and the request lacks it: a page asks for a login
        (a redirect to the form, back here after it), anything else is refused."""
        if not login_to_read or allowed(request):
            return None
        if request.url.path == "/metrics":
            return Response(
                "the dashboard's token is needed (Authorization: Bearer TOKEN)\n",
                401,
                media_type="text/plain",
                headers={"WWW-Authenticate": 'Bearer realm="dbcluster"'},
            )
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)

    def guarded(render: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """A page for those who may read it, which says so when the database cannot be read
        (the dashboard stays up)."""

        def endpoint(request: Request) -> Response:
            refused = login_first(request)
            if refused is not None:
                return refused
            try:
                return render(request)
            except NoSuchJobExecutionError as missing:
                return page(request, "error.html", 404, title="Not found", message=str(missing))
            except DBAPIError as error:
                message = unavailable(error)
                return page(
                    request, "error.html", 503, title="Database unavailable", message=message
                )

        return endpoint

    def index(request: Request) -> Response:
        return page(request, "index.html", status=cluster_status(engine))

    def jobs(request: Request) -> Response:
        q = request.query_params
        name = q.get("name") or None
        status = q.get("status") or None
        if status not in (None, *STATUSES):
            status = None
        try:
            limit = min(MAX_PAGE, max(1, int(q.get("limit", PAGE))))
            before = int(q["before"]) if q.get("before") else None
        except ValueError:
            limit, before = PAGE, None
        found = job_page(engine, limit=limit, job_name=name, status=status, before=before)
        filters = {k: v for k, v in (("name", name), ("status", status)) if v}
        older = None
        if found.older is not None:
            older = "/jobs?" + urlencode({**filters, "before": found.older, "limit": limit})
        return page(
            request,
            "jobs.html",
            rows=found.rows,
            name=name or "",
            status=status or "",
            statuses=STATUSES,
            older=older,
            first="/jobs?" + urlencode(filters) if before is not None else None,
        )

    def job(request: Request) -> Response:
        execution_id = int(request.path_params["execution_id"])
        detail = job_detail(engine, execution_id, partition_limit=PARTITION_LIMIT)
        seen = watcher.segments(execution_id) if watcher is not None else {}
        timeline = layout(detail, seen, registered_nodes(engine))
        by_node: dict[str, list[Any]] = {}
        for p in detail.partitions:
            by_node.setdefault(p.node or "", []).append(p)
        return page(
            request,
            "job.html",
            job=detail,
            grid=sorted(by_node.items(), key=lambda item: (item[0] == "", item[0])),
            timeline=timeline,
            failures=[p for p in detail.partitions if p.status == "FAILED" and p.exit_message],
            restartable=restarter is not None and detail.status in RESTARTABLE,
            stoppable=stopper is not None and detail.status in STOPPABLE,
            watching=watcher is not None,
        )

    def metrics_endpoint(request: Request) -> Response:
        refused = login_first(request)
        if refused is not None:
            return refused
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    def same_origin(request: Request) -> bool:
        origin = request.headers.get("origin")
        return origin is None or urlsplit(origin).netloc == request.headers.get("host")

    async def form(request: Request) -> dict[str, str]:
        fields = parse_qs((await request.body()).decode("utf-8", "replace"))
        return {k: v[0] for k, v in fields.items() if v}

    async def login(request: Request) -> Response:
        if not access.enabled:
            return page(request, "error.html", 404, title="Read-only", message=READ_ONLY)
        if request.method == "GET":
            target = local_path(request.query_params.get("next"))
            return page(request, "login.html", failed=False, next=target, reading=login_to_read)
        fields = await form(request)
        target = local_path(fields.get("next"))
        if not same_origin(request) or not access.check_token(fields.get("token")):
            return page(request, "login.html", 403, failed=True, next=target, reading=login_to_read)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            access.session_value(),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    async def read_execution(execution_id: int) -> Any:
        """The execution (a ``JobDetail`` without partitions), or the answer when it cannot be
        read: 404 for an unknown id, 503 when the database does not answer."""
        try:
            return await run_in_threadpool(job_detail, engine, execution_id, 0)
        except NoSuchJobExecutionError as missing:
            return Response(str(missing) + "\n", 404, media_type="text/plain")
        except DBAPIError as error:
            message = "the database is unavailable: " + unavailable(error)
            return Response(message + "\n", 503, media_type="text/plain")

    async def restart(request: Request) -> Response:
        execution_id = int(request.path_params["execution_id"])
        if not access.enabled:
            return Response(READ_ONLY + "\n", 403, media_type="text/plain")
        if not same_origin(request) or not allowed(request):
            return Response("restart needs the dashboard's token\n", 403, media_type="text/plain")
        if restarter is None:
            return Response(NO_RESTARTS + "\n", 403, media_type="text/plain")
        detail = await read_execution(execution_id)
        if isinstance(detail, Response):
            return detail
        if detail.status not in RESTARTABLE:
            message = f"execution {execution_id} is {detail.status}: only a FAILED, STOPPED or "
            message += "ABANDONED execution can be restarted"
            return Response(message + "\n", 409, media_type="text/plain")
        pid, log_path = await run_in_threadpool(restarter.restart, execution_id)
        flash = (
            f"restart of execution {execution_id} started (pid {pid}, log {log_path}); its new "
            f"execution appears in the jobs list"
        )
        query = urlencode({"name": detail.job, "flash": flash})
        return RedirectResponse(f"/jobs?{query}", status_code=303)

    async def stop(request: Request) -> Response:
        execution_id = int(request.path_params["execution_id"])
        if not access.enabled:
            return Response(READ_ONLY + "\n", 403, media_type="text/plain")
        if not same_origin(request) or not allowed(request):
            return Response("stop needs the dashboard's token\n", 403, media_type="text/plain")
        if stopper is None:
            return Response("this dashboard cannot stop jobs\n", 403, media_type="text/plain")
        found = await read_execution(execution_id)
        if isinstance(found, Response):
            return found
        stopped, line = await run_in_threadpool(stopper.stop, execution_id)
        if not stopped:
            return Response(line + "\n", 409, media_type="text/plain")
        query = urlencode({"flash": line})
        return RedirectResponse(f"/jobs/{execution_id}?{query}", status_code=303)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if watcher is not None:
            watcher.start()
        try:
            yield
        finally:
            if watcher is not None:
                watcher.stop()

    static = StaticFiles(packages=[("dbcluster.web", "static")])
    application = Starlette(
        routes=[
            Route("/", guarded(index)),
            Route("/jobs", guarded(jobs)),
            Route("/jobs/{execution_id:int}", guarded(job)),
            Route("/jobs/{execution_id:int}/restart", restart, methods=["POST"]),
            Route("/jobs/{execution_id:int}/stop", stop, methods=["POST"]),
            Route("/metrics", metrics_endpoint),
            Route("/login", login, methods=["GET", "POST"]),
            Route("/logout", logout, methods=["POST"]),
            Mount("/static", static, name="static"),
        ],
        lifespan=lifespan,
    )
    application.add_middleware(SecurityHeaders)
    return application


READ_ONLY = "this dashboard is read-only (start it with --token to enable actions)"
NO_RESTARTS = "this dashboard cannot restart jobs (start it with --app as well as --token)"
