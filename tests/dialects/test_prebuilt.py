"""A prebuilt statement sends what SQLAlchemy would: the same text, the constants it bound, each
value through its type's bind processor; and reads back the same values."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, bindparam, insert, select

from dbcluster.prebuilt import Prebuilt
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
