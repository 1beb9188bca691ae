"""Oracle bounds no lock wait per session and ends no idle transaction: every round trip of a
dbcluster session has python-oracledb's ``call_timeout`` instead, and a session whose call was
cut is thrown away, not pooled again. No Oracle server runs here: the engine is made (it connects
only when used) and its hooks are fed python-oracledb's own exceptions."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine

from dbcluster.cluster.settings import ClusterSettings
from dbcluster.dialects import make_engine, provider_for_name
from dbcluster.dialects.base import SessionLimits

URL = "oracle+oracledb://dbc:secret@127.0.0.1:1/?service_name=FREEPDB1"


def _limits(settings: ClusterSettings) -> list[SessionLimits]:
    """The limits of a node's coordination and work sessions (cluster/node.py)."""
    idle = settings.idle_transaction_ms
    return [
        SessionLimits(settings.coordination_lock_timeout_ms, idle),
        SessionLimits(settings.work_lock_timeout_ms, idle),
    ]


@pytest.mark.parametrize(
    "settings",
    [ClusterSettings(), ClusterSettings(unreachable_threshold=4000, cleanup_threshold=9000)],
    ids=["defaults", "short"],
)
def test_every_round_trip_is_bounded_and_the_lock_wait_ends_first(
    settings: ClusterSettings,
) -> None:
    """The bound is the idle-in-transaction bound the other databases put on a frozen holder,
    above the statement's own ``FOR UPDATE WAIT n`` (so that wait ends first, cleanly), and
    under the cleanup threshold."""
    provider = provider_for_name("oracle")
    for limits in _limits(settings):
        timeout = provider.call_timeout_ms(limits)
        provider.limits = limits
        wait = provider.bounded(provider.hold_partition(1, "n", 1))[0]
        sql = str(wait.compile(dialect=provider.dialect))
        wait_s = int(sql.rsplit("FOR UPDATE WAIT ", 1)[1])
        assert timeout >= wait_s * 1000 + 1000, (limits, timeout, sql)
        assert timeout >= (limits.idle_in_transaction_ms or 0)
        assert timeout < settings.cleanup_threshold, (limits, timeout)


def _connect_hooks(engine: Engine) -> list[Any]:
    """The connect hooks dbcluster's make_engine added (not SQLAlchemy's own first connect)."""
    return [
        hook
        for hook in engine.pool.dispatch.connect
        if getattr(hook, "__module__", "").startswith("dbcluster.")
    ]


def test_a_node_engine_sets_call_timeout_on_each_new_connection() -> None:
    limits = _limits(ClusterSettings())[0]
    engine = make_engine(URL, limits=limits)
    try:
        connection = SimpleNamespace(call_timeout=0)
        hooks = _connect_hooks(engine)
        assert hooks, "no connect hook"
        for hook in hooks:
            hook(connection, None)
        expected = provider_for_name("oracle").call_timeout_ms(limits)
        assert connection.call_timeout == expected == 11_000
    finally:
        engine.dispose()
    plain = make_engine(URL)  # an engine without limits (the user's own) is left as it is
    try:
        connection = SimpleNamespace(call_timeout=0)
        for hook in _connect_hooks(plain):
            hook(connection, None)
        assert connection.call_timeout == 0
    finally:
        plain.dispose()


def _handled(engine: Engine, error: BaseException) -> SimpleNamespace:
    """What the engine's error hooks decide for ``error`` (SQLAlchemy's ExceptionContext)."""
    context = SimpleNamespace(
        original_exception=error,
        sqlalchemy_exception=None,
        is_disconnect=False,
        invalidate_pool_on_disconnect=True,
        engine=engine,
    )
    hooks = list(engine.dialect.dispatch.handle_error)
    assert hooks, "no error hook"
    for hook in hooks:
        hook(context)
    return context


def test_a_session_whose_call_timed_out_is_discarded_alone() -> None:
    """The interrupted call leaves the session's state unknown: SQLAlchemy invalidates that
    connection (it is then a transient error, the statement repeated on a fresh session); the
    rest of the pool is kept. A lock wait that ended on its own (ORA-30006) keeps its session."""
    from oracledb import errors

    engine = make_engine(URL, limits=_limits(ClusterSettings())[1])
    try:
        timed_out = errors._create_exception(errors.ERR_CALL_TIMEOUT_EXCEEDED, timeout=11000)
        thick = errors._Error("DPI-1067: call timeout of 11000 ms exceeded with ORA-3156")
        for error in (timed_out, thick.exc_type(thick)):
            decided = _handled(engine, error)
            assert decided.is_disconnect and not decided.invalidate_pool_on_disconnect
        waited = errors._Error("ORA-30006: resource busy; acquire with WAIT timeout expired")
        waited = errors._Error(waited.message, code=30006)
        decided = _handled(engine, waited.exc_type(waited))
        assert not decided.is_disconnect and decided.invalidate_pool_on_disconnect
    finally:
        engine.dispose()


def test_the_readme_names_the_setting() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Supported databases", 1)[1].split("\n## ", 1)[0]
    oracle = next(line for line in section.splitlines() if line.startswith("| Oracle | python"))
    assert "`call_timeout`" in oracle and "11 s by default" in oracle
    assert provider_for_name("oracle").call_timeout_ms(_limits(ClusterSettings())[1]) == 11_000
