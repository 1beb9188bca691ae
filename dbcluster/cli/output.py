"""How the commands speak: log setup, the lines always shown on stderr, tables and JSON on
stdout."""

from __future__ import annotations

from typing import Any

import click


def setup_logging(level: str, log_format: str) -> None:
    from dbcluster import logs

    logs.configure(level, log_format)


def announce(message: str, log_format: str, *, warning: bool = False) -> None:
    """A line always shown on stderr, in the command's log format (see logs.announce)."""
    import logging

    from dbcluster import logs

    if warning and log_format == "json":
        message = message.removeprefix("warning: ")
    logs.announce(
        message, log_format, level=logging.WARNING if warning else logging.INFO, logger="dbcluster"
    )


def announce_error(line: str) -> None:
    """An error as one JSON log line (``--log-format json``)."""
    import logging

    from dbcluster import logs

    logs.announce(line, "json", level=logging.ERROR, logger="dbcluster")


def print_renderables(renderables: list[Any]) -> None:
    """Rich tables on stdout, a blank line between them."""
    from dbcluster.views import stdout_console

    console = stdout_console()
    if console.is_terminal:
        for i, renderable in enumerate(renderables):
            if i:
                console.print()
            console.print(renderable)
        return
    with console.capture() as captured:
        for i, renderable in enumerate(renderables):
            if i:
                console.print()
            console.print(renderable)
    # Piped: no padding to the console's width at the end of each line.
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def echo_json(value: Any) -> None:
    """``value`` as one line of JSON (times in UTC with a ``Z``), passwords masked."""
    import json

    from dbcluster.masking import masked
    from dbcluster.monitor import jsonable

    click.echo(json.dumps(masked(jsonable(value))))
