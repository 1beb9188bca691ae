"""The worker's line for a failed partition names the exception its step recorded."""

from __future__ import annotations

import traceback

from sqlalchemy.exc import OperationalError

from dbcluster.cluster.announce import cause


def _recorded(error: BaseException) -> str:
    try:
        raise error
    except BaseException as raised:  # noqa: BLE001 - formatted as describe_failure does
        return "".join(traceback.format_exception(raised)).strip()


def test_the_cause_of_a_driver_error_is_its_exception_line_not_the_wrappers_link() -> None:
    # A Galera kill/rejoin run: 'failed partition ids-1201-1601 (115): no reason recorded', and
    # once the description was passed, SQLAlchemy's '(Background on this error at: ...)'.
    lost = OperationalError("UPDATE batch_partitions ...", {}, ConnectionError("gone"))
    assert cause(_recorded(lost)) == (
        "sqlalchemy.exc.OperationalError: (builtins.ConnectionError) gone"
    )
    assert cause(_recorded(KeyError("k"))) == "KeyError: 'k'"
    assert cause("stopped by hand\nmore") == "stopped by hand"
    assert cause(None) == "no reason recorded"
