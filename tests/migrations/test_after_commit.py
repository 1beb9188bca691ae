"""What must not share a revision's transaction runs after it commits.

Db2 reorganizes a table whose columns a revision retyped (``ADMIN_CMD('REORG TABLE ...')``): not
in the transaction of the uncommitted ALTER. ``dbcluster migrate`` runs it in a transaction of its
own once the revision (and its version row) has committed; the DBA's script says COMMIT first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, inspect
from test_migrate import create_0_1_0

from dbcluster import migrations
from dbcluster.dialects import make_engine, provider_for_name
from dbcluster.migrations import Revision
from dbcluster.migrations.ops import Operations
from dbcluster.migrations.versions import r0002_epochs_retries_versions as r0002

REORGS = [
    "CALL SYSPROC.ADMIN_CMD('REORG TABLE batch_job_execution_context')",
    "CALL SYSPROC.ADMIN_CMD('REORG TABLE batch_step_execution_context')",
]


def test_db2_reorganizes_the_retyped_tables_only_after_the_revision() -> None:
    op = Operations(provider_for_name("db2"), None)
    r0002.upgrade(op)
    assert not [s for s in op.statements if "REORG" in s], "REORG inside the ALTER's transaction"
    assert op.after_commit == REORGS
    assert any("SET DATA TYPE CLOB(1073741824)" in s for s in op.statements)
    script = migrations.upgrade_sql(provider_for_name("db2"))
    lines = [line for line in script.splitlines() if line]
    commit = lines.index("COMMIT;")
    assert lines[commit + 1 :] == [
        "-- once the revision has committed, each on its own:",
        *(f"{reorg};" for reorg in REORGS),
    ]
    assert "REORG" not in "\n".join(lines[:commit])


def test_no_other_database_has_work_after_the_revision() -> None:
    for name in ("postgresql", "mysql", "mariadb", "oracle", "mssql", "sqlite"):
        op = Operations(provider_for_name(name), None)
        r0002.upgrade(op)
        assert op.after_commit == [], name


def test_migrate_runs_it_in_a_transaction_of_its_own_after_the_revision_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite, a stand-in revision 0002 that leaves a statement for after its commit: the
    statement runs alone in a later transaction, once the version row has committed."""
    engine = make_engine(f"sqlite:///{tmp_path / 'after.db'}")
    create_0_1_0(engine)
    first, second = migrations.revisions()

    def upgrade(op: Operations) -> None:
        second.upgrade(op)
        op.after_commit.append("CREATE TABLE dbc_after_commit (x INTEGER)")

    monkeypatch.setattr(
        migrations,
        "revisions",
        lambda: (first, Revision(second.revision, "0001", second.release, second.doc, upgrade)),
    )
    transactions: list[list[str]] = []
    committed: list[list[str]] = []

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        transactions.append([])

    @event.listens_for(engine, "before_cursor_execute")
    def _statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if transactions and statement not in ("BEGIN", "BEGIN IMMEDIATE"):
            transactions[-1].append(statement)

    @event.listens_for(engine, "commit")
    def _commit(conn: Any) -> None:
        committed.append(transactions[-1])

    applied = migrations.upgrade(engine)
    assert [r.revision for r in applied] == ["0002"]
    assert "dbc_after_commit" in inspect(engine).get_table_names()
    alone = [t for t in committed if any("dbc_after_commit" in s for s in t)]
    assert alone == [["CREATE TABLE dbc_after_commit (x INTEGER)"]], alone
    revision = next(t for t in committed if any("INSERT INTO batch_schema_version" in s for s in t))
    assert committed.index(revision) < committed.index(alone[0])
    engine.dispose()
