"""What dbcluster's engines cost on the wire (counted by the bench's protocol proxy): a pooled
connection is not rolled back again after a COMMIT, an autocommit engine's statement is one round
trip, a connection used moments ago is not pinged, and a page read outside a transaction costs
one round trip on PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from dbcluster.batch.items.sql import read_page
from dbcluster.bench.wire import CountingProxy
from dbcluster.dialects import make_engine
from dbcluster.testing.waiting import wait_for


@contextmanager
def _engine(url: str, **options: Any) -> Iterator[Engine]:
    engine = make_engine(url, **options)
    try:
        yield engine
    finally:
        engine.dispose()


URLS = {
    "postgresql": os.environ.get("DBCLUSTER_TEST_POSTGRESQL_URL"),
    "mariadb": os.environ.get("DBCLUSTER_TEST_MARIADB_URL"),
}


@pytest.fixture(params=sorted(URLS))
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[str, CountingProxy]]:
    url = URLS[request.param]
    if not url:
        pytest.skip(f"DBCLUSTER_TEST_{request.param.upper()}_URL is not set")
    with CountingProxy.for_url(url) as proxy:
        yield proxy.url_for(url), proxy


def _counted(proxy: CountingProxy, work: object) -> dict[str, int]:
    """Round trips and statement kinds ``work()`` sent (after its connections are open)."""
    before = proxy.counts.snapshot()
    work()  # type: ignore[operator]
    # The proxy counts on its own thread; what work() sent has arrived once it stops moving.
    last: dict[str, int] = {}

    def settled() -> bool:
        nonlocal last
        now = proxy.counts.snapshot()
        same = now == last
        last = now
        return same

    wait_for(settled, 10, "the proxy to count", poll=0.05)
    return {
        k: last.get(k, 0) - before.get(k, 0)
        for k in ("round_trips", "begin", "commit", "rollback", "ping", "select", "update")
        if last.get(k, 0) - before.get(k, 0)
    }


def test_a_committed_transaction_costs_no_rollback_on_return(
    proxied: tuple[str, CountingProxy],
) -> None:
    url, proxy = proxied
    with _engine(url, pool_size=1) as engine:
        with engine.begin() as conn:  # open the pooled connection first
            conn.execute(text("SELECT 1 + 1"))

        def commit() -> None:
            with engine.begin() as conn:
                conn.execute(text("SELECT 2 + 2"))

        counted = _counted(proxy, commit)
        assert counted.get("rollback", 0) == 0, counted
        assert counted["commit"] == 1

        def abandon() -> None:  # a transaction left open is still rolled back
            conn = engine.connect()
            conn.execute(text("SELECT 3 + 3"))
            conn.close()

        assert _counted(proxy, abandon).get("rollback", 0) == 1


def test_an_autocommit_engine_sends_one_statement(proxied: tuple[str, CountingProxy]) -> None:
    url, proxy = proxied
    with _engine(url, autocommit=True, pool_size=1, ping=False) as engine:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1 + 1"))

        def read() -> None:
            with engine.connect() as conn:
                conn.execute(text("SELECT 2 + 2")).all()

        assert _counted(proxy, read) == {"round_trips": 1, "select": 1}


def test_a_connection_used_moments_ago_is_not_pinged(proxied: tuple[str, CountingProxy]) -> None:
    url, proxy = proxied
    with _engine(url, pool_size=1) as engine:
        with engine.begin() as conn:
            conn.execute(text("SELECT 1 + 1"))

        def twice() -> None:
            for _ in range(2):
                with engine.begin() as conn:
                    conn.execute(text("SELECT 2 + 2"))

        assert _counted(proxy, twice).get("ping", 0) == 0
        # One that sat idle past the provider's threshold is pinged first.
        for record in engine.pool._pool.queue:  # type: ignore[attr-defined]
            record.info["dbcluster_idle_since"] -= 3600
        assert _counted(proxy, twice).get("ping", 0) == 1


def test_a_page_read_outside_a_transaction(proxied: tuple[str, CountingProxy]) -> None:
    url, proxy = proxied
    with _engine(url, pool_size=1) as engine:
        read_page(engine, select(text("1 + 1")))
        counted = _counted(proxy, lambda: read_page(engine, select(text("2 + 2"))))
        expected = 1 if url.startswith("postgresql") else 2  # PyMySQL: SELECT, ROLLBACK
        assert counted["round_trips"] == expected, counted
