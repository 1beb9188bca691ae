"""In-process test controls for a node: freeze it as a stopped process would be, and record its
events. Not public API."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from sqlalchemy import Engine, event

from dbcluster import points
from dbcluster.cluster.events import _EVENT_NAMES, ClusterEvents
from dbcluster.cluster.node import Node

#: Points where a frozen node's own threads park (outside any transaction).
_PARK_AT = ("app.checkpoint", "master.monitor")


class Frozen:
    """A frozen node: its services wait at their next turn, its partitions at the test app's
    checkpoint and its masters at their next monitoring turn, until :meth:`thaw`."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._thawed = threading.Event()
        node.services.set_gate(self._gate)
        for name in _PARK_AT:
            points.install(name, self._park)

    def _gate(self) -> None:
        self._thawed.wait()

    def _park(self, node_id: str | None = None, **_: Any) -> None:
        if node_id is not None and node_id in self.node.ids:
            self._thawed.wait()

    def thaw(self) -> None:
        for name in _PARK_AT:
            points.remove(name, self._park)
        self.node.services.set_gate(None)
        self._thawed.set()

    def __enter__(self) -> Frozen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.thaw()


def freeze(node: Node) -> Frozen:
    return Frozen(node)


@contextmanager
def hold_services(node: Node, settle_s: float = 5.0) -> Iterator[None]:
    """Hold only the node's services (heartbeat, poller, maintainers) at their next turn, as a
    process whose loops stopped would; its partitions and masters go on. Returns once the
    heartbeat is parked (one already on the wire has landed), or after ``settle_s``."""
    released = threading.Event()
    parked: set[str] = set()
    arrived = threading.Condition()

    def gate() -> None:
        with arrived:
            parked.add(threading.current_thread().name)
            arrived.notify_all()
        released.wait()

    node.services.set_gate(gate)
    heartbeat = node.services.get("heartbeat")
    if heartbeat is not None:
        heartbeat.wake()
        with arrived:
            arrived.wait_for(lambda: "dbcluster-heartbeat" in parked, settle_s)
    try:
        yield
    finally:
        node.services.set_gate(None)
        released.set()


class EventRecorder(ClusterEvents):
    """Records every event as ``(name, details)``; subscribe it to ``node.events``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __getattribute__(self, name: str) -> Any:
        if name in _EVENT_NAMES:
            record = object.__getattribute__(self, "_record")
            return lambda *args, **kwargs: record(name, args, kwargs)
        return object.__getattribute__(self, name)

    def _record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import inspect

        params = list(inspect.signature(getattr(ClusterEvents, name)).parameters)[1:]
        details = dict(zip(params, args, strict=False)) | kwargs
        with self._lock:
            self.events.append((name, details))

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [d for n, d in self.events if n == name]

    def names(self) -> list[str]:
        with self._lock:
            return [n for n, _ in self.events]


def record_events(node: Node) -> EventRecorder:
    recorder = EventRecorder()
    node.events.subscribe(recorder)
    return recorder


# --- transient database faults on one engine ------------------------------------------------------


def result_sizes(node: Node, method: str) -> list[int]:
    """How many items each later call of the node's store ``method`` (``poll_jobs``, ``claim``)
    returned, in order."""
    sizes: list[int] = []
    original = getattr(node.store, method)

    def counting(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        sizes.append(len(found))
        return found

    setattr(node.store, method, counting)
    return sizes


def poll_sizes(node: Node) -> list[int]:
    """How many partitions each later poll of the node found, in order: its own polls
    (``poll_jobs``) and the polls its heartbeat carries (``beat_and_poll``, and
    ``beat_reading_leases`` when it carries one), where the database sends them together."""
    sizes: list[int] = []
    store = node.store
    own, with_beat, with_leases = store.poll_jobs, store.beat_and_poll, store.beat_reading_leases

    def polled(*args: Any, **kwargs: Any) -> Any:
        found = own(*args, **kwargs)
        sizes.append(len(found))
        return found

    def beat_polled(node_id: str, load: int, limit: int, **kwargs: Any) -> Any:
        both = with_beat(node_id, load, limit, **kwargs)
        if both is not None:
            sizes.append(len(both[1]))
        return both

    def beat_read(node_id: str, load: int, limit: int | None, *args: Any, **kwargs: Any) -> Any:
        all_three = with_leases(node_id, load, limit, *args, **kwargs)
        if all_three is not None and limit is not None:
            sizes.append(len(all_three[1]))
        return all_three

    store.poll_jobs = polled  # type: ignore[method-assign]
    store.beat_and_poll = beat_polled  # type: ignore[method-assign]
    store.beat_reading_leases = beat_read  # type: ignore[method-assign]
    return sizes


#: Per dialect: how many transactions of the database wait for a row lock now.
_LOCK_WAITERS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
    "AND datname = current_database()",
    "mysql": "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
    "mariadb": "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
}


def lock_waiters(engine: Engine) -> int:
    """How many transactions wait for a lock now (PostgreSQL, MySQL, MariaDB): for a test to
    know that a statement it started is blocked, rather than not sent yet."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(conn.execute(text(_LOCK_WAITERS[engine.dialect.name])).scalar_one())


