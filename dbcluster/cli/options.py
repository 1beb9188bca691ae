"""What the ``dbcluster`` commands share: exit statuses, the ``--url``, ``--app`` and ``--otel``
options, durations, log options (docs/cli.md describes them for users). A command that a package
adds through the ``dbcluster.commands`` entry points uses them too (``dbcluster chaos`` does)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from dbcluster.errors import ConfigurationError

#: The command did what was asked (a job: it COMPLETED).
EXIT_OK = 0
#: A job it ran or waited for did not complete (FAILED, STOPPED, ABANDONED, or still running
#: when a wait timed out).
EXIT_FAILED = 1
#: Usage or user error: a bad option or argument, an unknown job or execution, an app that does
#: not import, missing tables: one line on stderr, no traceback.
EXIT_USAGE = 2
#: The database is unavailable (cannot connect, or the connection was lost): one line.
EXIT_UNAVAILABLE = 3
#: Interrupted (Ctrl-C), or a launch detached from its job.
EXIT_INTERRUPTED = 130

URL_HELP = "SQLAlchemy database URL (or set DBCLUSTER_URL)."


class EnvOption(click.Option):
    """An option that may come from its environment variable instead: a missing one says so
    ("Missing option '--url' (or set DBCLUSTER_URL)."), where click names the option only."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        hint = super().get_error_hint(ctx)
        return f"{hint} (or set {self.envvar})" if isinstance(self.envvar, str) else hint


APP_HELP = "The application: module:attribute of a JobRegistry (or set DBCLUSTER_APP)."
OTEL_HELP = (
    "Export OpenTelemetry spans of jobs, steps, partitions and chunks over OTLP/HTTP "
    "(configured by the OTEL_* variables; needs the otel extra)."
)


def _export_url(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The URL a command uses is ``DBCLUSTER_URL`` in its environment too (given as ``--url``
    or not), so the application's resources read the one its nodes use."""
    if value:
        os.environ["DBCLUSTER_URL"] = value
    return value


def url_option(required: bool = True, *, connects: bool = True) -> Callable[[Any], Any]:
    """``--url`` (or ``DBCLUSTER_URL``) of a command that runs or reads the cluster, exported to
    its environment as ``DBCLUSTER_URL``; with ``connects``, ``--connect-timeout`` too."""
    url = click.option(
        "--url",
        cls=EnvOption,
        envvar="DBCLUSTER_URL",
        required=required,
        help=URL_HELP,
        callback=_export_url,
    )
    if not connects:
        return url
    timeout = connect_timeout_option()
    return lambda command: timeout(url(command))


CONNECT_TIMEOUT_HELP = (
    "How long to wait out a database that is unavailable (restarting, failing over), trying "
    "again (one warning for the wait), before exiting 3 (30s, 2m; a bare number is seconds; "
    "0: try once; or set DBCLUSTER_CONNECT_TIMEOUT)."
)


def _set_connect_timeout(ctx: click.Context, param: click.Parameter, value: float) -> None:
    from click.core import ParameterSource

    from dbcluster.cli.engines import TIMEOUT_KEY, set_connect_timeout

    # A subcommand's default does not override its group's value (`migrate --connect-timeout 5
    # current`).
    given = (
        param.name is None or ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT
    )
    if given or TIMEOUT_KEY not in ctx.meta:
        set_connect_timeout(value)


def connect_timeout_option() -> Callable[[Any], Any]:
    """``--connect-timeout`` (or ``DBCLUSTER_CONNECT_TIMEOUT``, default 60 s) of a command that
    connects: how long :mod:`dbcluster.cli.engines` waits a database outage out. The command
    does not receive it as an argument."""
    return click.option(
        "--connect-timeout",
        type=DURATION_S,
        default="60s",
        show_default=True,
        envvar="DBCLUSTER_CONNECT_TIMEOUT",
        expose_value=False,
        callback=_set_connect_timeout,
        help=CONNECT_TIMEOUT_HELP,
    )


def otel_option() -> Callable[[Any], Any]:
    return click.option("--otel", is_flag=True, envvar="DBCLUSTER_OTEL", help=OTEL_HELP)


class Duration(click.ParamType):
    """A duration option: ``500ms``, ``30s``, ``2m``, ``1h``, ``30d``, or a bare number in the
    option's historical unit (``bare``: "ms" or "s"). The value is milliseconds (an int), or
    seconds (a float) with ``seconds=True``."""

    name = "duration"

    def __init__(self, bare: str = "ms", *, seconds: bool = False) -> None:
        self.bare = bare
        self.seconds = seconds

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ms = round(value * (1000 if self.bare == "s" else 1))
        else:
            from dbcluster.cluster.settings import parse_duration

            what = f"--{param.name.replace('_', '-')}" if param and param.name else "duration"
            try:
                ms = parse_duration(str(value), bare=self.bare, what=what)
            except ConfigurationError as exc:
                self.fail(str(exc).partition(": ")[2] or str(exc), param, ctx)
        return ms / 1000 if self.seconds else ms

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"


#: A duration in milliseconds where milliseconds were taken (a bare number is milliseconds).
DURATION_MS = Duration("ms")
#: A duration in seconds where seconds were taken (a bare number is seconds).
DURATION_S = Duration("s", seconds=True)


def log_options(
    verbose_help: str = "Debug logging (same as --log-level debug).",
) -> Callable[[Any], Any]:
    """``--log-level``, ``--log-format`` (or ``DBCLUSTER_LOG_LEVEL``, ``DBCLUSTER_LOG_FORMAT``)
    and ``-v`` on a long-running command; the command receives ``log_level`` (None: its
    default) and ``log_format``."""
    from dbcluster.logs import FORMATS, LEVELS

    def decorate(command: Any) -> Any:
        command = click.option("-v", "--verbose", is_flag=True, help=verbose_help)(command)
        command = click.option(
            "--log-format",
            type=click.Choice(FORMATS, case_sensitive=False),
            default="text",
            show_default=True,
            envvar="DBCLUSTER_LOG_FORMAT",
            help="Log lines as text or as JSON objects (time in ISO 8601 UTC, ending in Z).",
        )(command)
        return click.option(
            "--log-level",
            type=click.Choice(LEVELS, case_sensitive=False),
            envvar="DBCLUSTER_LOG_LEVEL",
            help="The least severe records logged (default: info; -v: debug).",
        )(command)

    return decorate


def chosen_level(log_level: str | None, verbose: bool, default: str = "info") -> str:
    """The level asked for: ``--log-level``, else debug with ``-v``, else ``default``."""
    if log_level:
        return log_level.lower()
    return "debug" if verbose else default
