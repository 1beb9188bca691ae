"""The conformance suite's pytest plugin: opt-in, never loaded into a pytest that did not ask.

Run the suite against a database with::

    pytest -p dbcluster.testing.plugin --pyargs dbcluster.testing.suite --dbcluster-url URL

or enable the plugin for a project's own tests (its fixtures, ``dbc_backend`` to override) with
``pytest_plugins = ["dbcluster.testing.plugin"]`` in the root ``conftest.py``.

``URL`` must be a scratch database: where the server can create databases, the suite works in a
database of its own that it drops at the end; otherwise (SQLite, or a provider that declares
``can_create_database = False``) it drops and creates the dbcluster tables in the given one.
This module imports nothing but pytest until a suite test asks for a database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

URL_ENV = "DBCLUSTER_SUITE_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dbcluster", "dbcluster conformance suite")
    group.addoption(
        "--dbcluster-url",
        default=None,
        help=f"Database URL the conformance suite runs against (or set {URL_ENV}).",
    )
    group.addoption(
        "--dbcluster-chaos-faults",
        type=int,
        default=4,
        help="Faults in the suite's chaos run (default 4: one of each kind).",
    )
    group.addoption("--dbcluster-chaos-seed", type=int, default=7, help="Seed of that run.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "dbcluster_requires(*capabilities): skip unless the provider declares them"
    )


@pytest.fixture(scope="session")
def dbcluster_session_backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    url = request.config.getoption("--dbcluster-url") or os.environ.get(URL_ENV)
    if not url:
        pytest.skip(f"no database for the dbcluster suite: give --dbcluster-url URL or {URL_ENV}")
    from dbcluster.testing.backends import open_url

    backend = open_url(url)
    yield backend
    backend.close()


@pytest.fixture
def dbc_backend(request: pytest.FixtureRequest, dbcluster_session_backend: Any) -> Any:
    """The backend under test, with empty dbcluster tables and fresh test-application tables.
    Projects that run the suite over a matrix override this fixture."""
    from dbcluster.testing.requirements import skip_unless_capable

    backend = dbcluster_session_backend
    skip_unless_capable(request, backend.provider, backend.engine)
    backend.reset()
    return backend


@pytest.fixture
def dbc_chaos_options(request: pytest.FixtureRequest) -> dict[str, int]:
    return {
        "faults": request.config.getoption("--dbcluster-chaos-faults"),
        "seed": request.config.getoption("--dbcluster-chaos-seed"),
    }
