"""A database outage in a node's service logs: one WARNING when it begins, one INFO when it ends,
no traceback; any other failure of a body stays an ERROR with its traceback (issue 34)."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import pytest
from sqlalchemy import text

from dbcluster.cluster.membership import Heartbeat, Membership
from dbcluster.cluster.patience import is_passing
from dbcluster.cluster.service import Outages, Service, ServiceGroup
from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import get_provider, make_engine
from dbcluster.testing.harness import wait_until


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outage_error() -> Exception:
    """What a statement raises while PostgreSQL is down (a refused connect), as SQLAlchemy
    wraps it, and the provider that judges it."""
    engine = make_engine(f"postgresql+psycopg://u@127.0.0.1:{_closed_port()}/none")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as error:  # noqa: BLE001 - the sample
        return error
    finally:
        engine.dispose()
    raise AssertionError("a connect to a closed port succeeded")


class Scripted(Service):
    """Raises the errors of ``script`` one turn each, then succeeds."""

    name = "scripted"

    def __init__(self, script: list[BaseException | None]) -> None:
        super().__init__(1)
        self.script = list(script)
        self.turns = 0
        self.done = threading.Event()

    def run_once(self) -> None:
        self.turns += 1
        if not self.script:
            self.done.set()
            return
        error = self.script.pop(0)
        if error is not None:
            raise error


def _run(service: Service, is_outage, has_identity=None) -> None:
    group = ServiceGroup(is_outage=is_outage, has_identity=has_identity)
    group.add(service)
    group.start()
    try:
        wait_until(service.done.is_set, 10, "the script to end")
    finally:
        group.stop()


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, bool]]:
    return [
        (r.levelname, r.getMessage(), r.exc_info is not None)
        for r in caplog.records
        if r.name == "dbcluster.service"
    ]


def test_an_outage_logs_one_warning_then_one_info(caplog: pytest.LogCaptureFixture) -> None:
    error = _outage_error()
    provider = get_provider(make_engine("postgresql+psycopg://u@127.0.0.1/none"))
    caplog.set_level(logging.DEBUG, logger="dbcluster.service")
    service = Scripted([error, error, error, None, error, None])
    _run(service, lambda e: is_passing(provider, e))
    records = [r for r in _records(caplog) if r[0] != "DEBUG"]
    # Two outages: each one WARNING when it begins and one INFO when a turn works again.
    assert [level for level, _, _ in records] == ["WARNING", "INFO", "WARNING", "INFO"]
    warning = records[0][1]
    assert warning.startswith("service scripted: database unavailable; retrying (")
    assert "OperationalError" in warning and "\n" not in warning and "[SQL" not in warning
    assert records[1][1].startswith("service scripted: database available again")
    assert not any(traced for _, _, traced in records)


def test_a_turn_that_skipped_its_work_does_not_end_the_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the node has no identity to act under, its services' turns skip their work: such a
    turn says nothing of the database, and the outage goes on (one WARNING, one INFO)."""
    error = _outage_error()
    provider = get_provider(make_engine("postgresql+psycopg://u@127.0.0.1/none"))
    caplog.set_level(logging.INFO, logger="dbcluster.service")
    service = Scripted([error, None, None, error, None])
    # Acting again only from the 5th turn on: turns 2 and 3 skipped their work.
    _run(service, lambda e: is_passing(provider, e), has_identity=lambda: service.turns >= 5)
    assert [level for level, _, _ in _records(caplog)] == ["WARNING", "INFO"]


def test_any_other_failure_is_an_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dbcluster.service")
    _run(Scripted([KeyError("a bug")]), lambda e: False)
    assert _records(caplog) == [("ERROR", "service scripted failed", True)]


def _joined_before_an_outage() -> tuple[BaseException, Any, Membership]:
    """The error of an outage, a PostgreSQL provider to judge it, and a membership joined as
    ``n1`` whose thresholds no test reaches (a heartbeat every 10 ms)."""
    settings = ClusterSettings(
        heartbeat_interval=10, unreachable_threshold=60_000, cleanup_threshold=120_000
    )
    membership = Membership(settings, _NoEvents())  # type: ignore[arg-type]
    membership.joined("n1", 1)
    provider = get_provider(make_engine("postgresql+psycopg://u@127.0.0.1/none"))
    return _outage_error(), provider, membership


