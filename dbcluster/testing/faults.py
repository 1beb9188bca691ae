"""A per-process "cut database connection" for databases that are not reached over TCP.

A node process started by the fault harness with ``DBCLUSTER_FAULT_CUT_FILE=PATH`` (the test
application installs this switch when it is imported) fails every statement and every new
connection with the driver's ``OperationalError`` while ``PATH`` exists, as a severed link would.
The harness cuts one node by creating its file and restores it by removing it. TCP backends do not
need this: their nodes talk through a :class:`~dbcluster.testing.harness.TcpProxy` that the harness
severs for real.
"""

from __future__ import annotations

import os
from typing import Any

_installed: set[str] = set()


class _Cut:
    def __init__(self, path: str) -> None:
        self.path = path

    def _check(self, dbapi: Any) -> None:
        if os.path.exists(self.path):
            error = getattr(dbapi, "OperationalError", None) or ConnectionError
            raise error("dbcluster fault harness: database connection cut")

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

    cut = _Cut(path)
    # Returning None lets the dialect run the statement as usual; raising fails it the way a
    # lost connection does (SQLAlchemy wraps the driver error).
    event.listen(Engine, "do_execute", cut.execute)
    event.listen(Engine, "do_executemany", cut.execute)
    event.listen(Engine, "do_execute_no_params", cut.execute_no_params)
    event.listen(Engine, "do_connect", cut.connect)
    _installed.add(path)
