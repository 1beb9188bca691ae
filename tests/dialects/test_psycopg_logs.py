"""psycopg's cleanup line after a lost connection is no WARNING of dbcluster's logs."""

from __future__ import annotations

import logging

import pytest

psycopg = pytest.importorskip("psycopg")

from dbcluster.dialects import postgresql  # noqa: E402, F401 - installs the filter


def _echo(error: BaseException) -> None:
    logging.getLogger("psycopg").warning(
        "error ignored terminating %r: %s", "<psycopg.Pipeline [BAD]>", error
    )


def test_a_lost_connection_echo_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _echo(psycopg.OperationalError("the connection is lost"))
    assert [r for r in caplog.records if r.name == "psycopg"] == []


def test_it_is_kept_at_debug_where_dbcluster_logs_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _echo(psycopg.OperationalError("the connection is lost"))
    assert [r.levelname for r in caplog.records if r.name == "psycopg"] == ["DEBUG"]


def test_the_echo_of_another_error_stays_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _echo(psycopg.errors.SyntaxError("syntax error at or near"))
    logging.getLogger("psycopg").warning("some other line: %s", "x")
    assert [r.levelname for r in caplog.records if r.name == "psycopg"] == ["WARNING", "WARNING"]