def test_a_heartbeat_through_an_outage_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """The heartbeat handles its own errors (it judges how long it has been silent): an outage
    still costs one WARNING, not one per beat."""
    error, provider, membership = _joined_before_an_outage()
    beats = {"n": 0}

    class Store:
        def heartbeat(self, node_id: str, load: int) -> bool:
            beats["n"] += 1
            if beats["n"] <= 5:
                raise error
            return True

    heartbeat = Heartbeat(membership, Store(), lambda: 0, lambda: None)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO)
    group = ServiceGroup(is_outage=lambda e: is_passing(provider, e))
    group.add(heartbeat)
    group.start()
    try:
        wait_until(lambda: beats["n"] >= 7, 10, "the heartbeat to beat again")
    finally:
        group.stop()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    lines = [line for line in lines if "joined" not in line[1]]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert "service heartbeat: database unavailable" in lines[0][1]


class _NoEvents:
    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def test_a_repeated_statement_says_so_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """The default retry log: its first repetition is one INFO line (the driver's error, without
    SQLAlchemy's SQL text), the next ones DEBUG."""
    from dbcluster.retry import Retry

    error = _outage_error()
    tries = {"n": 0}

    def work() -> str:
        tries["n"] += 1
        if tries["n"] < 4:
            raise error
        return "done"

    caplog.set_level(logging.DEBUG, logger="dbcluster.retry")
    retry = Retry(lambda e: True, attempts=5, sleep=lambda s: None)
    assert retry.call(work, "poll") == "done"
    levels = [r.levelname for r in caplog.records if r.name == "dbcluster.retry"]
    assert levels == ["INFO", "DEBUG", "DEBUG"]
    first = caplog.records[0].getMessage()
    assert first.startswith("transient error in poll (attempt 1): OperationalError: ")
    assert "\n" not in first and "[SQL" not in first


def test_a_node_waits_an_outage_out_for_as_long_as_it_may_act(tmp_path) -> None:
    """A node's step and job transactions repeat a database outage's errors until the node is
    fenced (``give_up``), at the latest ``cleanup_threshold``, with no count of tries: 50 tries
    with pauses capped at the heartbeat interval ran out in about 10 s, before the node fenced
    itself, and a chunk that an outage that long interrupted failed its partition (and a
    non-transferable one its job)."""
    from dbcluster.cluster.node import Node

    settings = ClusterSettings(
        heartbeat_interval=200, unreachable_threshold=10_000, cleanup_threshold=20_000
    )
    node = Node(make_engine(f"sqlite:///{tmp_path / 'n.db'}"), None, settings, capacity=0)
    policy = node.repository.transactions.policy
    assert policy.attempts is None
    assert policy.deadline_s == 20.0


