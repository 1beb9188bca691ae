"""The backend matrix as a pytest fixture.

``backend`` is parametrized over every backend in ``ci/backends.toml``: SQLite always; the others
from their ``DBCLUSTER_TEST_<NAME>_URL`` variable or, where a container engine answers, from
testcontainers. A named backend that cannot be reached fails its tests with the reason; one that
was not named is skipped with the reason.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dbcluster.testing.app import ledger_metadata
from dbcluster.testing.backends import (
    Backend,
    BackendSpec,
    BackendUnavailable,
    label_for,
    load_matrix,
    open_backend,
)

#: The conformance suite's plugin (options, fixtures, markers) is opt-in; these tests opt in.
pytest_plugins = ["dbcluster.testing.plugin"]

ROOT = Path(__file__).resolve().parent.parent
MATRIX: list[BackendSpec] = load_matrix(ROOT / "ci" / "backends.toml")
_opened: dict[str, Backend | BackendUnavailable] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        names = [spec.name for spec in MATRIX]
        # The function's marks first, then its module's (``pytestmark``: one mark or a list).
        module = getattr(metafunc.module, "pytestmark", [])
        only = [
            *getattr(metafunc.function, "pytestmark", []),
            *(module if isinstance(module, list) else [module]),
        ]
        wanted = next((m.args for m in only if m.name == "backends"), None)
        if wanted:
            names = [n for n in names if n in wanted]
        elif not _provider_level(metafunc):
            names = [n for n in names if not _stand_in(n)]
        metafunc.parametrize(
            "backend",
            names,
            indirect=True,
            ids=[label_for(next(s for s in MATRIX if s.name == n), MATRIX) for n in names],
        )


#: Where the MySQL provider pointed at the MariaDB server (``mysql-on-mariadb``) runs: the
#: provider's own statements, classifiers and contract. The cluster, CLI and batch tests run once
#: per server; on that server they exercise the MariaDB provider already. A real MySQL server
#: (``DBCLUSTER_TEST_MYSQL_URL`` on a server of its own, as in ci/matrix.sh) runs everything.
PROVIDER_LEVEL = ("dialects", "conformance", "thirdparty")


def _provider_level(metafunc: pytest.Metafunc) -> bool:
    parts = Path(str(metafunc.definition.path)).relative_to(ROOT / "tests").parts
    return parts[0] in PROVIDER_LEVEL


def _stand_in(name: str) -> bool:
    spec = next(s for s in MATRIX if s.name == name)
    return label_for(spec, MATRIX) != spec.name


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


@pytest.fixture
def ledger_engine(backend: Backend) -> Iterator[Engine]:
    """The backend with the test application's tables (the ledger), empty."""
    ledger_metadata.drop_all(backend.engine)
    ledger_metadata.create_all(backend.engine)
    yield backend.engine
    ledger_metadata.drop_all(backend.engine)


def _node_threads() -> set[threading.Thread]:
    """The live threads that run a node's loops (a :class:`Service` each)."""
    from dbcluster.cluster.service import Service

    return {
        t
        for t in threading.enumerate()
        if isinstance(getattr(getattr(t, "_target", None), "__self__", None), Service)
    }


def _children() -> set[int]:
    """This process's live child processes that run dbcluster (nodes, launches, the dashboard;
    zombies excluded: they no longer run)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            found.update(int(pid) for pid in task.read_text().split())
        except OSError:
            continue
    alive = set()
    for pid in found:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        try:
            ours = b"dbcluster" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if state != "Z" and ours:
            alive.add(pid)
    return alive


@pytest.fixture(autouse=True)
def _no_node_outlives_its_test() -> Iterator[None]:
    """A node (a loop thread here, or a child process) left running by a test joins the next
    test's cluster on the same database and takes its partitions. Such a leak fails the test that
    made it, and is ended here, so that it cannot fail a later test instead."""
    if not Path("/proc/self/task").exists():  # not Linux: nothing to look at cheaply
        yield
        return
    threads, children = _node_threads(), _children()
    yield
    deadline = time.monotonic() + 15  # a stopped loop ends after the body it is in
    while True:
        left_threads = _node_threads() - threads
        left_children = _children() - children
        if not (left_threads or left_children) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not (left_threads or left_children):
        return
    for thread in left_threads:
        thread._target.__self__.stop()  # type: ignore[attr-defined]
    for pid in left_children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pytest.fail(
        f"the test left node loops running ({sorted(t.name for t in left_threads)}) "
        f"or child processes ({sorted(left_children)})",
        pytrace=False,
    )


@pytest.fixture(autouse=True)
def _no_command_leaves_its_url() -> Iterator[None]:
    """A command run in the test's own process (``main([...])``, ``CliRunner``) exports its
    ``--url`` as ``DBCLUSTER_URL`` (``dbcluster.cli.options.url_option``), which every later
    ``dbcluster`` subprocess of the same test process would inherit (``ddl --dialect`` then
    fails with "give --dialect or --url, not both"): put back after each test."""
    before = os.environ.get("DBCLUSTER_URL")
    yield
    if before is None:
        os.environ.pop("DBCLUSTER_URL", None)
    else:
        os.environ["DBCLUSTER_URL"] = before


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for found in _opened.values():
        if isinstance(found, Backend):
            found.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "backends(*names): run the test only on the named backends")


@pytest.fixture
def register_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Registers a provider (and, if given, the SQLAlchemy dialect of a URL scheme) in this
    process for one test, as their entry points would: ``register_provider("name",
    "module:Provider", dialect=("scheme", "module", "DialectClass"))``."""
    from importlib.metadata import EntryPoint

    from sqlalchemy.dialects import registry as sqlalchemy_dialects

    from dbcluster.dialects import registry

    points = dict(registry._third_party())
    monkeypatch.setattr(registry, "_third_party", lambda: points)
    names: list[str] = []
    schemes: list[str] = []

    def register(name: str, target: str, dialect: tuple[str, str, str] | None = None) -> None:
        points[name] = EntryPoint(name, target, registry.ENTRY_POINT_GROUP)
        registry._classes.pop(name, None)
        names.append(name)
        if dialect is not None:
            sqlalchemy_dialects.register(*dialect)
            schemes.append(dialect[0])

    yield register
    for name in names:
        registry._classes.pop(name, None)
    for scheme in schemes:
        sqlalchemy_dialects.deregister(scheme)
