"""PostgreSQL behind a pooler in transaction mode (``?dbcluster_pooler=transaction``, issue 35):
what the URL option turns on and off, and what it costs on the wire. The live tests run against
the server directly (the option works there too); tests/ha/test_pgbouncer.py runs the same
through PgBouncer 1.18."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from dbcluster.batch.dao.combined import CombinedStatements
from dbcluster.bench.wire import CountingProxy
from dbcluster.cluster.node import NodeEngines, _own_engines
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import get_provider, make_engine, provider_for_url
from dbcluster.dialects.base import SessionLimits
from dbcluster.dialects.postgresql_pooler import limits_statement
from dbcluster.errors import ConfigurationError
from dbcluster.prebuilt import driver_pipelines

PG_URL = os.environ.get("DBCLUSTER_TEST_POSTGRESQL_URL")
live = pytest.mark.skipif(not PG_URL, reason="DBCLUSTER_TEST_POSTGRESQL_URL is not set")
LIMITS = SessionLimits(1234, 5678)


def pooled(url: str) -> str:
    return (
        make_url(url)
        .update_query_dict({"dbcluster_pooler": "transaction"})
        .render_as_string(hide_password=False)
    )


# --- the URL option -----------------------------------------------------------------------------


def test_the_option_turns_the_session_off_only_where_asked() -> None:
    direct = provider_for_url("postgresql+psycopg://u@h/db")
    direct.read_url_options(make_url("postgresql+psycopg://u@h/db"))
    assert direct.keeps_session
    for value, keeps in (("transaction", False), ("none", True), ("session", True)):
        provider = provider_for_url("postgresql+psycopg://u@h/db")
        provider.read_url_options(make_url(f"postgresql+psycopg://u@h/db?dbcluster_pooler={value}"))
        assert provider.keeps_session is keeps, value


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("postgresql+psycopg://u@h/db?dbcluster_pooler=statement", "not a pooling mode"),
        ("postgresql+psycopg2://u@h/db?dbcluster_pooler=transaction", "psycopg driver"),
        ("sqlite:///x.db?dbcluster_pooler=transaction", "not supported on sqlite"),
    ],
)
def test_an_option_dbcluster_cannot_follow_is_one_clear_error(url: str, names: str) -> None:
    provider = provider_for_url(url.split("?")[0])
    with pytest.raises(ConfigurationError, match=names):
        provider.read_url_options(make_url(url))


def test_the_limits_statement_sets_both_bounds_for_the_transaction_only() -> None:
    assert limits_statement(LIMITS) == (
        b"SELECT set_config('lock_timeout', '1234', true), "
        b"set_config('idle_in_transaction_session_timeout', '5678', true)"
    )
    assert limits_statement(SessionLimits(10)) == b"SELECT set_config('lock_timeout', '10', true)"


def test_a_refused_startup_parameter_names_the_option() -> None:
    provider = provider_for_url("postgresql+psycopg://u@h/db")
    error = Exception("connection failed: FATAL:  unsupported startup parameter: options")
    hint = provider.connect_error_hint(error)
    assert hint is not None and "?dbcluster_pooler=transaction" in hint
    assert not provider.is_transient(error)


# --- live, against the server directly ---------------------------------------------------------


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.dispose()


def _setting(conn: Any, name: str) -> str:
    return str(conn.execute(text(f"SHOW {name}")).scalar_one())


@live
def test_each_transaction_carries_the_limits_and_the_session_keeps_none(
    engines: list[Engine],
) -> None:
    assert PG_URL is not None
    engine = make_engine(pooled(PG_URL), limits=LIMITS, pool_size=1)
    engines.append(engine)
    with engine.connect() as conn:
        assert _setting(conn, "lock_timeout") == "1234ms"
        assert _setting(conn, "idle_in_transaction_session_timeout") == "5678ms"
        conn.commit()
        driver = conn.connection.dbapi_connection
        assert driver.prepare_threshold is None  # type: ignore[union-attr]
        # Nothing stays in the session once the transaction is over (a statement outside
        # any transaction sees the server's default).
        driver.autocommit = True  # type: ignore[union-attr]
        assert driver.execute("SHOW lock_timeout").fetchone()[0] == "0"  # type: ignore[union-attr]
        driver.autocommit = False  # type: ignore[union-attr]
        # The next transaction has them again.
        assert _setting(conn, "lock_timeout") == "1234ms"
        conn.rollback()


@live
def test_each_autocommit_statement_carries_the_limits(engines: list[Engine]) -> None:
    assert PG_URL is not None
    engine = make_engine(pooled(PG_URL), limits=LIMITS, autocommit=True, pool_size=1, ping=False)
    engines.append(engine)
    with engine.connect() as conn:
        assert _setting(conn, "lock_timeout") == "1234ms"
        assert conn.execute(text("SELECT :x"), {"x": 7}).scalar_one() == 7
        with pytest.raises(Exception, match="division by zero"):
            conn.execute(text("SELECT 1 / 0"))
        # A failed statement's implicit transaction is over: the connection goes on.
        assert conn.execute(text("SELECT 2")).scalar_one() == 2
        driver = conn.connection.dbapi_connection
        assert driver.execute("SHOW lock_timeout").fetchone()[0] == "0"  # type: ignore[union-attr]


@live
def test_the_limits_cost_no_round_trip(engines: list[Engine]) -> None:
    """A transaction costs what it costs on a direct connection (its BEGIN carries the limits),
    and an autocommit statement one round trip (the limits pipelined before it)."""
    assert PG_URL is not None
    with CountingProxy.for_url(PG_URL) as proxy:
        url = proxy.url_for(PG_URL)
        direct = make_engine(url, limits=LIMITS, pool_size=1)
        pooled_tx = make_engine(pooled(url), limits=LIMITS, pool_size=1)
        pooled_auto = make_engine(
            pooled(url), limits=LIMITS, autocommit=True, pool_size=1, ping=False
        )
        engines.extend([direct, pooled_tx, pooled_auto])

        def transaction(engine: Engine) -> None:
            with engine.begin() as conn:
                conn.execute(text("SELECT 1 + 1")).all()
                conn.execute(text("SELECT 2 + 2")).all()

        def statement() -> None:
            with pooled_auto.connect() as conn:
                conn.execute(text("SELECT 3 + 3")).all()

        for engine in (direct, pooled_tx):
            transaction(engine)  # the connection opened first
        statement()
        assert _counted(proxy, lambda: transaction(pooled_tx)) == _counted(
            proxy, lambda: transaction(direct)
        )
        assert _counted(proxy, statement) == 1


def _counted(proxy: CountingProxy, work: Any) -> int:
    from tests.dialects.test_round_trips import _counted as counted

    return counted(proxy, work)["round_trips"]


@live
def test_a_node_behind_the_pooler_listens_only_on_listen_url(engines: list[Engine]) -> None:
    assert PG_URL is not None
    engine = make_engine(pooled(PG_URL))
    engines.append(engine)
    settings = ClusterSettings()

    def own(s: ClusterSettings) -> NodeEngines:
        made = _own_engines(engine, s, 1)
        engines.extend(made.own(engine))
        return made

    assert own(settings).listen is None  # it polls
    listening = own(settings.with_overrides(listen_url=PG_URL)).listen
    assert listening is not None and get_provider(listening).keeps_session
    with pytest.raises(ConfigurationError, match="listen_url goes through a pooler"):
        own(settings.with_overrides(listen_url=pooled(PG_URL)))
    direct = make_engine(PG_URL)
    engines.append(direct)
    made = _own_engines(direct, settings, 1)
    engines.extend(made.own(direct))
    assert made.listen is made.autocommit


@live
def test_no_final_write_is_pipelined_with_its_commit_behind_the_pooler(
    engines: list[Engine],
) -> None:
    assert PG_URL is not None
    for url, keeps in ((PG_URL, True), (pooled(PG_URL), False)):
        engine = make_engine(url)
        engines.append(engine)
        provider = get_provider(engine)
        combined = CombinedStatements(provider, engine.dialect)
        assert combined.commits_with_final_write is (keeps and driver_pipelines(engine.dialect))
        with engine.connect() as conn:
            session = provider.session_of(conn.connection.dbapi_connection)
        assert (session is not None) is keeps


def test_listen_url_is_a_setting_that_is_never_printed() -> None:
    secret = "postgresql+psycopg://u:hunter2@db:5432/app"
    settings = ClusterSettings.from_env({"DBCLUSTER_LISTEN_URL": secret})
    assert settings.listen_url == secret
    assert "hunter2" not in repr(settings)
    assert ClusterSettings().listen_url is None
    with pytest.raises(ConfigurationError, match="listen_url"):
        ClusterSettings(listen_url=" ")
