"""The suite and ``dbcluster chaos`` judge only their own run, whatever ran before in the same
database (issue 17, item 5). The long form is a command, not a test (docs/PROVIDERS.md):

    pytest -p dbcluster.testing.plugin --pyargs dbcluster.testing.suite --dbcluster-url URL
    dbcluster chaos --url URL --faults 4 --jobs 2 && dbcluster chaos --url URL --faults 4 --jobs 2
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, insert, inspect, select

from dbcluster import schema
from dbcluster.testing.app import ledger, ledger_metadata, runs
from dbcluster.testing.backends import Backend, drop_tables
from dbcluster.testing.chaos import format_summary, run_chaos
from dbcluster.testing.suite import test_provider as suite


def _count(backend: Backend, table: object) -> int:
    with backend.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()  # type: ignore[arg-type]


@pytest.mark.backends("sqlite", "postgresql", "mariadb")
def test_the_test_tables_are_reset_and_dropped_with_the_dbcluster_tables(backend: Backend) -> None:
    ledger_metadata.create_all(backend.engine)
    row = {"job_execution_id": 1, "step_execution_id": 2, "partition_name": "p", "transferable": 1}
    with backend.engine.begin() as conn:
        conn.execute(insert(runs).values(**row))
        conn.execute(insert(ledger).values(**row, lo=0, hi=1, total=0))
    backend.reset()
    assert (_count(backend, runs), _count(backend, ledger)) == (0, 0)
    drop_tables(backend.engine)
    assert not {t.name for t in ledger_metadata.sorted_tables} & set(
        inspect(backend.engine).get_table_names()
    )
    schema.metadata.create_all(backend.engine)  # as the next test expects them


def _short_chaos(backend: Backend, workdir: Path) -> dict[str, object]:
    return run_chaos(
        backend.url,
        nodes=2,
        jobs=1,
        faults=0,
        delay_ms=300,
        tick_ms=100,
        settle_timeout=60,
        workdir=workdir,
    )


@pytest.mark.backends("sqlite", "postgresql", "mariadb")
def test_chaos_after_the_suite_restarted_the_ids_judges_only_its_own_rows(
    backend: Backend, tmp_path: Path
) -> None:
    first = _short_chaos(backend, tmp_path / "first")
    assert first["ok"], format_summary(first)
    # What the suite does to a database it cannot replace: the dbcluster tables are dropped and
    # made again, so the next job and step execution ids are the first run's again.
    suite.test_ddl_covers_every_table_and_init_is_idempotent(backend)
    second = _short_chaos(backend, tmp_path / "second")
    assert second["ok"], format_summary(second)
