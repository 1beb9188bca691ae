"""A prebuilt statement sends what SQLAlchemy would: the same text, the constants it bound, each
value through its type's bind processor; and reads back the same values."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, bindparam, insert, select

from dbcluster.prebuilt import Prebuilt, PrebuiltStatements
from dbcluster.schema import Flag, ShortText
from dbcluster.testing.backends import Backend

metadata = MetaData()
table = Table(
    "dbc_test_prebuilt",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    # Clipped: its bind processor cuts a long value (a processor the prebuilt must apply).
    Column("name", ShortText(10, clip=True)),
    Column("kind", ShortText(10)),
    Column("flag", Flag(name="ck_dbc_test_prebuilt_flag")),
)
INSERT = insert(table).values(
    id=bindparam("b_id"), name=bindparam("b_name"), kind="fixed", flag=bindparam("b_flag")
)
READ = select(table.c.name, table.c.kind, table.c.flag).where(table.c.id == bindparam("b_id"))


def test_it_writes_and_reads_what_sqlalchemy_would(backend: Backend) -> None:
    engine = backend.engine
    built = Prebuilt.build(INSERT, engine.dialect)
    read = Prebuilt.build(READ, engine.dialect)
    if engine.dialect.paramstyle not in ("pyformat", "named"):
        assert built is None and read is None  # positional: executed as usual
        return
    assert built is not None
    # A read whose columns the driver does not return as their Python values (MySQL's flag, an
    # integer read back as a bool) is executed as usual.
    processed = any(
        c.type.dialect_impl(engine.dialect).result_processor(engine.dialect, None) is not None
        for c in READ.selected_columns
    )
    assert (read is None) == processed
    metadata.create_all(engine)
    try:
        long_name = "a name longer than ten"
        with engine.begin() as conn:
            built.execute(conn, {"b_id": 1, "b_name": long_name, "b_flag": True})
            conn.execute(INSERT, {"b_id": 2, "b_name": long_name, "b_flag": True})
        with engine.connect() as conn:

            def fetch(i: int) -> Any:
                found = read.execute(conn, {"b_id": i}) if read else conn.execute(READ, {"b_id": i})
                return found.one()

            ours, also = fetch(1), fetch(2)
            theirs = conn.execute(READ, {"b_id": 2}).one()
        assert tuple(ours) == tuple(theirs) == tuple(also)
        assert ours.name != long_name and len(ours.name) <= 10  # clipped on the way in
        assert ours.kind == "fixed" and bool(ours.flag) is True
    finally:
        metadata.drop_all(engine)


def test_a_missing_parameter_is_named(backend: Backend) -> None:
    built = Prebuilt.build(INSERT, backend.engine.dialect)
    if built is None:
        pytest.skip(f"{backend.engine.dialect.paramstyle} parameters: never prebuilt")
    with backend.engine.connect() as conn, pytest.raises(TypeError, match="b_flag"):
        built.execute(conn, {"b_id": 1, "b_name": "x"})


def test_an_in_list_expanded_per_execution_is_not_prebuilt(backend: Backend) -> None:
    statement = select(table.c.id).where(table.c.id.in_(bindparam("b_ids", expanding=True)))
    assert Prebuilt.build(statement, backend.engine.dialect) is None


RETURNING = (
    insert(table)
    .values(id=bindparam("b_id"), name=bindparam("b_name"), kind="fixed")
    .returning(table.c.id, table.c.name, (table.c.id + 1).label("next id"))
)


def _prebuilt(backend: Backend, statement: Any) -> Prebuilt:
    built = Prebuilt.build(statement, backend.engine.dialect)
    if built is None:
        pytest.skip(f"{backend.engine.dialect.paramstyle} parameters: never prebuilt")
    return built


_DIRECT_CHECK = """
import json, sys
from sqlalchemy import Integer, bindparam, literal_column, select
from dbcluster.dialects import make_engine
from dbcluster.prebuilt import Prebuilt, PrebuiltStatements

engine = make_engine(sys.argv[1])
statement = select(
    bindparam("b_v", type_=Integer).label("v"), literal_column("2").label("next id")
)
built = Prebuilt.build(statement, engine.dialect)
with engine.begin() as conn:
    row = built.one(conn, {"b_v": 7})