def test_a_leaving_node_waits_an_outage_out_until_its_drain_ends(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graceful stop drains: its running partitions may finish, so a transient error (a
    deadlock, a database restart during a rolling restart) is repeated until the drain's
    deadline, not given up at once (a non-transferable partition's failure fails its job)."""
    import time

    from dbcluster.cluster.node import Node

    node = Node(make_engine(f"sqlite:///{tmp_path / 'n.db'}"), None, ClusterSettings(), capacity=0)
    # A node that acts (not fenced), without starting one.
    monkeypatch.setattr(Node, "is_fenced", property(lambda self: False))
    give_up = node.repository.transactions.policy.give_up
    assert not give_up()
    node._drain_deadline = time.monotonic() + 60
    node.membership.stop()
    assert not give_up(), "a draining node gave a step's transient error up at once"
    node._drain_deadline = time.monotonic() - 1
    assert give_up(), "a node whose drain ran out still repeats"


class Failing(Service):
    """Every turn fails: with ``error`` (swapped by the test)."""

    name = "failing"

    def __init__(self, error: BaseException) -> None:
        super().__init__(10)
        self.error = error
        self.turns = 0

    def run_once(self) -> None:
        self.turns += 1
        raise self.error


def test_a_service_is_behind_for_its_own_failures_not_for_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A leased service that does no work makes its node give the lease up (``behind``); not
    while its turns fail because the database is unavailable, which every node meets alike (a
    restart longer than the lease's term moved every lease and logged a warning per lease)."""
    error = _outage_error()
    provider = get_provider(make_engine("postgresql+psycopg://u@127.0.0.1/none"))
    caplog.set_level(logging.CRITICAL, logger="dbcluster.service")
    service = Failing(error)
    group = ServiceGroup(is_outage=lambda e: is_passing(provider, e))
    group.add(service)
    group.start()
    try:
        began = service.last_good
        wait_until(lambda: service.turns >= 30, 10, "turns that meet the outage")
        assert service.last_good == began, "a turn that met the outage did its work"
        assert service.behind() <= 0, "an outage counted against the service"
        service.error = KeyError("a bug")
        turns = service.turns
        wait_until(lambda: service.turns >= turns + 5, 10, "turns that fail on their own")
        assert service.behind() > 0, "a service failing on its own kept up"
    finally:
        group.stop()


def test_a_heartbeat_carried_by_the_poll_ends_the_heartbeats_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A busy worker's poll carries every heartbeat (and postpones the heartbeat's own turn):
    the first carried heartbeat that lands ends the outage the heartbeat met, so the next
    outage has a WARNING of its own and each INFO gives its own outage's length. Before, the
    heartbeat's outage stayed open until a turn of its own, which the carrying polls postponed
    for as long as the node was busy: in a PostgreSQL restart run, worker logs read "service
    heartbeat: database available again (after 16.7 s)" for two 6.5 s restarts 14 s apart,
    with no heartbeat WARNING for the second."""
    error, provider, membership = _joined_before_an_outage()

    class Store:
        def heartbeat(self, node_id: str, load: int) -> bool:
            raise error

    heartbeat = Heartbeat(membership, Store(), lambda: 0, lambda: None)  # type: ignore[arg-type]
    heartbeat.is_outage = lambda e: is_passing(provider, e)
    caplog.set_level(logging.INFO)
    identity = membership.current
    assert identity is not None

    heartbeat.run_once()  # the first outage: the heartbeat's own turn meets it
    heartbeat.carried(identity, True, 0.0)  # the database is back; the poll carried a beat
    heartbeat.run_once()  # a second outage

    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "dbcluster.service"]
    assert [level for level, _ in lines] == ["WARNING", "INFO", "WARNING"], lines


def test_a_master_waiting_for_the_database_warns_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A master whose look at its partitions meets an outage says so once, in one line: the
    driver's error, not SQLAlchemy's wrapper with the statement, its parameters and a link.
    Before, a PostgreSQL restart put three lines in a launch's log ("master ... waits for the
    database: (psycopg.OperationalError) connection failed: ... / Is the server running ... /
    (Background on this error at: https://sqlalche.me/e/21/e3q8)"), and a statement that lost
    its connection would have put its SQL and parameters there too."""
    from types import SimpleNamespace

    import psycopg
    from sqlalchemy.exc import OperationalError

    from dbcluster.cluster import handler as handler_module
    from dbcluster.cluster.handler import ClusterPartitionHandler

    lost = OperationalError(
        "SELECT status, count(*) FROM batch_partitions WHERE master_step_execution_id = %(m)s",
        {"m": 7},
        psycopg.OperationalError(
            "consuming input failed: server closed the connection unexpectedly\n"
            "\tThis probably means the server terminated abnormally"
        ),
    )
    looks = {"n": 0}

    class Store:
        provider = SimpleNamespace(is_transient=lambda e: True)

        def counts(self, master_id: int) -> dict[str, int]:
            looks["n"] += 1
            if looks["n"] <= 3:
                raise lost
            return {}

    handler = object.__new__(ClusterPartitionHandler)
    handler.store = Store()  # type: ignore[assignment]
    handler.progress = None
    handler.context = SimpleNamespace(  # type: ignore[assignment]
        settings=SimpleNamespace(master_check_interval=10, orphan_check_interval=60_000),
        outages=Outages(),
    )
    mastership = SimpleNamespace(node_id="n1", check=lambda: None)
    master = SimpleNamespace(id=7, job_execution=SimpleNamespace(stop_requested=False))
    caplog.set_level(logging.INFO, logger="dbcluster")
    pace = handler_module.CheckPace
    try:
        # Short pauses: the back-off of a real master is seconds.
        handler_module.CheckPace = lambda first, most: _FastPace()  # type: ignore[assignment,misc]
        handler._monitor(None, master, mastership, placed_now=False)  # type: ignore[arg-type]
    finally:
        handler_module.CheckPace = pace  # type: ignore[misc]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0] == (
        "master n1: database unavailable; retrying (OperationalError: consuming input failed: "
        "server closed the connection unexpectedly)"
    )
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(i.startswith("master n1: database available again (after ") for i in infos)


class _FastPace:
    first_ms = 0

    def next_ms(self, in_flight: int, now: float) -> float:
        return 0

    def backoff_ms(self) -> float:
        return 1


def test_a_node_says_once_that_the_database_is_away_however_many_services_meet_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The node's services (and its partitions) share one outage: one WARNING when the first
    meets it, DEBUG for the others, one INFO when one that met it gets through. One that met it
    and failed once more after another got through (a pool the restart broke) is still in that
    outage: no WARNING of a new one. A service that got through and fails again meets a new
    outage: its WARNING."""
    from dbcluster.cluster.service import Outage

    caplog.set_level(logging.DEBUG, logger="dbcluster.service")
    error = RuntimeError("server closed the connection unexpectedly")
    node = Outages()
    heartbeat, poll, partitions = (Outage(n, node) for n in ("heartbeat", "poll", "partitions"))
    heartbeat.began(error)
    poll.began(error)
    partitions.began(error)
    poll.began(error)  # still away
    heartbeat.ended()  # back
    partitions.began(error)  # a broken pooled connection, met after the heartbeat got through
    poll.ended()
    partitions.ended()
    poll.began(error)  # a new outage
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "dbcluster.service"]
    levels = [level for level, _ in said]
    assert levels == ["WARNING", "DEBUG", "DEBUG", "DEBUG", "INFO", "DEBUG", "WARNING"], said
    assert said[0][1].startswith("service heartbeat: database unavailable; retrying (")
    assert said[4][1].startswith("service heartbeat: database available again (after ")
    assert said[-1][1].startswith("service poll: database unavailable; retrying (")


def test_a_service_group_shares_its_nodes_outages() -> None:
    shared = Outages()
    group = ServiceGroup(outages=shared)
    one, two = group.add(Scripted([])), group.add(Scripted([]))
    assert one.outage.node is shared and two.outage.node is shared
    assert one.outage is not two.outage


def test_a_heartbeat_begun_after_an_outage_began_ends_it_though_what_met_it_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A master met an outage alone (a blip) and its job ended before it got through: a
    heartbeat that began after the outage did and landed ends it (one begun before proves
    nothing; another service's turn that raised nothing proves nothing either: it may not have
    reached the database). The next outage gets its WARNING; before, none: the node's outage
    stayed open for good."""
    import time

    from dbcluster.cluster.service import Outage

    caplog.set_level(logging.INFO, logger="dbcluster.service")
    error = RuntimeError("server closed the connection unexpectedly")
    node = Outages()
    master = Outage("master", node, who="master n1")
    heartbeat, sweep = Outage("heartbeat", node, proves=True), Outage("sweep", node)
    before = time.monotonic()
    master.began(error)  # ... and the master's loop ends there
    heartbeat.ended(before)  # a beat sent before the outage began
    sweep.ended(time.monotonic())  # a turn of a service that proves nothing
    assert node.since is not None
    heartbeat.ended(time.monotonic())  # a beat begun after it: the database answers
    assert node.since is None
    sweep.began(error)  # the next outage
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "dbcluster.service"]
    assert [level for level, _ in said] == ["WARNING", "INFO", "WARNING"], said
    assert said[1][1].startswith("service heartbeat: database available again (after ")


def test_only_the_heartbeat_proves_the_database_answers() -> None:
    from dbcluster.cluster.membership import Heartbeat

    group = ServiceGroup()
    scripted = group.add(Scripted([]))
    assert Heartbeat.proves_database and not scripted.outage.proves
