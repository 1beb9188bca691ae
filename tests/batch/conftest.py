"""Fixtures of the batch tests: a repository, a launcher and user tables on the backend."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, func, insert, select

from dbcluster.batch import JobLauncher, JobRepository, LocalPartitionHandler


@dataclass
class UserTables:
    engine: Engine
    source: Table
    out: Table

    def fill_source(self, count: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(insert(self.source), [{"id": i, "amount": i * 2} for i in range(count)])

    def out_items(self) -> list[int]:
        with self.engine.connect() as conn:
            return sorted(conn.execute(select(self.out.c.item)).scalars())

    def duplicates(self) -> list[int]:
        stmt = select(self.out.c.item).group_by(self.out.c.item).having(func.count() > 1)
        with self.engine.connect() as conn:
            return list(conn.execute(stmt).scalars())


@contextmanager
def user_tables(engine: Engine) -> Iterator[UserTables]:
    md = MetaData()
    source = Table(
        "t_batch_source",
        md,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("amount", Integer, nullable=False),
    )
    out = Table(
        "t_batch_out",
        md,
        Column("item", Integer, nullable=False),
        Column("origin", String(100)),
    )
    md.drop_all(engine)
    md.create_all(engine)
    try:
        yield UserTables(engine, source, out)
    finally:
        md.drop_all(engine)


@pytest.fixture
def repo(backend: Any) -> JobRepository:
    return JobRepository(backend.engine)


@pytest.fixture
def launcher(repo: JobRepository) -> JobLauncher:
    return JobLauncher(repo, LocalPartitionHandler(max_workers=4))


@pytest.fixture
def tables(backend: Any) -> Iterator[UserTables]:
    with user_tables(backend.engine) as found:
        yield found
