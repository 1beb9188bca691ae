"""Schema versions and ``dbcluster migrate``: a database made and filled by the released 0.1.0 is
migrated, matches one made fresh, and its executions show and restart; the SQL for a DBA is
current for every database; a node refuses a schema it does not match."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    inspect,
    select,
    text,
    update,
)

from dbcluster import migrations, schema
from dbcluster.cli import main
from dbcluster.cluster.app import Cluster
from dbcluster.dialects import BUILTIN_NAMES, get_provider, make_engine, provider_for_name
from dbcluster.errors import SchemaMissingError, SchemaVersionError
from dbcluster.migrations.ops import Operations
from dbcluster.migrations.versions import r0002_epochs_retries_versions as r0002
from dbcluster.testing import app
from dbcluster.testing.app import FAST_SETTINGS, build_registry, ledger, ledger_metadata
from dbcluster.testing.backends import Backend, drop_tables

ROOT = Path(__file__).resolve().parents[2]
#: Rows dbcluster 0.1.0 itself wrote (its code at the 0.1.0 tag, on SQLite): job "ledger" run
#: twice over 300 items in 3 partitions, execution 1 COMPLETED, execution 2 FAILED in partition
#: r-000100-000200; with the test application's ledger.
ROWS_0_1_0 = json.loads((Path(__file__).parent / "rows_0_1_0.json").read_text())
FAILED_EXECUTION = 2


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``dbcluster ARGS`` in this process (cheaper than a subprocess): exit status, out, err."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def create_0_1_0(engine: Engine) -> None:
    """The 0.1.0 schema, from the DDL 0.1.0 shipped (revision 0001), filled with its rows."""
    drop_tables(engine)
    drop_version = schema.schema_version
    drop_version.drop(engine, checkfirst=True)
    with engine.begin() as conn:
        migrations.revisions()[0].upgrade(Operations(get_provider(engine), conn))
    ledger_metadata.create_all(engine)
    reflected = MetaData()
    reflected.reflect(engine)
    with engine.begin() as conn:
        for table in [*reflected.sorted_tables]:
            rows = ROWS_0_1_0.get(table.name, [])
            if not rows:
                continue
            dates = {c.name for c in table.columns if isinstance(c.type, DateTime)}
            conn.execute(
                table.insert(),
                [
                    {k: datetime.fromisoformat(v) if k in dates and v else v for k, v in r.items()}
                    for r in rows
                ],
            )
        if engine.dialect.name == "postgresql":  # explicit ids leave identities behind
            for table, column in (
                ("batch_job_instance", "job_instance_id"),
                ("batch_job_execution", "job_execution_id"),
                ("batch_step_execution", "step_execution_id"),
                ("dbc_test_ledger", "id"),
                ("dbc_test_runs", "id"),
            ):
                conn.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
                        f"(SELECT max({column}) FROM {table}))"
                    )
                )


def live_clock(engine: Engine) -> datetime:
    """The database clock now, as a value to insert."""
    with engine.connect() as conn:
        value = conn.execute(get_provider(engine).select_now()).scalar()
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def shape(url: str) -> dict[str, Any]:
    """Tables, columns (name, type class and length, nullability, collation), primary keys,
    indexes, unique constraints and foreign keys of the dbcluster tables, as reflected.

    Reflected through an engine of its own, on connections opened now: SQLite answers its
    PRAGMAs (columns, indexes, the automatic index a UNIQUE needs to be reported) from the
    connection's cached schema, which a pooled connection that last read before another
    connection's DROP and CREATE still holds, while the CREATE TABLE text comes fresh."""
    engine = make_engine(url)
    try:
        return _shape(engine)
    finally:
        engine.dispose()


def _shape(engine: Engine) -> dict[str, Any]:
    inspector = inspect(engine)
    out: dict[str, Any] = {}
    for table in schema.ALL_TABLES:
        name = table.name
        columns = {
            c["name"].lower(): (
                type(c["type"]).__name__,
                getattr(c["type"], "length", None),
                c["nullable"],
                getattr(c["type"], "collation", None),
            )
            for c in inspector.get_columns(name)
        }
        indexes = {
            str(i["name"]).lower(): (tuple(i["column_names"]), bool(i["unique"]))
            for i in inspector.get_indexes(name)
        }
        uniques = {
            str(u["name"]).lower(): tuple(u["column_names"])
            for u in inspector.get_unique_constraints(name)
        }
        foreign = sorted(
            (str(f["name"]).lower(), tuple(f["constrained_columns"]), f["referred_table"])
            for f in inspector.get_foreign_keys(name)
        )
        primary = tuple(inspector.get_pk_constraint(name)["constrained_columns"])
        out[name] = {
            "columns": columns,
            "indexes": indexes,
            "uniques": uniques,
            "foreign": foreign,
            "primary": primary,
        }
    return out


