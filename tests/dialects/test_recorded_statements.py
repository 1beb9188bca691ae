"""Every statement the product sent while a small cluster worked, compiled for every database.

The provider's own statements are enumerated by introspection (``test_provider_compile``); this
records the rest, as they are sent: while two nodes in this process run a partitioned job, accept
a submitted one, remove a dead node, leave the cluster and prune, every SQLAlchemy statement the
product executes (job repository, coordination store, launcher, monitor, pruning) is recorded
from the engines' ``before_execute`` event, with where it was sent from. Each is then compiled
by Oracle 19c and 23ai, SQL Server, Db2 (ibm_db_sa), MySQL 8, MariaDB, PostgreSQL and SQLite;
one that does not compile fails with the place that sent it. Statements the provider runs itself
(its upserts) and the test application's own are left to the enumeration and the app.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, Insert, event, insert, select
from sqlalchemy.sql.elements import ClauseElement
from test_provider_compile import DIALECT_IDS, DIALECTS

import dbcluster
from dbcluster import schema
from dbcluster.cluster import Cluster
from dbcluster.dialects import get_provider, make_engine, provider_for_name
from dbcluster.testing.app import FAST_SETTINGS, build_registry, ledger_metadata
from dbcluster.testing.waiting import wait_for

PACKAGE = Path(dbcluster.__file__).resolve().parent
SQLALCHEMY = Path(sys.modules["sqlalchemy"].__file__ or "").resolve().parent
#: Where a statement is sent from that this recording leaves to others: the provider running
#: its own statements (enumerated by introspection), the test application and harness.
NOT_PRODUCT = (PACKAGE / "dialects", PACKAGE / "testing")


@dataclass(frozen=True)
class Sent:
    statement: Any
    origin: str
    #: The parameter names an INSERT was sent with (its VALUES are built from them).
    keys: tuple[str, ...] | None = None

    def compile(self, dialect: Any) -> str:
        keys = list(self.keys) if self.keys is not None else None
        return str(self.statement.compile(dialect=dialect, column_keys=keys))


def _keys(statement: Any, multiparams: Any) -> tuple[str, ...] | None:
    if not isinstance(statement, Insert) or not multiparams:
        return None
    first = multiparams[0] if isinstance(multiparams, (list, tuple)) else multiparams
    return tuple(first) if isinstance(first, dict) else None


def _sender() -> tuple[str, int, str] | None:
    """Who sent the statement: the first frame outside SQLAlchemy and this module (file, line,
    function). Frames are walked, not formatted: a heartbeat must not wait for this."""
    frame = sys._getframe(1)
    here = __file__
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != here and not filename.startswith(_SQLALCHEMY):
            return filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


_SQLALCHEMY = str(SQLALCHEMY)
_PACKAGE = str(PACKAGE)
_SKIPPED = tuple(str(path) for path in NOT_PRODUCT)


@pytest.fixture(scope="module")
def sent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Sent]]:
    """What the product sent while the cluster below worked (one run for the module)."""
    found: dict[int, Sent] = {}
    lock = threading.Lock()

    def record(conn: Any, clauseelement: Any, multiparams: Any, *args: Any) -> None:
        if not isinstance(clauseelement, ClauseElement) or id(clauseelement) in found:
            return
        sender = _sender()
        if sender is None or not sender[0].startswith(_PACKAGE):
            return  # this test's own set-up
        if sender[0].startswith(_SKIPPED):
            return
        where = f"{Path(sender[0]).relative_to(PACKAGE.parent)}:{sender[1]} in {sender[2]}"
        with lock:
            found.setdefault(
                id(clauseelement), Sent(clauseelement, where, _keys(clauseelement, multiparams))
            )

    url = f"sqlite:///{tmp_path_factory.mktemp('recorded') / 'product.db'}"
    event.listen(Engine, "before_execute", record)
    try:
        _work(url)
    finally:
        event.remove(Engine, "before_execute", record)
    yield list(found.values())


def _work(url: str) -> None:
    """Two nodes: a partitioned job, a submitted one, a dead node removed, both nodes leaving,
    the monitor's reads, a prune."""
    from dbcluster import monitor
    from dbcluster.cli import main

    engine = make_engine(url)
    get_provider(engine).create_tables(engine)
    ledger_metadata.create_all(engine)
    registry = build_registry(per_node=2, items=40)
    first = Cluster(url, registry, FAST_SETTINGS)
    second = Cluster(url, registry, FAST_SETTINGS, accept_launches=True)
    first.start()
    second.start()
    try:
        executions = [first.launch("ledger", {"run": 1})]
        request = second.submit("ledger", {"run": 2})
        requests = schema.launch_requests

        def launched() -> Any:
            with engine.connect() as conn:
                return conn.execute(
                    select(requests.c.job_execution_id).where(
                        requests.c.request_id == request, requests.c.status == "LAUNCHED"
                    )
                ).scalar()

        executions.append(wait_for(launched, 60, "the submitted job launched"))
        ended = schema.job_execution.c.end_time.is_not(None)

        def finished() -> bool:
            with engine.connect() as conn:
                return bool(
                    conn.execute(
                        select(schema.job_execution.c.job_execution_id).where(
                            schema.job_execution.c.job_execution_id == executions[-1], ended
                        )
                    ).first()
                )

        wait_for(finished, 60, "the submitted job ended")
        # A node silent for a day: the sweep removes it (and fences what it had claimed).
        now = get_provider(engine).select_now()
        with engine.begin() as conn:
            clock = conn.execute(now).scalar_one()
            day_ago = (clock - timedelta(days=1)) if not isinstance(clock, str) else None
            conn.execute(
                insert(schema.nodes).values(
                    node_id="t-dead",
                    host="gone",
                    status="UNREACHABLE",
                    created_time=day_ago,
                    last_heartbeat=day_ago,
                    current_load=0,
                    capacity=1,
                )
            )

        def removed() -> bool:
            with engine.connect() as conn:
                nodes = schema.nodes
                return (
                    conn.execute(select(nodes).where(nodes.c.node_id == "t-dead")).first() is None
                )

        wait_for(removed, 60, "the dead node removed")
        monitor.cluster_status(engine)
        monitor.recent_jobs(engine)
        for execution in executions:
            monitor.job_detail(engine, int(getattr(execution, "id", execution)))
    finally:
        second.stop(drain_timeout_ms=2000)
        first.stop(drain_timeout_ms=2000)
    for args in (["--dry-run"], []):
        with pytest.raises(SystemExit) as done:
            main(["prune", "--url", url, "--older-than", "0s", *args])
        assert done.value.code in (0, None)
    engine.dispose()


