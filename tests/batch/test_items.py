"""Readers and writers on every backend: each restarts from the position it committed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select

from dbcluster.batch import (
    BatchStatus,
    ChunkStep,
    ClassifierItemWriter,
    CompositeItemWriter,
    Job,
    JobLauncher,
    JobRepository,
    JsonLinesItemReader,
    JsonLinesItemWriter,
    SqlCursorItemReader,
    SqlItemWriter,
    SqlPagingItemReader,
)

md = MetaData()
orders = Table(
    "t_items_orders",
    md,
    Column("region", String(10), primary_key=True),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("amount", Integer, nullable=False),
)
copies = Table(
    "t_items_copies",
    md,
    Column("region", String(10), primary_key=True),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("amount", Integer, nullable=False),
    Column("origin", String(10)),
)

REGIONS = ("eu", "us", "apac")


@pytest.fixture
def engine(backend: Any) -> Iterator[Any]:
    md.drop_all(backend.engine)
    md.create_all(backend.engine)
    with backend.engine.begin() as conn:
        conn.execute(
            insert(orders),
            [{"region": REGIONS[i % 3], "id": i, "amount": i * 10} for i in range(57)],
        )
    yield backend.engine
    md.drop_all(backend.engine)


class FailOnce:
    """A processor that fails on one item the first time it sees it."""

    def __init__(self, bad: Any) -> None:
        self.bad, self.failed = bad, False

    def process(self, item: Any) -> Any:
        key = (item["region"], item["id"]) if isinstance(item, dict) else item
        if key == self.bad and not self.failed:
            self.failed = True
            raise RuntimeError(f"bad item {key}")
        return item


def _run_twice(launcher: JobLauncher, step: ChunkStep) -> tuple[Any, Any]:
    job = Job(f"items-{step.name}", [step])
    first = launcher.run(job, {"run": 1})
    second = launcher.run(job, {"run": 1})
    return first, second


def _copies(engine: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(select(copies).order_by(copies.c.region, copies.c.id))
        ]


def test_paging_reader_on_a_composite_key_with_upsert_and_json_writers(
    launcher: JobLauncher, repo: JobRepository, engine: Any, tmp_path: Path
) -> None:
    # Rows already in the target are updated, not inserted twice.
    with engine.begin() as conn:
        conn.execute(insert(copies), [{"region": "us", "id": 1, "amount": -1, "origin": "old"}])
    out = tmp_path / "orders.jsonl"
    expected = sorted(
        ((REGIONS[i % 3], i) for i in range(57)), key=lambda k: (k[0], -k[1])
    )  # region ascending, id descending
    failing = FailOnce(expected[23])
    step = ChunkStep(
        "paging",
        reader=lambda step_execution: SqlPagingItemReader(
            engine,
            select(orders).where(orders.c.amount >= 0),
            ["region", ("id", "desc")],
            page_size=7,
        ),
        processor=failing,
        writer=lambda step_execution: CompositeItemWriter(
            [
                SqlItemWriter(
                    copies, lambda r: {**r, "origin": "paging"}, upsert_on=["region", "id"]
                ),
                JsonLinesItemWriter(out),
            ]
        ),
        chunk_size=5,
    )
    first, second = _run_twice(launcher, step)
    assert first.status is BatchStatus.FAILED and second.status is BatchStatus.COMPLETED
    resumed = repo.get_step_executions(second)[0]
    assert resumed.read_count == 57 - 20, "the restart read on from its last commit"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["region"], r["id"]) for r in lines] == expected, "each row once, in order"
    rows = _copies(engine)
    assert len(rows) == 57 and ("us", 1, 10, "paging") in rows


def test_cursor_reader_and_classifier_writer_restart(launcher: JobLauncher, engine: Any) -> None:
    def writer(origin: str) -> SqlItemWriter:
        return SqlItemWriter(copies, lambda r: {**r, "origin": origin})

    step = ChunkStep(
        "cursor",
        reader=lambda step_execution: SqlCursorItemReader(
            engine, select(orders).order_by(orders.c.id), fetch_size=4
        ),
        processor=FailOnce(("apac", 32)),
        writer=ClassifierItemWriter(
            lambda r: r["id"] % 2, {0: writer("even")}, default=writer("odd")
        ),
        chunk_size=6,
    )
    first, second = _run_twice(launcher, step)
    assert first.status is BatchStatus.FAILED and second.status is BatchStatus.COMPLETED
    rows = _copies(engine)
    assert len(rows) == 57
    assert {(r[1], r[3]) for r in rows} == {(i, "even" if i % 2 == 0 else "odd") for i in range(57)}


def test_json_lines_reader_restarts_at_its_offset(
    launcher: JobLauncher, engine: Any, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({"region": "eu", "id": i, "amount": i}) + "\n\n" for i in range(20))
    )
    step = ChunkStep(
        "jsonl",
        reader=lambda step_execution: JsonLinesItemReader(source),
        processor=FailOnce(("eu", 13)),
        writer=SqlItemWriter(copies),
        chunk_size=4,
    )
    first, second = _run_twice(launcher, step)
    assert first.status is BatchStatus.FAILED and second.status is BatchStatus.COMPLETED
    assert [r[1] for r in _copies(engine)] == list(range(20))