def drop_connection(engine: Engine, dbapi_connection: Any) -> BaseException:
    """Close a driver connection as a dropped network would, and return the error its driver
    raises then: one the engine's dialect judges a lost connection (so SQLAlchemy invalidates
    the connection, and every provider calls the error transient)."""
    try:
        dbapi_connection.close()
    except Exception:  # noqa: BLE001 - already gone is as good
        pass
    dbapi = engine.dialect.loaded_dbapi
    for cls_name in ("OperationalError", "InterfaceError", "ProgrammingError"):
        cls = getattr(dbapi, cls_name, None)
        if cls is None:
            continue
        for args in (
            (2013, "Lost connection to server during query"),
            ("server closed the connection unexpectedly",),
            ("Cannot operate on a closed database.",),
        ):
            try:
                error = cls(*args)
            except Exception:  # noqa: BLE001 - a driver that rejects these arguments
                continue
            if engine.dialect.is_disconnect(error, dbapi_connection, None):  # type: ignore[arg-type]
                return error
    raise RuntimeError(f"no disconnect error recognised by {engine.dialect.name}")


class Injected:
    """How many faults an injector has injected so far; :meth:`remove` ends it."""

    def __init__(self) -> None:
        self.count = 0
        self._undo: list[Callable[[], None]] = []

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def _fail_matching(
    engine: Engine,
    times: int,
    when: Callable[[str, Any], bool],
    error: Callable[[Any], BaseException],
) -> Injected:
    """Raise ``error(dbapi_connection)`` instead of running the first ``times`` statements on
    ``engine`` for which ``when(sql, parameters)`` is true."""
    injected = Injected()
    lock = threading.Lock()

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> None:
        with lock:
            if injected.count >= times or not when(statement, parameters):
                return
            injected.count += 1
        raise error(cursor.connection)

    for name in ("do_execute", "do_executemany"):
        event.listen(engine, name, do_execute)
        injected._undo.append(lambda name=name: event.remove(engine, name, do_execute))
    return injected


def fail_statements(engine: Engine, *, times: int, when: Callable[[str, Any], bool]) -> Injected:
    """Fail the first ``times`` statements on ``engine`` for which ``when(sql, parameters)`` is
    true, as a dropped connection would (before the server ran them)."""
    return _fail_matching(engine, times, when, lambda dbapi: drop_connection(engine, dbapi))


def refuse_statements(engine: Engine, *, times: int, when: Callable[[str, Any], bool]) -> Injected:
    """Refuse the first ``times`` statements on ``engine`` for which ``when(sql, parameters)``
    is true, as a database refuses a statement as it is (a value too long for its column): the
    driver's ``DataError``, which no provider calls transient, before the server ran them."""
    refused = engine.dialect.loaded_dbapi.DataError
    message = "value too long for its column (refused by the test)"
    return _fail_matching(engine, times, when, lambda _: refused(message))


def lose_commit_acks(engine: Engine, *, times: int, when: Callable[[list[str]], bool]) -> Injected:
    """For the first ``times`` transactions on ``engine`` whose statements satisfy ``when``:
    commit, then fail as if the connection dropped before the acknowledgement arrived (the
    outcome is unclear to the client; the database has it)."""
    injected = Injected()
    lock = threading.Lock()
    dialect = engine.dialect
    real_commit = dialect.do_commit
    statements: dict[int, list[str]] = {}

    def raw(conn: Any) -> int:
        # The pooled connection: what the dialect's do_commit is handed.
        return id(conn.connection)

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.setdefault(raw(conn), []).append(statement)

    def forget(conn: Any) -> None:
        statements.pop(raw(conn), None)

    def do_commit(pooled: Any) -> None:
        ran = statements.pop(id(pooled), [])
        real_commit(pooled)
        with lock:
            if injected.count >= times or not when(ran):
                return
            injected.count += 1
        raise drop_connection(engine, pooled.dbapi_connection)

    event.listen(engine, "before_cursor_execute", record)
    event.listen(engine, "rollback", forget)
    event.listen(engine, "begin", forget)
    dialect.do_commit = do_commit  # type: ignore[method-assign]

    def undo() -> None:
        dialect.do_commit = real_commit  # type: ignore[method-assign]
        event.remove(engine, "before_cursor_execute", record)
        event.remove(engine, "rollback", forget)
        event.remove(engine, "begin", forget)

    injected._undo.append(undo)
    return injected


