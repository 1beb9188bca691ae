"""Run the conformance suite (``dbcluster.testing.suite``) over this project's backend matrix.

The suite's tests ask for ``dbc_backend``; here it is parametrized over SQLite, PostgreSQL and
MariaDB (the backends CI runs the suite on), each opened like the rest of the test run's backends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dbcluster.testing.backends import (
    Backend,
    BackendUnavailable,
    label_for,
    load_matrix,
    open_backend,
)
from dbcluster.testing.requirements import skip_unless_capable

MATRIX = load_matrix(Path(__file__).resolve().parents[2] / "ci" / "backends.toml")
SUITE_BACKENDS = ("sqlite", "postgresql", "mariadb")
_opened: dict[str, Backend | BackendUnavailable] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dbc_backend" in metafunc.fixturenames:
        metafunc.parametrize("dbc_backend_name", SUITE_BACKENDS, scope="session")


@pytest.fixture(scope="session")
def dbc_backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def dbc_backend(request: pytest.FixtureRequest, dbc_backend_name: str) -> Iterator[Backend]:
    if dbc_backend_name not in _opened:
        spec = next(s for s in MATRIX if s.name == dbc_backend_name)
        try:
            _opened[dbc_backend_name] = open_backend(spec, label_for(spec, MATRIX))
        except BackendUnavailable as exc:
            _opened[dbc_backend_name] = exc
    found = _opened[dbc_backend_name]
    if isinstance(found, BackendUnavailable):
        if found.named:
            pytest.fail(f"backend {dbc_backend_name}: {found}", pytrace=False)
        pytest.skip(f"backend {dbc_backend_name}: {found}")
    skip_unless_capable(request, found.provider, found.engine.url)
    found.reset()
    yield found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for found in _opened.values():
        if isinstance(found, Backend):
            found.close()