assert built._row is not None, "the row did not come off the driver's cursor"
print(json.dumps([row.v, row._mapping["next id"]]))
"""


def _direct_in_a_process_of_its_own(backend: Backend, check: str = _DIRECT_CHECK) -> Any:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", check, backend.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def made(backend: Backend) -> Any:
    metadata.create_all(backend.engine)
    yield backend.engine
    metadata.drop_all(backend.engine)


def test_its_one_row_read_on_the_driver_is_the_row_sqlalchemy_reads(
    backend: Backend, made: Any
) -> None:
    """In a transaction and unseen, the row comes off the driver's cursor: the same values,
    attributes and mapping (a column name that cannot be an attribute is still a key)."""
    built = _prebuilt(backend, RETURNING)
    with made.begin() as conn:
        ours = built.one(conn, {"b_id": 1, "b_name": "a name longer than ten"})
        theirs = conn.execute(RETURNING, {"b_id": 2, "b_name": "a name longer than ten"}).one()
    # Whichever path it took here (another test of this process may have left a listener on
    # every engine, or SQLAlchemy's logging on), in a process of its own it takes the driver's.
    assert _direct_in_a_process_of_its_own(backend) == [7, 2]
    assert (ours.id, ours.name) == (1, theirs.name) and len(ours.name) <= 10
    assert dict(ours._mapping) == {**dict(theirs._mapping), "id": 1, "next id": 2}
    assert tuple(ours) == (1, theirs.name, 2)


def test_a_statement_something_listens_to_goes_through_sqlalchemy(
    backend: Backend, made: Any
) -> None:
    """A statement listener (the bench's counters, a test's recorder) sees it."""
    from sqlalchemy import event

    built = _prebuilt(backend, RETURNING)
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(made, "before_cursor_execute", record)
    try:
        with made.begin() as conn:
            row = built.one(conn, {"b_id": 1, "b_name": "x"})
    finally:
        event.remove(made, "before_cursor_execute", record)
    assert row.id == 1 and row._mapping["next id"] == 2
    assert seen == [built.sql] and built._row is None


def test_a_failure_on_the_driver_is_handled_as_sqlalchemy_handles_it(
    backend: Backend, made: Any
) -> None:
    """The same wrapped error, ``handle_error`` listeners called; and a connection lost under
    the statement is invalidated, so the pool does not hand it out again."""
    from sqlalchemy import event, text
    from sqlalchemy.exc import DBAPIError, IntegrityError

    built = _prebuilt(backend, RETURNING)
    handled: list[Any] = []

    def on_error(context: Any) -> None:
        handled.append(context.original_exception)

    event.listen(made, "handle_error", on_error)
    try:
        with made.begin() as conn:
            built.one(conn, {"b_id": 1, "b_name": "x"})
        with pytest.raises(IntegrityError), made.begin() as conn:
            built.one(conn, {"b_id": 1, "b_name": "x"})
        assert len(handled) == 1
        postgresql = made.dialect.name == "postgresql"
        conn = made.connect()
        pid = conn.exec_driver_sql(
            "SELECT pg_backend_pid()" if postgresql else "SELECT CONNECTION_ID()"
        ).scalar_one()
        conn.rollback()
        with made.connect() as killer:  # another connection: ``conn`` is still checked out
            killer.execute(
                text("SELECT pg_terminate_backend(:pid)" if postgresql else "KILL :pid"),
                {"pid": pid},
            )
        conn.begin()
        with pytest.raises(DBAPIError) as lost:
            built.one(conn, {"b_id": 2, "b_name": "x"})
        assert lost.value.connection_invalidated, lost.value
        assert conn.invalidated
        conn.close()
    finally:
        event.remove(made, "handle_error", on_error)


def test_an_in_list_built_for_a_length_sends_what_sqlalchemy_sends(
    backend: Backend, made: Any
) -> None:
    """The text SQLAlchemy expands the list to for that length (so the server plans it as it
    plans SQLAlchemy's), each value through the list's processor; another length is refused."""
    from sqlalchemy import event

    statement = (
        select(table.c.id, table.c.name)
        .where(table.c.id.in_(bindparam("b_ids", expanding=True)), table.c.kind == "fixed")
        .order_by(table.c.id)
    )
    built = Prebuilt.build(statement, made.dialect, {"b_ids": 2})
    if made.dialect.paramstyle not in ("pyformat", "named"):
        assert built is None
        return
    assert built is not None
    assert Prebuilt.build(statement, made.dialect) is None  # the list's length is needed
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        sent.append(sql)

    with made.begin() as conn:
        for i in (1, 2, 3):
            conn.execute(INSERT, {"b_id": i, "b_name": f"n{i}", "b_flag": False})
        ours = [tuple(row) for row in built.all(conn, {"b_ids": [1, 3]})]
        event.listen(made, "before_cursor_execute", record)
        try:
            theirs = [tuple(row) for row in conn.execute(statement, {"b_ids": [1, 3]})]
        finally:
            event.remove(made, "before_cursor_execute", record)
        with pytest.raises(ValueError, match="built for 2"):
            built.all(conn, {"b_ids": [1]})
    assert ours == theirs == [(1, "n1"), (3, "n3")]
    assert sent == [built.sql]


def test_a_connection_to_roll_back_first_says_so_unwrapped(backend: Backend, made: Any) -> None:
    """As SQLAlchemy's own execution says it: the error that asks for the rollback, not a
    statement error wrapping it."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError, PendingRollbackError

    built = _prebuilt(backend, RETURNING)
    postgresql = made.dialect.name == "postgresql"
    conn = made.connect()
    try:
        pid = conn.exec_driver_sql(
            "SELECT pg_backend_pid()" if postgresql else "SELECT CONNECTION_ID()"
        ).scalar_one()
        conn.rollback()
        with made.connect() as killer:
            killer.execute(
                text("SELECT pg_terminate_backend(:pid)" if postgresql else "KILL :pid"),
                {"pid": pid},
            )
        conn.begin()
        with pytest.raises(DBAPIError):
            conn.exec_driver_sql("SELECT 1")
        with pytest.raises(PendingRollbackError):
            built.one(conn, {"b_id": 1, "b_name": "x"})
    finally:
        conn.close()


_AUTOCOMMIT_CHECK = """
import json, sys
from sqlalchemy import MetaData, Table, Column, Integer, bindparam, insert, select, text
from dbcluster.dialects import make_engine
from dbcluster.prebuilt import Prebuilt, PrebuiltStatements

engine = make_engine(sys.argv[1], autocommit=True)
table = Table("dbc_test_prebuilt", MetaData(), Column("id", Integer), Column("name", Integer))
statement = insert(table).values(id=bindparam("b_id")).returning(table.c.id)
built = Prebuilt.build(statement, engine.dialect)
with engine.connect() as conn:
    row = built.one(conn, {"b_id": 41})
    left_open = conn.in_transaction()
assert built._row is not None, "the row did not come off the driver's cursor"
with make_engine(sys.argv[1]).connect() as other:  # committed on its own
    seen = other.execute(select(table.c.id).where(table.c.id == 41)).scalar_one_or_none()
print(json.dumps([row.id, left_open, seen]))
"""


def test_an_autocommit_connection_reads_on_the_driver_and_commits_on_its_own(
    backend: Backend, made: Any
) -> None:
    """Outside a transaction on an autocommit engine (the claim's), the row comes off the
    driver's cursor too, the statement is committed when it returns, and SQLAlchemy is left with
    no transaction to end (checked in a process of its own, as the in-transaction path is)."""
    _prebuilt(backend, RETURNING)  # skips where never prebuilt
    assert _direct_in_a_process_of_its_own(backend, _AUTOCOMMIT_CHECK) == [41, False, 41]


def test_an_autocommit_connection_that_something_listens_to_goes_through_sqlalchemy(
    backend: Backend, made: Any
) -> None:
    """A listener of the transaction SQLAlchemy begins around an autocommit statement sees it;
    without one, a failure is the same wrapped error and the connection stays usable."""
    from sqlalchemy import event
    from sqlalchemy.exc import IntegrityError

    from dbcluster.dialects import make_engine

    built = _prebuilt(backend, RETURNING)
    engine = make_engine(backend.url, autocommit=True)
    begun: list[Any] = []

    def began(conn: Any) -> None:
        begun.append(conn)

    try:
        event.listen(engine, "begin", began)
        try:
            with engine.connect() as conn:
                row = built.one(conn, {"b_id": 1, "b_name": "x"})
        finally:
            event.remove(engine, "begin", began)
        assert row.id == 1 and len(begun) == 1 and built._row is None
        with engine.connect() as conn:
            with pytest.raises(IntegrityError):
                built.one(conn, {"b_id": 1, "b_name": "x"})
            assert built.one(conn, {"b_id": 2, "b_name": "y"}).id == 2
        with made.connect() as conn:
            assert conn.execute(select(table.c.id).order_by(table.c.id)).scalars().all() == [1, 2]
    finally:
        engine.dispose()


def test_statements_built_once_run_prebuilt_and_those_without_rows_answer_none(
    backend: Backend,
) -> None:
    """PrebuiltStatements (a launch's statements): a statement that returns rows reads them as
    SQLAlchemy would, prebuilt once where it can be; one that returns none (an INSERT without
    RETURNING) runs as usual and answers no rows, where the driver's path would fail to fetch."""
    engine = backend.engine
    statements = PrebuiltStatements(engine.dialect)
    returning = (
        insert(table)
        .values(id=bindparam("b_id"), name=bindparam("b_name"), kind="fixed", flag=True)
        .returning(table.c.id, table.c.name)
    )
    metadata.create_all(engine)
    try:
        with engine.begin() as conn:
            assert statements.rows(conn, INSERT, {"b_id": 1, "b_name": "x", "b_flag": True}) == []
            if engine.dialect.insert_returning:
                rows = statements.rows(conn, returning, {"b_id": 2, "b_name": "a name too long"})
                theirs = conn.execute(returning, {"b_id": 3, "b_name": "a name too long"}).one()
                assert [tuple(r) for r in rows] == [(2, theirs.name)]  # clipped as SQLAlchemy
                assert rows[0].name == theirs.name
            rows = statements.rows(conn, READ, {"b_id": 1})
            assert [(r.name, r.kind) for r in rows] == [("x", "fixed")]
        named = engine.dialect.paramstyle in ("pyformat", "named")
        assert (statements._built[READ] is not None) == (
            named and Prebuilt.build(READ, engine.dialect) is not None
        )
        assert statements._built[INSERT] is None  # no rows: as usual
    finally:
        metadata.drop_all(engine)


def test_the_servers_own_placeholders_number_each_name_once_and_keep_a_literal_percent() -> None:
    """Where the driver takes ``$1`` placeholders as they are (psycopg's RawCursor), a prebuilt
    statement is sent so: psycopg would parse a statement longer than 4 KB again on every
    execution (the claim, a final write that claims the next)."""
    from dbcluster.prebuilt import _native_placeholders

    sql, order = _native_placeholders(
        "SELECT %(b_a)s, '100%%', %(b_b)s WHERE x = %(b_a)s AND y LIKE 'a%%'"
    )
    assert sql == "SELECT $1, '100%', $2 WHERE x = $1 AND y LIKE 'a%'"
    assert order == ("b_a", "b_b")


def test_a_statement_longer_than_the_drivers_cache_reads_the_same_on_the_driver(
    backend: Backend,
) -> None:
    engine = backend.engine
    wide = select(*(bindparam(f"b_value_number_{i}", type_=Integer) for i in range(120)))
    built = Prebuilt.build(wide, engine.dialect)
    if built is None:
        return  # positional drivers: as usual
    assert len(built.sql) > 4096
    raw_driver = getattr(engine.dialect.dbapi, "RawCursor", None) is not None
    assert (built.raw is not None) == raw_driver
    params = {f"b_value_number_{i}": i * 7 for i in range(120)}
    from dbcluster.dialects import make_engine
    from dbcluster.prebuilt import _direct

    # An engine of its own: a listener another test left on the shared one would send the
    # statement through SQLAlchemy (then this test would read nothing of the driver's path).
    own = make_engine(backend.url)
    try:
        with own.begin() as conn:
            assert _direct(conn), _seen_by(conn)
            ours = built.one(conn, params)
            theirs = conn.execute(wide, params).one()
    finally:
        own.dispose()
    assert tuple(ours) == tuple(theirs) == tuple(i * 7 for i in range(120))


def _seen_by(conn: Any) -> str:
    """What keeps a statement off the driver's path on ``conn`` (see ``prebuilt._direct``)."""
    return (
        "the driver's path is what this test reads, but: "
        f"echo={getattr(conn, '_echo', None)} "
        f"before={list(conn.dispatch.before_cursor_execute)} "
        f"after={list(conn.dispatch.after_cursor_execute)} "
        f"do_execute={list(conn.dialect.dispatch.do_execute)}"
    )
