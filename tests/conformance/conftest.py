"""Run the conformance suite (``dbcluster.testing.suite``) over this project's backend matrix.

The suite's tests ask for ``dbc_backend``; here it is parametrized over SQLite, PostgreSQL and
MariaDB (the backends CI runs the suite on), opened once per run through the root conftest's
``open_test_backend``, so the suite and the rest of the tests share each backend's database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from dbcluster.testing.backends import Backend
from dbcluster.testing.requirements import skip_unless_capable

SUITE_BACKENDS = ("sqlite", "postgresql", "mariadb")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dbc_backend" in metafunc.fixturenames:
        metafunc.parametrize("dbc_backend_name", SUITE_BACKENDS, scope="session")


@pytest.fixture(scope="session")
def dbc_backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def dbc_backend(
    request: pytest.FixtureRequest,
    dbc_backend_name: str,
    open_test_backend: Callable[[str], Backend],
) -> Iterator[Backend]:
    found = open_test_backend(dbc_backend_name)
    skip_unless_capable(request, found.provider, found.engine)
    found.reset()
    yield found