def test_the_recording_saw_what_a_cluster_sends(sent: list[Sent]) -> None:
    """The test of the test: the run sent the repository's, the store's and the pruning's
    statements, among them the locking reads of a removal and of a node leaving."""
    origins = {s.origin.split(":")[0] for s in sent}
    for place in (
        "dbcluster/batch/dao/",  # the job repository's DAOs
        "dbcluster/cluster/store/",
        "dbcluster/cluster/maintenance/pruner.py",
    ):
        assert any(origin.startswith(place) for origin in origins), (place, sorted(origins))
    locks = [
        s
        for s in sent
        if getattr(s.statement, "_for_update_arg", None) is not None
        and schema.nodes.name in {getattr(f, "name", "") for f in s.statement.get_final_froms()}
    ]
    assert len({str(s.statement) for s in locks}) >= 2, [s.origin for s in locks]
    assert len(sent) > 60, len(sent)


@pytest.mark.parametrize(("name", "version"), DIALECTS, ids=DIALECT_IDS)
def test_every_recorded_statement_compiles_on_every_dialect(
    sent: list[Sent], name: str, version: tuple[int, ...] | None
) -> None:
    provider = provider_for_name(name, version)
    failures = []
    for item in sent:
        try:
            item.compile(provider.dialect)
        except Exception as exc:  # noqa: BLE001 - reported with where it was sent from
            failures.append(f"{item.origin}: {type(exc).__name__}: {exc}")
    assert not failures, f"{len(failures)} statement(s) do not compile on {name}:\n" + "\n".join(
        sorted(set(failures))
    )
