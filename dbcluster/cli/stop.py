"""``dbcluster stop``: ask the cluster to stop a running job execution (see
:mod:`dbcluster.cluster.stopping`). It joins no cluster: the request is one row update.
Also what ``dbcluster launch`` does on Ctrl-C (:func:`interrupts`)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from dbcluster.cli.engines import Tables, open_engine, ride_out
from dbcluster.cli.options import DURATION_S, connect_timeout_option
from dbcluster.errors import DbclusterError

if TYPE_CHECKING:
    from dbcluster.cluster.app import Cluster


@click.command()
@click.option("--url", envvar="DBCLUSTER_URL", required=True, help="SQLAlchemy database URL.")
@connect_timeout_option()
@click.argument("execution_id", type=int)
@click.option(
    "--wait", is_flag=True, help="Wait until the execution has ended and print how it ended."
)
@click.option(
    "--timeout",
    type=DURATION_S,
    default="5m",
    show_default=True,
    help="With --wait: give up waiting after this long (30s, 10m; a bare number is seconds) "
    "and exit 1.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def stop(url: str, execution_id: int, wait: bool, timeout: float, as_json: bool) -> None:
    """Stop the running job execution EXECUTION_ID on every node.

    The execution becomes STOPPING at once; each of its partitions, wherever it runs, stops at
    its next chunk boundary or tasklet call with its position committed, and its master ends
    the job STOPPED. `dbcluster restart EXECUTION_ID` then resumes every partition where it
    stopped. Stopping an execution that already ended (or does not exist) is an error (exit 2).
    """
    from dbcluster.batch.repository import JobRepository
    from dbcluster.cluster.stopping import request_stop
    from dbcluster.cluster.store import CoordinationStore

    engine = open_engine(url, Tables.CURRENT)
    try:
        repository = JobRepository(engine)
        store = CoordinationStore(engine)
        # Stopping a STOPPING execution again changes nothing: safe to repeat.
        execution = ride_out(engine, lambda: request_stop(store, repository, execution_id), "stop")
        if not wait:
            _report(execution_id, execution.job_name, "STOPPING", as_json)
            return
        deadline = time.monotonic() + timeout
        while True:
            # Each look waits an outage out on its own (the stop goes on through it).
            current = ride_out(
                engine, lambda: repository.get_job_execution(execution_id), "wait", fresh=True
            )
            assert current is not None
            if not current.status.is_running:
                _report(execution_id, current.job_name, current.status.value, as_json)
                return
            if time.monotonic() >= deadline:
                click.echo(
                    f"execution {execution_id} is still {current.status.value} after "
                    f"{timeout:g} s; it stops at its partitions' next chunk boundaries",
                    err=True,
                )
                raise click.exceptions.Exit(1)
            time.sleep(0.2)
    finally:
        engine.dispose()


def _report(execution_id: int, job: str, status: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"job_execution_id": execution_id, "job": job, "status": status}))
    elif status == "STOPPING":
        click.echo(
            f"execution {execution_id} of job {job!r} is STOPPING: its partitions stop at their "
            f"next chunk boundary (watch it with `dbcluster job {execution_id}`)"
        )
    else:
        click.echo(f"execution {execution_id} of job {job!r} ended {status}")


# --- Ctrl-C on a launching master (``dbcluster launch --on-interrupt``) -------------------------

#: What ``launch`` does on SIGINT: ask (on a terminal), stop the job, or leave it to the cluster.
ON_INTERRUPT = ("ask", "stop", "detach")


class Detached(KeyboardInterrupt):
    """Ctrl-C chose to leave the job to the cluster: the master leaves (its node deregisters)
    and a live node takes the job over."""

    def __init__(self, execution_id: int) -> None:
        super().__init__(execution_id)
        self.execution_id = execution_id


@contextmanager
def interrupts(cluster: Cluster, execution_id: int, mode: str | None) -> Iterator[None]:
    """While a launching master runs ``execution_id``: SIGINT stops the job cluster-wide (the
    same durable stop as ``dbcluster stop``; the job then ends STOPPED and the launch reports
    it), or raises :class:`Detached` to leave it to the cluster, or asks which (``mode`` "ask",
    the default on a terminal; "stop" elsewhere). A second Ctrl-C after a stop detaches."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if mode is None:
        mode = "ask" if sys.stdin.isatty() else "stop"
    stopped = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        choice = mode
        if stopped.is_set():
            choice = "detach"
        elif choice == "ask":
            try:
                choice = click.prompt(
                    f"\nexecution {execution_id}: stop it on every node, detach (leave it to "
                    f"the cluster) or continue?",
                    type=click.Choice(["stop", "detach", "continue"]),
                    default="stop",
                    err=True,
                )
            except (click.exceptions.Abort, KeyboardInterrupt, EOFError):
                choice = "detach"
        if choice == "stop":
            stopped.set()
            click.echo(
                f"\nstopping execution {execution_id}: its partitions stop at their next chunk "
                f"boundary (Ctrl-C again to detach)",
                err=True,
            )
            # Off the signal handler: the request is a database write.
            threading.Thread(
                target=_stop_quietly, args=(cluster, execution_id), name="dbcluster-stop"
            ).start()
        elif choice == "detach":
            raise Detached(execution_id)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_quietly(cluster: Cluster, execution_id: int) -> None:
    try:
        cluster.stop_execution(execution_id)
    except DbclusterError as exc:  # it ended meanwhile: the launch reports how
        click.echo(f"not stopped: {exc}", err=True)
    except Exception as exc:  # noqa: BLE001 - reported; the user may Ctrl-C again to detach
        click.echo(f"could not request the stop: {exc}", err=True)
