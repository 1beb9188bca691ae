"""A launching process as its job's master (``dbcluster launch``, ``restart``): it joins as a
node, runs the job with a progress display and prints the outcome; or, with ``launch --detach``,
hands the job to a background master process and returns with the execution id."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from dbcluster.cli.engines import connect_timeout_s, ride_out
from dbcluster.cli.node import cluster_settings, join, observe
from dbcluster.cli.options import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    chosen_level,
)

if TYPE_CHECKING:
    from sqlalchemy import Engine


@dataclass(frozen=True)
class LogChoice:
    """A command's log options: ``--log-level`` as given (None: the command's default),
    ``--log-format``, ``-v``."""

    level: str | None
    format: str
    verbose: bool


def master_logging(choice: LogChoice, quiet: bool, console: Any) -> None:
    """Warnings, and the master's own INFO lines (placement, reassignment), above the progress
    bar on a terminal; plain lines on stderr otherwise; JSON lines with --log-format json. An
    explicit --log-level applies to every logger."""
    import logging

    from dbcluster import logs
    from dbcluster.masking import SecretsFilter

    if console.is_terminal and choice.format == "text":
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=console, show_path=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        handler.addFilter(SecretsFilter())
    else:
        handler = logs.handler(choice.format)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(chosen_level(choice.level, choice.verbose, default="warning").upper())
    if choice.level is None and not choice.verbose and not quiet:
        for name in ("dbcluster.master", "dbcluster.cluster", "dbcluster.recovery"):
            logging.getLogger(name).setLevel(logging.INFO)


def run_as_master(
    engine: Engine,
    registry: Any,
    start: Callable[[Any], Any],
    no_work: bool,
    concurrency: int | None,
    as_json: bool,
    quiet: bool,
    log_choice: LogChoice,
    *,
    summary_to_stderr: bool = False,
    otel: bool = False,
) -> None:
    """Join as a node, run ``start(cluster)`` (which creates and runs a job execution) with a
    progress display, print the outcome and exit 0 (COMPLETED) or 1. A detached master prints
    its summary to stderr (its log file): nobody reads its stdout. With JSON logs stderr holds
    only log lines: no progress display, and a detached master's summary is logged."""
    import json
    import time
    from contextlib import nullcontext

    from rich.console import Console

    from dbcluster.batch.status import BatchStatus
    from dbcluster.cluster import Cluster
    from dbcluster.masking import mask_secrets
    from dbcluster.monitor import job_detail
    from dbcluster.views import LaunchProgress, summary_json, summary_lines

    err = Console(stderr=True, highlight=False)
    master_logging(log_choice, quiet, err)
    json_logs = log_choice.format == "json"
    progress = LaunchProgress(engine, err)

    def make() -> Cluster:
        # A launching process ends with its own job: it takes no other job over.
        made = Cluster(
            engine, registry, cluster_settings(concurrency, None), work=not no_work, take_over=False
        )
        if not quiet and not json_logs:
            made.handler.progress = progress
        return made

    began = time.monotonic()
    try:
        cluster, detach = join(
            engine, make, lambda made: observe(made, otel=otel, log_format=log_choice.format)
        )
        try:
            try:
                with nullcontext() if json_logs else progress:
                    execution = start(cluster)
            finally:
                cluster.stop()
            elapsed = time.monotonic() - began
            # The job has ended: an outage now must not turn its outcome into exit 3.
            detail = ride_out(
                engine, lambda: job_detail(engine, execution.id), "summary", fresh=True
            )
        finally:
            detach()
    finally:
        engine.dispose()
    outcome = {
        "job_execution_id": execution.id,
        "job": execution.job_name,
        "status": execution.status.value,
        "exit_code": execution.exit_status.code,
        "exit_message": mask_secrets(detail.exit_message or ""),
        "elapsed_s": round(elapsed, 3),
        **summary_json(detail),
    }
    if summary_to_stderr and json_logs:
        import logging

        logging.getLogger("dbcluster.cluster").info("%s", json.dumps(outcome))
    elif as_json:
        click.echo(json.dumps(outcome), err=summary_to_stderr)
    else:
        for line in summary_lines(detail, elapsed):
            click.echo(line, err=summary_to_stderr)
    sys.exit(EXIT_OK if execution.status is BatchStatus.COMPLETED else EXIT_FAILED)


def report_to_parent(execution_id: int) -> None:
    """A detached master tells ``launch --detach`` its execution id on stdout, then lets go of
    the pipe (later output would have no reader)."""
    import json
    import logging

    try:
        sys.stdout.write(json.dumps({"job_execution_id": execution_id}) + "\n")
        sys.stdout.flush()
    except OSError as exc:  # the parent is gone (BrokenPipeError): the master carries on
        logging.getLogger("dbcluster.cluster").warning(
            "could not report execution %s to the launching process (%s); running it anyway",
            execution_id,
            exc,
        )
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def detach_launch(
    url: str,
    app: str,
    job: str,
    params: tuple[str, ...],
    no_work: bool,
    concurrency: int | None,
    log_file: str | None,
    as_json: bool,
    log_choice: LogChoice,
    otel: bool = False,
) -> None:
    """Start ``dbcluster launch --detached-child`` in a session of its own (closing the terminal
    does not stop it), wait for the execution id it reports once the execution is committed,
    print it and return; when it exits before reporting, say why in one line (the last of its
    log) and exit with its status. The child waits a database outage out as this command does
    (the same ``--connect-timeout``), so this wait allows for that."""
    import json
    import subprocess
    import tempfile
    import threading
    import time
    from pathlib import Path

    log_path = Path(
        log_file
        or Path(tempfile.gettempdir())
        / f"dbcluster-launch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    ).resolve()
    args = [sys.executable, "-m", "dbcluster.cli", "launch", "--app", app, "--detached-child"]
    args += ["--no-work"] if no_work else []
    args += ["--concurrency", str(concurrency)] if concurrency else []
    args += ["-v"] if log_choice.verbose else []
    args += ["--log-level", log_choice.level] if log_choice.level else []
    args += ["--log-format", log_choice.format]
    args += ["--otel"] if otel else []
    timeout_s = connect_timeout_s()
    args += ["--connect-timeout", f"{round(timeout_s * 1000)}ms"]
    args += ["--", job, *params]
    # The URL travels in the environment, never on a command line other users can read.
    env = {**os.environ, "DBCLUSTER_URL": url}
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
        )
    assert child.stdout is not None
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.append(child.stdout.readline()), daemon=True)
    reader.start()
    # Its connect and its creating transaction may each wait out an outage.
    reader.join(timeout=120 + 2 * timeout_s)
    line = lines[0] if lines else b""
    try:
        execution_id = int(json.loads(line)["job_execution_id"])
    except (ValueError, KeyError, TypeError):
        if child.poll() is None:
            child.kill()
        code = child.wait()
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        reason = tail[-1] if tail else f"exit status {code}"
        click.echo(f"the background master did not start the job: {reason}", err=True)
        click.echo(f"(log: {log_path})", err=True)
        sys.exit(code if code in (EXIT_USAGE, EXIT_UNAVAILABLE) else EXIT_USAGE if code == 0 else 1)
    child.stdout.close()
    outcome = {
        "job_execution_id": execution_id,
        "job": job,
        "detached": True,
        "pid": child.pid,
        "log_file": str(log_path),
    }
    if as_json:
        click.echo(json.dumps(outcome))
    else:
        click.echo(
            f"job {job} execution {execution_id} launched in the background (pid {child.pid})"
        )
        click.echo(f"  log: {log_path}")
        click.echo(f"  watch it: dbcluster job {execution_id}")
