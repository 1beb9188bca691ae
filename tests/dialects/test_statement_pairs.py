"""A statement pair (a read and a write in one request) never reports a write it did not see."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dbcluster.dialects.pairs import PyformatPair


class _Cursor:
    def __init__(self, second_result: bool) -> None:
        self.second_result = second_result
        #: PyMySQL leaves the read's row count in place when no second result arrives.
        self.rowcount = 1

    def fetchall(self) -> list[tuple[int]]:
        return [(7,)]

    def nextset(self) -> bool | None:
        if self.second_result:
            self.rowcount = 0  # the UPDATE changed no row
            return True
        return None


def _conn(cursor: _Cursor) -> Any:
    result = SimpleNamespace(cursor=cursor, close=lambda: None)
    return SimpleNamespace(
        exec_driver_sql=lambda sql, values: result,
        dialect=SimpleNamespace(loaded_dbapi=SimpleNamespace(Error=OSError)),
    )


def test_the_writes_own_row_count_is_returned() -> None:
    pair = PyformatPair("SELECT 1; UPDATE t SET a = 1", {}, {})
    assert pair.run(_conn(_Cursor(second_result=True)), {}) == ([(7,)], 0)


def test_a_missing_write_result_is_an_error_not_the_reads_row_count() -> None:
    """Without a second result the write did not run: taking the cursor's row count (the read's
    one row) would count a heartbeat that never landed."""
    pair = PyformatPair("SELECT 1; UPDATE t SET a = 1", {}, {})
    with pytest.raises(RuntimeError, match="no result"):
        pair.run(_conn(_Cursor(second_result=False)), {})