def restore(backend: Backend) -> None:
    """The current schema again, for the tests that follow on this backend."""
    drop_tables(backend.engine)
    ledger_metadata.drop_all(backend.engine)
    schema.metadata.create_all(backend.engine)


def test_a_0_1_0_database_migrates_to_the_current_schema_and_its_jobs_restart(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = backend.engine
    try:
        create_0_1_0(engine)
        with engine.connect() as conn:
            assert migrations.current_version(conn) == "0001"

        # Nothing runs against it: a node, init and the commands say to migrate.
        with pytest.raises(SchemaVersionError, match="run `dbcluster migrate`"):
            Cluster(backend.url, build_registry(per_node=3, items=300), FAST_SETTINGS).start()
        status, _, err = run_main(capsys, "init", "--url", backend.url)
        assert status == 2 and err.count("\n") == 1 and "run `dbcluster migrate`" in err, err

        # Not under a live cluster: a node that heartbeated a moment ago stops it.
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO batch_nodes (node_id, host, status, created_time, "
                    "last_heartbeat, current_load, capacity) VALUES ('n1', 'h', 'ACTIVE', "
                    ":now, :now, 0, 1)"
                ),
                {"now": live_clock(engine)},
            )
        with pytest.raises(SchemaVersionError, match="stop every node before migrating"):
            migrations.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM batch_nodes"))

        # A revision cut short (MySQL, MariaDB and Oracle commit each DDL statement) completes:
        # its steps skip what is done.
        with engine.begin() as conn:
            op = Operations(get_provider(engine), conn)
            op.add_column(
                "batch_partitions",
                Column("max_attempts", Integer, nullable=False, server_default=text("1")),
            )
            op.create_index(r0002.ix_part_status)

        applied = migrations.upgrade(engine)
        assert [r.revision for r in applied] == ["0002"]
        assert migrations.upgrade(engine) == []  # idempotent: a current database is left alone
        migrations.require_current_schema(engine)
        migrated = shape(backend.url)
        with engine.connect() as conn:
            masters = conn.execute(select(schema.job_masters)).mappings().all()
        assert {(m["job_execution_id"], m["master_epoch"], m["reason"]) for m in masters} == {
            (1, 1, "launched"),
            (2, 1, "launched"),
        }

        # The old executions show...
        status, out, err = run_main(capsys, "jobs", "--url", backend.url, "--json")
        assert status == 0, err
        shown = {j["job_execution_id"]: j["status"] for j in json.loads(out)}
        assert shown == {1: "COMPLETED", 2: "FAILED"}
        status, out, err = run_main(capsys, "job", "--url", backend.url, "2", "--json")
        assert status == 0, err
        assert "r-000100-000200" in out

        # ... and the failed one, its cause mended (its "fail" parameter now ignored), restarts
        # where it failed: every item once.
        param = app._param
        monkeypatch.setattr(app, "_param", lambda ctx, n, d: d if n == "fail" else param(ctx, n, d))
        registry = build_registry(per_node=3, items=300)
        with Cluster(backend.url, registry, FAST_SETTINGS) as cluster:
            again = cluster.restart(FAILED_EXECUTION)
        assert again.status.name == "COMPLETED"
        with engine.connect() as conn:
            done = conn.execute(
                select(ledger.c.partition_name, ledger.c.lo, ledger.c.hi).where(
                    ledger.c.job_execution_id.in_([FAILED_EXECUTION, again.id])
                )
            ).all()
        assert sorted(done) == [
            ("r-000000-000100", 0, 100),
            ("r-000100-000200", 100, 200),
            ("r-000200-000300", 200, 300),
        ]

        # The migrated tables are those a fresh init makes.
        restore(backend)
        fresh = shape(backend.url)
        assert migrated == fresh
    finally:
        restore(backend)


def test_init_records_the_version_and_a_node_refuses_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    status, _, err = run_main(capsys, "init", "--url", url)
    assert status == 0, err
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.HEAD
        status, out, err = run_main(capsys, "migrate", "--url", url)
        assert status == 0 and "nothing to do" in out, err
        with engine.begin() as conn:
            conn.execute(update(schema.schema_version).values(version_num="9999"))
        with pytest.raises(SchemaVersionError, match="newer than this dbcluster"):
            migrations.require_current_schema(engine)
        proc = run_cli("worker", "--url", url, "--app", "dbcluster.testing.app:registry")
        assert proc.returncode == 2 and "upgrade dbcluster" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1
    finally:
        engine.dispose()


