"""Faults inside a node process: a "cut database connection" for databases that are not reached
over TCP, and fault points the harness arms by file.

A node process started by the fault harness with ``DBCLUSTER_FAULT_CUT_FILE=PATH`` (the test
application installs this switch when it is imported) fails every statement and every new
connection with the driver's ``OperationalError`` while ``PATH`` exists, as a severed link would.
The harness cuts one node by creating its file and restores it by removing it. TCP backends do not
need this: their nodes talk through a :class:`~dbcluster.testing.harness.TcpProxy` that the harness
severs for real.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_installed: set[Any] = set()
CUT_MESSAGE = "dbcluster fault harness: database connection cut"


def _cut_is_a_disconnect(context: Any) -> None:
    """A severed link is a lost connection to SQLAlchemy, as it is on a TCP database: the
    connection is invalidated and the error is transient to every provider (SQLite's own
    driver never reports a lost connection, so without this a cut would look permanent)."""
    if getattr(context.original_exception, "dbcluster_cut", False):
        context.is_disconnect = True


class _Cut:
    def __init__(self, path: str) -> None:
        self.path = path

    def _check(self, dbapi: Any) -> None:
        if os.path.exists(self.path):
            error = getattr(dbapi, "OperationalError", None) or ConnectionError
            cut = error(CUT_MESSAGE)
            cut.dbcluster_cut = True
            raise cut

    def execute(self, cursor: Any, statement: Any, parameters: Any, context: Any) -> None:
        self._check(context.dialect.loaded_dbapi)

    def execute_no_params(self, cursor: Any, statement: Any, context: Any) -> None:
        self._check(context.dialect.loaded_dbapi)

    def connect(self, dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> None:
        self._check(dialect.loaded_dbapi)


def install_cut_switch(path: str) -> None:
    """Make every engine of this process honour the cut file at ``path``."""
    if path in _installed:
        return
    from sqlalchemy import Engine, event

    from dbcluster import points

    cut = _Cut(path)

    def execute(cursor: Any, statement: Any, parameters: Any, context: Any) -> None:
        cut.execute(cursor, statement, parameters, context)

    # It watches the driver's own path too (dbcluster.prebuilt's statements read off the
    # driver's cursor, and a final write sent with its COMMIT): that path stays in use.
    execute.sees_driver_path = True  # type: ignore[attr-defined]

    def driver_execute(conn: Any, **_: Any) -> None:
        cut._check(conn.dialect.loaded_dbapi)

    # Returning None lets the dialect run the statement as usual; raising fails it the way a
    # lost connection does (SQLAlchemy wraps the driver error).
    event.listen(Engine, "do_execute", execute)
    event.listen(Engine, "do_executemany", cut.execute)
    event.listen(Engine, "do_execute_no_params", cut.execute_no_params)
    event.listen(Engine, "do_connect", cut.connect)
    event.listen(Engine, "handle_error", _cut_is_a_disconnect)
    points.install("driver.execute", driver_execute)
    _installed.add(path)


# --- fault points in a node process, steered by files ------------------------------------------

#: Points a harness can arm in a node process.
CONTROLLED_POINTS = ("chunk.before_commit", "master.between_steps", "node.between_poll_and_claim")


class _FaultControl:
    """Parks the first thread that reaches an armed point: the harness arms ``<point>`` by
    creating ``DIR/<point>.arm``; the parked thread writes ``DIR/<point>.parked`` (JSON details,
    written while it holds whatever it holds: a chunk transaction is open there) and waits until
    the arm file is gone. One arm parks one thread."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lock = threading.Lock()

    def handler(self, point: str) -> Any:
        def reached(**details: Any) -> None:
            self._maybe_park(point, details)

        return reached

    def _maybe_park(self, point: str, details: dict[str, Any]) -> None:
        import json
        import time

        arm = os.path.join(self.directory, f"{point}.arm")
        parked = os.path.join(self.directory, f"{point}.parked")
        if not os.path.exists(arm):
            return
        description = _describe(details)
        if description is None:
            return
        with self._lock:
            if os.path.exists(parked) or not os.path.exists(arm):
                return
            with open(parked + ".tmp", "w") as out:
                json.dump({"pid": os.getpid(), **description}, out)
            os.replace(parked + ".tmp", parked)
        while os.path.exists(arm):
            time.sleep(0.01)


def _describe(details: dict[str, Any]) -> dict[str, Any] | None:
    """What a parked thread holds, or None when it is not a thread worth parking (a chunk
    transaction of a partition, a master between steps, a poll)."""
    se = details.get("step_execution")
    if se is not None:
        fence = se.fence
        from dbcluster.cluster.fencing import PartitionFence

        if not isinstance(fence, PartitionFence) or details.get("final"):
            return None
        return {
            "step_execution_id": fence.step_execution_id,
            "node_id": fence.node_id,
            "attempt": fence.attempt,
        }
    je = details.get("job_execution")
    if je is not None:
        return {"job_execution_id": je.id, "next_step": details.get("next_step")}
    if "partitions" in details:
        return {"node_id": details.get("node_id"), "partitions": len(details["partitions"])}
    return None


def install_fault_control(directory: str) -> None:
    """Let the harness park this process's threads at :data:`CONTROLLED_POINTS` (the test
    application also records commit-order observations in such a process: see
    :func:`dbcluster.testing.app.install_observer`)."""
    if ("control", directory) in _installed:
        return
    from dbcluster import points

    control = _FaultControl(directory)
    for point in CONTROLLED_POINTS:
        points.install(point, control.handler(point))
    _installed.add(("control", directory))
