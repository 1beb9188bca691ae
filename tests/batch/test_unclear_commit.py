"""An unclear commit (its acknowledgement lost) is judged by reading the row it wrote. Where the
session that sent the COMMIT cannot be ended first (MySQL and MariaDB; PostgreSQL behind a
pooler in transaction mode), that COMMIT may still be in flight when the judging read runs: the
read must wait for it and see the latest committed row, not the row as it was before."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Connection, select, text, update

from dbcluster import schema
from dbcluster.batch.repository import JobRepository
from dbcluster.testing.backends import Backend
from dbcluster.testing.history import add_execution
from dbcluster.testing.waiting import wait_for

#: Per backend: this session's id, and a read with a row while that session waits for a lock.
_SESSIONS = {
    "postgresql": (
        "SELECT pg_backend_pid()",
        "SELECT 1 FROM pg_locks WHERE pid = :session AND NOT granted",
    ),
    "mariadb": (
        "SELECT CONNECTION_ID()",
        "SELECT 1 FROM information_schema.innodb_trx"
        " WHERE trx_mysql_thread_id = :session AND trx_state = 'LOCK WAIT'",
    ),
}


def _waiting(conn: Connection, backend: Backend, session: int) -> bool:
    found = conn.execute(text(_SESSIONS[backend.name][1]), {"session": session}).first()
    conn.commit()
    return found is not None


@pytest.mark.backends("postgresql", "mariadb")
def test_an_unclear_commit_still_in_flight_is_judged_by_its_outcome(backend: Backend) -> None:
    """The step's final write has bumped the row's version and its COMMIT is still in flight
    (the writing transaction holds the row) when the unclear commit is judged: the judging read
    waits for it and finds the new version (a plain read saw the version before, so the step
    was told its write did not land and repeated it into an optimistic-locking failure)."""
    engine = backend.engine
    step_id = add_execution(engine, "nightly", "k", partitions_count=1).step_ids[0]
    se = schema.step_execution
    with engine.connect() as conn:
        version = int(
            conn.execute(select(se.c.version).where(se.c.step_execution_id == step_id)).scalar_one()
        )
    repository = JobRepository(engine)
    execution: Any = SimpleNamespace(id=step_id)
    verify = repository.step_version_is(execution, version + 1)
    judged: list[bool] = []
    sessions: list[int] = []
    errors: list[BaseException] = []

    def judge() -> None:
        try:
            with engine.connect() as conn:
                sessions.append(int(conn.execute(text(_SESSIONS[backend.name][0])).scalar_one()))
                conn.commit()
                judged.append(verify(conn))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    writer = engine.connect()
    try:
        writing = writer.begin()
        bumped = writer.execute(
            update(se).where(se.c.step_execution_id == step_id).values(version=version + 1)
        )
        assert bumped.rowcount == 1
        judging = threading.Thread(target=judge)
        judging.start()
        with engine.connect() as watcher:
            # The judgement read the row already, or waits for the writer's COMMIT.
            wait_for(
                lambda: judged or errors or (sessions and _waiting(watcher, backend, sessions[0])),
                30,
                "the unclear commit's judgement to read or to wait",
            )
        writing.commit()  # the COMMIT that was in flight lands
        judging.join(30)
    finally:
        writer.close()
    assert not errors, errors
    assert judged == [True], "the judgement read the row as it was before the COMMIT landed"
