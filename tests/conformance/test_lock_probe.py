"""Chaos's lock probe (``Harness.partition_locked``) answers "locked" only for a lock conflict:
it once read every error as "locked", so a statement the dialect could not even compile (Db2's
``FOR UPDATE`` under ``ibm_db_sa`` 0.4.4) passed as proof that a parked writer held its row."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from dbcluster.schema import partitions
from dbcluster.testing.backends import Backend
from dbcluster.testing.harness import Harness
from dbcluster.testing.suite.provider_helpers import _place, _register

SERVERS = pytest.mark.backends("postgresql", "mariadb", "mysql")


@SERVERS
def test_the_probe_tells_a_held_row_from_a_free_one(backend: Backend, tmp_path: Path) -> None:
    _register(backend.engine, backend.provider, "probe-n1")
    _, (sid, _other) = _place(backend.engine, backend.provider, "probe-n1")
    harness = Harness(backend.url, tmp_path)
    try:
        assert not harness.partition_locked(backend.engine, sid)
        with backend.engine.connect() as conn, conn.begin():
            conn.execute(
                partitions.update()
                .where(partitions.c.step_execution_id == sid)
                .values(attempt=partitions.c.attempt)
            )
            assert harness.partition_locked(backend.engine, sid)
        assert not harness.partition_locked(backend.engine, sid)
    finally:
        harness.close()


@SERVERS
def test_an_error_that_is_no_lock_conflict_is_raised_not_read_as_locked(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = Harness(backend.url, tmp_path)
    refused = OperationalError("SELECT ... FOR UPDATE NOWAIT", {}, Exception("syntax error"))

    def broken(*_args: object, **_kwargs: object) -> None:
        raise refused

    monkeypatch.setattr(type(backend.engine), "connect", broken)
    try:
        with pytest.raises(OperationalError):
            harness.partition_locked(backend.engine, 1)
    finally:
        monkeypatch.undo()
        harness.close()
