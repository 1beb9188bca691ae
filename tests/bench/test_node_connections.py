"""The ceiling's simulated nodes share their process's engines and stores, each node on a
connection of its own (dbcluster/bench/connections.py): the database must still see one session
per node, and a node's connection never serves two calls at once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dbcluster.bench.connections import NodeEngines, NodePool, as_node
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import metadata


def _urls() -> list[object]:
    urls: list[object] = ["sqlite"]
    for name in ("POSTGRESQL", "MARIADB"):
        url = os.environ.get(f"DBCLUSTER_TEST_{name}_URL")
        urls.append(
            pytest.param(url, id=name.lower())
            if url
            else pytest.param(
                None,
                id=name.lower(),
                marks=pytest.mark.skip(reason=f"DBCLUSTER_TEST_{name}_URL is not set"),
            )
        )
    return urls


@pytest.fixture(params=_urls())
def engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NodeEngines]:
    url = request.param
    if url == "sqlite":
        url = f"sqlite:///{tmp_path / 'nodes.db'}"
    setup = make_engine(url)
    metadata.create_all(setup)
    setup.dispose()
    shared = NodeEngines(url, ClusterSettings())
    try:
        yield shared
    finally:
        shared.dispose()


def _session(engine: Engine) -> object:
    """The DBAPI connection a checkout of ``engine`` hands out now (compared by identity; the
    caller keeps it, so that no later one can take its id)."""
    with engine.connect() as conn:
        return conn.connection.dbapi_connection


def test_each_node_has_a_session_of_its_own_on_engines_and_a_store_all_share(
    engines: NodeEngines,
) -> None:
    store = engines.store(False)
    assert engines.store(False) is store  # one store (and its built statements) for all
    engine = store.autocommit or store.engine
    assert isinstance(engine.pool, NodePool)
    sessions = {}
    for node in range(3):
        with as_node(node):
            sessions[node] = _session(engine)
            assert _session(engine) is sessions[node]  # the same one, call after call
            store.register(f"shared-{node}", "host", 4)
            assert store.heartbeat(f"shared-{node}", 0)
    assert len({id(s) for s in sessions.values()}) == 3
    with as_node(1):
        assert _session(engine) is sessions[1]
        for node in range(3):
            store.deregister(f"shared-{node}")


def test_a_node_never_has_its_connection_out_twice(engines: NodeEngines) -> None:
    store = engines.store(False)
    engine = store.autocommit or store.engine
    with as_node(7):
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            with pytest.raises(RuntimeError, match="checked its connection out twice"):
                engine.connect()
        with engine.connect() as conn:  # back in: the node may take it again
            conn.exec_driver_sql("SELECT 1")


def test_a_statement_outside_a_node_is_refused(engines: NodeEngines) -> None:
    store = engines.store(False)
    engine = store.autocommit or store.engine
    with pytest.raises(RuntimeError, match="outside as_node"):
        engine.connect()


def test_a_node_released_while_its_call_runs_closes_its_connection_once_back(
    engines: NodeEngines,
) -> None:
    store = engines.store(False)
    engine = store.autocommit or store.engine
    with as_node(3):
        first = _session(engine)
        with engine.connect() as conn:
            engines.release(3)  # the generator stops while this call still runs
            conn.exec_driver_sql("SELECT 1")  # it goes on over its connection
        assert _session(engine) is not first  # closed as it came back: a new one now
        second = _session(engine)
        engines.release(3)
        assert _session(engine) is not second
