"""``dbcluster web``: serve the dashboard (:mod:`dbcluster.web`) over one engine."""

from __future__ import annotations

import click

from dbcluster.cli.engines import Tables, open_engine
from dbcluster.cli.options import DURATION_S, chosen_level, log_options, url_option
from dbcluster.cli.output import announce, setup_logging
from dbcluster.errors import ConfigurationError


@click.command()
@url_option()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8080,
    show_default=True,
    help="The port to listen on (0: any free one).",
)
@click.option(
    "--token",
    envvar="DBCLUSTER_WEB_TOKEN",
    help="Require this token to read the dashboard and to take actions (stop; restart with "
    "--app): a login form sets a session cookie, or send 'Authorization: Bearer TOKEN' "
    "(better: set DBCLUSTER_WEB_TOKEN). Without it the dashboard is read-only and public.",
)
@click.option(
    "--public-read",
    is_flag=True,
    envvar="DBCLUSTER_WEB_PUBLIC_READ",
    help="With --token: pages and /metrics are readable without the token; actions still need it.",
)
@click.option(
    "--app",
    envvar="DBCLUSTER_APP",
    help="With --token: the application whose jobs a restart runs (module:attribute).",
)
@click.option(
    "--refresh",
    type=DURATION_S,
    default="2s",
    show_default=True,
    help="How often an open page updates itself (a bare number is seconds; at least 0.5s).",
)
@log_options("Debug logging, every request logged (same as --log-level debug).")
def web(
    url: str,
    host: str,
    port: int,
    token: str | None,
    public_read: bool,
    app: str | None,
    refresh: float,
    log_level: str | None,
    log_format: str,
    verbose: bool,
) -> None:
    """Serve the dashboard: nodes, jobs, each job's partitions by node and their timeline, live;
    /metrics with the cluster's gauges. Without --token it is read-only and anyone who reaches
    it reads it; with --token it asks for the token to read (unless --public-read) and to act."""
    import socket

    try:
        import uvicorn

        from dbcluster.web import create_app
        from dbcluster.web.actions import Restarter, Stopper
    except ImportError as missing:
        raise ConfigurationError(
            f"the dashboard needs its extra ({missing}): pip install 'dbcluster[web]'"
        ) from None
    if refresh < 0.5:
        raise click.BadParameter("must be at least 0.5s", param_hint="--refresh")
    level = chosen_level(log_level, verbose, default="warning")
    setup_logging(level, log_format)
    if app and token:
        from dbcluster.batch import load_registry

        load_registry(app)  # a wrong --app fails here, not at the first restart
    engine = open_engine(url, Tables.CURRENT)
    application = create_app(
        engine,
        token=token,
        public_read=public_read,
        restarter=Restarter(url, app) if token and app else None,
        stopper=Stopper(url) if token else None,
        refresh_s=refresh,
    )
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        engine.dispose()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    bound = sock.getsockname()[1]
    # Listening before the address is announced: a client that connects at once waits in the
    # backlog until the server accepts, instead of being refused while uvicorn starts up.
    sock.listen(2048)
    if not token and not _loopback(host):
        announce(
            f"warning: the dashboard listens on {host} without --token: anyone who can reach "
            "it reads job parameters, exit messages and database errors (set "
            "DBCLUSTER_WEB_TOKEN, or listen on 127.0.0.1)",
            log_format,
            warning=True,
        )
    if not token:
        mode = "read-only, no login"
    elif public_read:
        mode = "public read; actions need the token"
    else:
        mode = "the token is needed to read and to act"
    if token and not app:
        mode += "; restarts need --app"
    announce(f"dashboard on http://{host}:{bound}/ ({mode})", log_format)
    config = uvicorn.Config(
        application,
        log_config=None,  # its records go to the root logger's handler, in --log-format
        log_level=level,
        access_log=level in ("debug", "info"),
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.dispose()


def _loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
