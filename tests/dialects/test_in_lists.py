"""IN lists whose length depends on the data stay under every database's limit.

Oracle refuses an IN list of more than 1,000 values (ORA-01795), SQL Server a statement of more
than 2,100 parameters (error 8003). SQLite accepts both, so these tests count the parameters of
every statement the code sends and hold them to Oracle's limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert

from dbcluster import monitor, schema
from dbcluster.dialects import make_engine
from dbcluster.inlists import IN_LIST_MAX, in_batches

ORACLE_IN_LIST_LIMIT = 1000
MANY = 1_200


@pytest.fixture
def engine(tmp_path: Any) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'in-lists.db'}")
    schema.metadata.create_all(engine)
    yield engine
    engine.dispose()


def _widest_statement(engine: Engine) -> list[int]:
    """Records the parameter count of every statement executed on ``engine``."""
    widths: list[int] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _count(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            widths.append(len(parameters or ()))

    return widths


def _many_executions(engine: Engine, count: int) -> None:
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(
            insert(schema.job_instance),
            [{"job_name": "wide", "job_key": f"{i:064d}", "version": 0} for i in range(count)],
        )
        conn.execute(
            insert(schema.job_execution),
            [
                {"version": 0, "job_instance_id": i + 1, "create_time": now, "status": "COMPLETED"}
                for i in range(count)
            ],
        )


def test_in_batches_slices() -> None:
    assert list(in_batches([])) == []
    assert [len(b) for b in in_batches(range(1001))] == [500, 500, 1]
    assert [len(b) for b in in_batches(range(5), 2)] == [2, 2, 1]
    assert max(len(b) for b in in_batches(range(5000), 10_000)) == IN_LIST_MAX
    with pytest.raises(ValueError):
        list(in_batches([1], 0))


def test_monitor_partition_counts_batch_their_in_list(engine: Engine) -> None:
    _many_executions(engine, MANY)
    widths = _widest_statement(engine)
    rows = monitor.recent_jobs(engine, limit=MANY)
    assert len(rows) == MANY
    assert max(widths) <= ORACLE_IN_LIST_LIMIT, (
        f"a monitor statement bound {max(widths)} parameters (Oracle takes 1,000 in a list)"
    )
