"""PgBouncer 1.18 (Debian's) in transaction pooling mode, in front of the pair's primary: the
topology issue 35 builds on, and what today's code does through it."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from dbcluster.dialects import make_engine
from dbcluster.dialects.base import SessionLimits

pytestmark = pytest.mark.ha


def _dsn(url: str, database: str) -> str:
    parsed = make_url(url)
    return f"host={parsed.host} port={parsed.port} user={parsed.username} dbname={database}"


def test_pgbouncer_pools_by_transaction(pgbouncer: dict[str, str]) -> None:
    url = pgbouncer["HA_PGBOUNCER_URL"]
    with psycopg.connect(_dsn(url, "pgbouncer"), autocommit=True) as admin:
        config = {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}
    assert config["pool_mode"] == "transaction"
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_is_in_recovery()")).scalar_one() is False
    finally:
        engine.dispose()


@pytest.mark.xfail(
    strict=True,
    reason="issue 35: a node's engines send lock_timeout and idle_in_transaction_session_timeout "
    "as the startup parameter 'options', which PgBouncer 1.18 refuses ('unsupported startup "
    "parameter: options', observed)",
)
def test_a_node_engine_connects_through_pgbouncer(pgbouncer: dict[str, str]) -> None:
    engine = make_engine(pgbouncer["HA_PGBOUNCER_URL"], limits=SessionLimits(2000, 10000))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()