def test_migrate_current_and_history_say_where_a_database_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = make_engine(url)
    try:
        status, out, err = run_main(capsys, "migrate", "current", "--url", url)
        assert (status, out) == (0, "no dbcluster tables: run `dbcluster init`\n"), err
        create_0_1_0(engine)
        status, out, err = run_main(capsys, "migrate", "current", "--url", url)
        assert status == 0, err
        assert out.startswith("0001 (dbcluster 0.1.0): The schema dbcluster 0.1.0 released")
        assert out.endswith("; 1 revision(s) to apply (0002): run `dbcluster migrate`\n")
        status, out, err = run_main(capsys, "migrate", "history", "--url", url)
        assert status == 0, err
        lines = out.splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "<base> -> 0001 (dbcluster 0.1.0) (current)",
            "0001 -> 0002 (dbcluster 0.2.0) (head, pending)",
        ]
        status, out, err = run_main(capsys, "migrate", "--url", url)
        assert status == 0 and "applied 0002" in out, err
        status, out, err = run_main(capsys, "migrate", "current", "--url", url, "--json")
        found = json.loads(out)
        assert (found["revision"], found["head"], found["pending"]) == ("0002", "0002", [])
        assert found["applied_time"].endswith("Z")
        status, out, err = run_main(capsys, "migrate", "history", "--json")  # no connection
        chain = [(r["revision"], r["down_revision"], r["release"]) for r in json.loads(out)]
        assert chain == [("0001", None, "0.1.0"), ("0002", "0001", "0.2.0")]
        status, out, err = run_main(capsys, "migrate", "--url", url, "history")
        assert status == 0 and "(head, current)" in out, err
        status, out, err = run_main(capsys, "migrate", "--force", "current", "--url", url)
        assert status == 2 and "go with migrate, not migrate current" in err
    finally:
        engine.dispose()


def test_an_empty_database_is_not_migrated(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.sqlite'}")
    try:
        with pytest.raises(SchemaMissingError, match="dbcluster init"):
            migrations.upgrade(engine)
        with pytest.raises(SchemaMissingError, match="dbcluster init"):
            migrations.require_current_schema(engine)
    finally:
        engine.dispose()


def test_revisions_form_one_chain_ending_at_the_schema_version() -> None:
    chain = migrations.revisions()
    assert [r.revision for r in chain] == ["0001", "0002"]
    assert chain[0].down_revision is None
    assert all(b.down_revision == a.revision for a, b in zip(chain, chain[1:], strict=False))
    assert chain[-1].revision == schema.SCHEMA_VERSION == migrations.HEAD


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_the_migration_sql_is_compiled_for_every_database_and_checked_in(name: str) -> None:
    provider = provider_for_name(name)
    for revision in migrations.revisions()[1:]:
        sql = migrations.upgrade_sql(
            provider, from_version=revision.down_revision or "", to=revision.revision
        )
        path = ROOT / "schemas" / "migrations" / f"{revision.revision}.{name}.sql"
        assert path.read_text() == sql, (
            f"{path.relative_to(ROOT)} is out of date: run `dbcluster migrate --sql --dialect "
            f"{name} --from {revision.down_revision} --to {revision.revision} > "
            f"{path.relative_to(ROOT)}`"
        )
        assert f"VALUES ('{revision.revision}'" in sql or f"(N'{revision.revision}'" in sql
    # The live-node check before migrating compiles too.
    assert "batch_nodes" in str(provider.count_live_nodes(60_000).compile(dialect=provider.dialect))


def test_the_checked_in_ddl_records_its_version() -> None:
    """The version row is the script's last statement; where the database's tools do not
    commit on exit (Oracle's SQLcl, SQL Developer), a COMMIT follows it."""
    for name in BUILTIN_NAMES:
        lines = [
            line for line in (ROOT / "schemas" / f"{name}.sql").read_text().splitlines() if line
        ]
        if name == "oracle":
            assert lines[-1] == "COMMIT;", lines[-3:]
            lines.pop()
        assert "INSERT INTO batch_schema_version" in lines[-1]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["migrate", "--sql"], "--dialect NAME or --url URL"),
        (["migrate", "--sql", "--dialect", "sqlite", "--from", "0009"], "no schema revision"),
        (["migrate", "--dialect", "sqlite"], "go with --sql"),
    ],
)
def test_bad_migrate_arguments_get_one_line(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_main(capsys, *args)
    assert status == 2 and expected in err, err