def lose_sent_commit_acks(engine: Engine, *, times: int, when: Callable[[str], bool]) -> Injected:
    """For the first ``times`` transactions on ``engine`` whose last statement went out with
    their ``COMMIT`` in one round trip (``Prebuilt.one_committing``) and whose SQL satisfies
    ``when``: it committed, then fail as if the connection dropped before the acknowledgement
    arrived (the outcome is unclear to the client; the database has it)."""
    injected = Injected()
    lock = threading.Lock()

    def sent(conn: Any, sql: str, **_: Any) -> None:
        if conn.engine is not engine:
            return
        with lock:
            if injected.count >= times or not when(sql):
                return
            injected.count += 1
        raise drop_connection(engine, conn.connection.dbapi_connection)

    points.install("transaction.commit_sent", sent)
    injected._undo.append(lambda: points.remove("transaction.commit_sent", sent))
    return injected


def lose_results(engine: Engine, *, times: int, when: Callable[[str], bool]) -> Injected:
    """For the first ``times`` statements on ``engine`` (an autocommit engine: each statement
    commits on its own) whose SQL satisfies ``when``: run it, then fail as if the connection
    dropped before its result arrived (the outcome is unclear to the client; the database has
    it)."""
    injected = Injected()
    lock = threading.Lock()

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> None:
        with lock:
            if injected.count >= times or not when(statement):
                return
            injected.count += 1
        cursor.execute(statement, parameters)
        raise drop_connection(engine, cursor.connection)

    event.listen(engine, "do_execute", do_execute)
    injected._undo.append(lambda: event.remove(engine, "do_execute", do_execute))
    return injected


@contextmanager
def cut_engine(engine: Engine) -> Iterator[None]:
    """While inside: every statement on ``engine`` fails as on a dropped connection, and every
    new connection is refused, as when the network between one node and its database is cut."""
    from dbcluster.dialects import get_provider

    provider = get_provider(engine)
    dbapi = engine.dialect.loaded_dbapi
    refused = next(
        error
        for error in (
            dbapi.OperationalError(2003, "Can't connect to server (connection refused)"),
            dbapi.OperationalError("connection refused"),
            dbapi.OperationalError("database is locked"),
        )
        if provider._is_transient_driver_error(error)
    )

    def do_execute(cursor: Any, *args: Any) -> None:
        raise drop_connection(engine, cursor.connection)

    def do_connect(*args: Any) -> None:
        raise refused

    listeners = [
        ("do_execute", do_execute),
        ("do_executemany", do_execute),
        ("do_execute_no_params", do_execute),
        ("do_connect", do_connect),
    ]
    for name, fn in listeners:
        event.listen(engine, name, fn)
    try:
        yield
    finally:
        for name, fn in listeners:
            event.remove(engine, name, fn)


@contextmanager
def cut_node(node: Node) -> Iterator[None]:
    """While inside: every engine of ``node`` (coordination, work and autocommit) is cut as by
    :func:`cut_engine`, as when the network between the node and its database is cut."""
    engines = [node.engines.coordination, node.engines.work, node.engines.autocommit]
    unique = list({id(e): e for e in engines if e is not None}.values())
    with ExitStack() as stack:
        for engine in unique:
            stack.enter_context(cut_engine(engine))
        yield


def transfer_while_parked(
    engine: Engine,
    launch: Callable[[], Any],
    point: str,
    match: Callable[..., bool],
    holder: str,
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Run ``launch`` on a thread, park the first of its transactions that reaches ``point``
    (and satisfies ``match``) and, while it is parked, fail its job's in-flight partitions from
    a connection of its own, as a master or a survivor would. Checks that the failure waits for
    the parked transaction (``holder`` names it in the message), then releases it. Returns the
    launch's and the failure's :func:`~dbcluster.testing.waiting.in_thread` dicts (the failure's
    ``moved`` gets the rows it changed once it committed) and the job execution's id."""
    from dbcluster.dialects import get_provider
    from dbcluster.retry import Retry
    from dbcluster.testing.waiting import in_thread

    moved: list[int] = []
    with points.parked(point, match) as park:
        run = in_thread(launch)
        job_id = int(park.wait()[0]["step_execution"].job_execution.id)
        provider = get_provider(engine)
        statement = provider.fail_job_partitions(job_id)
        # As a master's transaction does, it tries again after an error the database says to
        # repeat: once, on a Galera node, the waiting UPDATE ended as a deadlock (1213) when the
        # parked transaction committed. The dict's ``tries`` counts its tries; a repetition may
        # find the partition already finished (``moved`` [0]).
        again = Retry(provider.is_transient, deadline_s=20)
        tries: list[int] = []

        def fail_once() -> None:
            tries.append(1)
            with engine.begin() as conn:
                count = conn.execute(statement).rowcount
            moved.append(count)

        def fail() -> None:
            again.call(fail_once, "failing the job's partitions")

        transfer = in_thread(fail)
        transfer["moved"] = moved
        transfer["tries"] = tries
        transfer["thread"].join(0.4)
        assert transfer["thread"].is_alive() and not moved, (
            f"the partition was failed while {holder} held it"
        )
    return run, transfer, job_id
