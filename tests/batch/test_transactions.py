"""How a transaction is repeated after a transient error."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from dbcluster.batch.transactions import RetryPolicy, Transactions
from dbcluster.dialects import make_engine


class Blip(Exception):
    """Stands for a transient database error (a connection the server closed)."""


@pytest.fixture
def engine(tmp_path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'tx.db'}")
    yield engine
    engine.dispose()


def _policy(**kwargs) -> RetryPolicy:
    return RetryPolicy(is_transient=lambda e: isinstance(e, Blip), backoff_s=0.01, **kwargs)


def test_a_body_that_outlived_the_deadline_is_still_repeated_once_it_fails(engine: Engine) -> None:
    """A process stopped inside a transaction finds, when it resumes, its connection closed by
    the server: the time it was stopped must not use up the repetitions (a node lost a launch
    request this way: SIGSTOPped past the deadline, it failed the request on the first error)."""
    calls: list[int] = []

    def body(conn) -> int:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)  # longer than the deadline
            raise Blip("lost connection during query")
        return int(conn.execute(text("SELECT 7")).scalar_one())

    assert Transactions(engine, _policy(deadline_s=0.1)).run(body) == 7
    assert len(calls) == 2


def test_repetitions_still_end_at_the_deadline_after_the_first_error(engine: Engine) -> None:
    def body(conn) -> None:
        raise Blip("still down")

    started = time.monotonic()
    with pytest.raises(Blip):
        Transactions(engine, _policy(deadline_s=0.3, attempts=1000)).run(body)
    assert 0.25 <= time.monotonic() - started < 3.0


def test_a_read_that_outlived_the_deadline_is_still_repeated(engine: Engine) -> None:
    calls: list[int] = []

    def work() -> str:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)
            raise Blip("lost connection during query")
        return "read"

    assert Transactions(engine, _policy(deadline_s=0.1)).read(work) == "read"
