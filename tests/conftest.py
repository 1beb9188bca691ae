"""The backend matrix as a pytest fixture.

``backend`` is parametrized over every backend in ``ci/backends.toml``: SQLite always; the others
from their ``DBCLUSTER_TEST_<NAME>_URL`` variable or, where a container engine answers, from
testcontainers. A named backend that cannot be reached fails its tests with the reason; one that
was not named is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dbcluster.testing.backends import (
    Backend,
    BackendSpec,
    BackendUnavailable,
    label_for,
    load_matrix,
    open_backend,
)

ROOT = Path(__file__).resolve().parent.parent
MATRIX: list[BackendSpec] = load_matrix(ROOT / "ci" / "backends.toml")
_opened: dict[str, Backend | BackendUnavailable] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        names = [spec.name for spec in MATRIX]
        only = getattr(metafunc.function, "pytestmark", [])
        wanted = next((m.args for m in only if m.name == "backends"), None)
        if wanted:
            names = [n for n in names if n in wanted]
        metafunc.parametrize(
            "backend",
            names,
            indirect=True,
            ids=[label_for(next(s for s in MATRIX if s.name == n), MATRIX) for n in names],
        )


def _open(name: str) -> Backend:
    if name not in _opened:
        spec = next(s for s in MATRIX if s.name == name)
        try:
            _opened[name] = open_backend(spec, label_for(spec, MATRIX))
        except BackendUnavailable as exc:
            _opened[name] = exc
    found = _opened[name]
    if isinstance(found, BackendUnavailable):
        if found.named:
            pytest.fail(f"backend {name}: {found}", pytrace=False)
        pytest.skip(f"backend {name}: {found}")
    return found


@pytest.fixture(scope="session")
def open_test_backend() -> Callable[[str], Backend]:
    """Opens the named backend once per run (shared by every fixture that needs one), failing or
    skipping the test as the matrix says."""
    return _open


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A live backend whose dbcluster tables are empty at the start of the test."""
    found = _open(request.param)
    found.reset()
    yield found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for found in _opened.values():
        if isinstance(found, Backend):
            found.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "backends(*names): run the test only on the named backends")
