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


def _checkouts(engine: Engine) -> list[int]:
    from sqlalchemy import event

    seen: list[int] = []
    event.listen(engine, "checkout", lambda dbapi, record, proxy: seen.append(id(dbapi)))
    return seen


def test_a_thread_holding_runs_its_transactions_on_one_connection(engine: Engine) -> None:
    """Holding, one thread's transactions share one pooled connection (no checkout and return
    between them); outside, each checks one out; on the way out it goes back to the pool."""
    tx = Transactions(engine, _policy())
    seen = _checkouts(engine)
    select_one = lambda conn: conn.execute(text("SELECT 1")).scalar_one()  # noqa: E731
    with tx.holding():
        for _ in range(5):
            assert tx.run(select_one) == 1
        with tx.holding():  # nested: the same hold
            assert tx.run(select_one) == 1
    assert len(seen) == 1
    assert engine.pool.checkedout() == 0
    tx.run(select_one)
    tx.run(select_one)
    assert len(seen) == 3


def test_a_held_connection_goes_back_after_a_failure_and_a_changed_connection(
    engine: Engine,
) -> None:
    """A transaction that fails (repeated or not) returns the held connection to the pool, which
    judges it; so does one whose user changed its execution options. A
    transaction begun inside another takes a connection of its own."""
    tx = Transactions(engine, _policy())
    seen = _checkouts(engine)
    tries: list[int] = []

    def blips_once(conn) -> int:
        tries.append(1)
        if len(tries) == 1:
            raise Blip("lost connection during query")
        return 1

    with tx.holding():
        assert tx.run(blips_once) == 1
        assert len(seen) == 2  # the failed try's connection went back; the repetition took one
        with pytest.raises(ZeroDivisionError):
            tx.run(lambda conn: 1 / 0)
        tx.run(lambda conn: conn.execution_options(logging_token="changed"))
        tx.run(lambda conn: None)  # the connection with changed options is not reused
        tx.run(lambda conn: None)
        assert len(seen) == 4

        def nested(conn) -> int:
            return tx.run(lambda inner: 2 if inner is not conn else -1)

        assert tx.run(nested) == 2
        assert len(seen) == 5
    assert engine.pool.checkedout() == 0


def test_holding_is_per_thread(engine: Engine) -> None:
    """Another thread's transactions do not use the connection one thread holds."""
    import threading

    tx = Transactions(engine, _policy())
    used: list[object] = []
    with tx.holding():
        tx.run(lambda conn: used.append(conn.connection.dbapi_connection))
        other = threading.Thread(
            target=lambda: tx.run(lambda conn: used.append(conn.connection.dbapi_connection))
        )
        other.start()
        other.join()
        tx.run(lambda conn: used.append(conn.connection.dbapi_connection))
    assert used[0] is used[2] and used[1] is not used[0]


def test_a_held_connection_idle_too_long_goes_back_to_the_pool(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot whose connection sat idle between transactions (a chunk read for long) gives it
    back to the pool, which pings or recycles an idle connection as it does any other; so does
    one the pool invalidated (with all it had made) after a disconnect it saw."""
    import dbcluster.batch.transactions as transactions

    monkeypatch.setattr(transactions, "HOLD_IDLE_S", 0.05)
    tx = Transactions(engine, _policy())
    seen = _checkouts(engine)
    with tx.holding():
        tx.run(lambda conn: None)
        tx.run(lambda conn: None)
        assert len(seen) == 1
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            time.sleep(0.01)
        tx.run(lambda conn: None)
        assert len(seen) == 2
        monkeypatch.setattr(transactions, "HOLD_IDLE_S", 60.0)
        with engine.connect() as other:  # a checkout of its own
            engine.pool._invalidate(other.connection)  # as on a disconnect it saw
        tx.run(lambda conn: None)
        assert len(seen) == 4
    assert engine.pool.checkedout() == 0
