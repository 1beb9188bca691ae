"""The ``dbcluster`` command group and :func:`main`, which turns errors into exit statuses.

Errors a user can cause are :class:`~dbcluster.errors.DbclusterError`s: printed as one line on
stderr, exit status 2, no traceback; a database that cannot be reached exits 3
(:mod:`dbcluster.cli.options` names the statuses). The commands live in the modules beside this
one; installed packages add theirs through the ``dbcluster.commands`` entry points
(:mod:`dbcluster.cli.plugins`).
"""

from __future__ import annotations

import os
import sys

import click

from dbcluster.cli import dashboard, demo, inspect, migrate, prune, run, stop, submit, tables
from dbcluster.cli.options import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from dbcluster.cli.output import announce, announce_error
from dbcluster.cli.plugins import group
from dbcluster.errors import DatabaseUnreachableError, DbclusterError


@group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dbcluster")
def cli() -> None:
    """Partitioned batch jobs across worker processes, coordinated through SQL."""


for _command in (
    tables.ddl,
    tables.init,
    run.worker,
    run.launch,
    run.restart,
    inspect.status,
    inspect.jobs,
    inspect.job_command,
    dashboard.web,
    demo.demo,
    stop.stop,
    submit.submit,
    submit.schedules,
    prune.prune,
    migrate.migrate,
):
    cli.add_command(_command)


def _unavailable(error: BaseException) -> bool:
    """Whether an error that ended a command says the database is unavailable (no connection,
    a lost one, a pool that could not get one, a server shutting down or read-only: the
    provider's judgement, :func:`~dbcluster.cli.engines.is_outage`), not that a statement was
    wrong."""
    from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from dbcluster.cli.engines import is_outage

    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)):
        return True
    return is_outage(error)


def main(argv: list[str] | None = None) -> None:
    """The ``dbcluster`` command: exit 0 done, 1 a job did not complete, 2 a usage or user
    error, 3 the database is unavailable, 130 interrupted (one line on stderr, no traceback).

    A command puts its URL in ``DBCLUSTER_URL`` for the application's resources (``--url``);
    called in-process (``main([...])``), it leaves the environment as it found it."""
    saved = os.environ.get("DBCLUSTER_URL")
    try:
        _main(argv)
    finally:
        if saved is None:
            os.environ.pop("DBCLUSTER_URL", None)
        else:
            os.environ["DBCLUSTER_URL"] = saved


def _main(argv: list[str] | None) -> None:
    from dbcluster.cluster.settings import warn_unknown_variables
    from dbcluster.logs import json_requested
    from dbcluster.masking import mask_secrets

    args = sys.argv[1:] if argv is None else list(argv)
    log_format = "json" if json_requested(args, os.environ) else "text"

    def warn(line: str) -> None:
        announce(line, log_format, warning=True)

    def fail(line: str, status: int) -> None:
        if log_format == "json":
            announce_error(line)
        else:
            click.echo(f"error: {line}", err=True)
        sys.exit(status)

    warn_unknown_variables(os.environ, echo=warn)
    try:
        cli.main(args=args, prog_name="dbcluster", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except DatabaseUnreachableError as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except DbclusterError as exc:
        fail(str(exc), EXIT_USAGE)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        # The database went away after the command's first work (a restart mid-job, during a
        # launch's summary): one line, exit 3, never a traceback with exit 1.
        if not _unavailable(exc):
            raise
        orig = getattr(exc, "orig", None) or exc
        lines = str(orig).strip().splitlines() or [type(orig).__name__]
        fail(f"the database is unavailable: {mask_secrets(lines[0])}", EXIT_UNAVAILABLE)
    sys.exit(EXIT_OK)
