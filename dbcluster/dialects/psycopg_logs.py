"""psycopg's own lines of a lost connection, kept out of a routine outage's log.

When the connection under a pipeline (or a transaction, or a COPY) is lost, psycopg logs a
WARNING of its own as it cleans up, ``error ignored terminating <psycopg.Pipeline [BAD]>: the
connection is lost``, beside the error that the caller gets and handles. dbcluster reports a
database outage once (a WARNING when it begins, an INFO when it ends, per service), so these
echoes are DEBUG records here, kept only where dbcluster logs at DEBUG. Lines of any other
error (a statement the server refused) stay WARNINGs.
"""

from __future__ import annotations

import logging

#: The cleanup lines psycopg logs after an error it does not raise (psycopg 3.1-3.3).
_ECHOES = ("error ignored terminating", "error ignored exiting", "error ignored in rollback")


class LostConnectionEchoes(logging.Filter):
    """On the ``psycopg`` logger: its cleanup lines whose error is a lost or unusable connection
    (``OperationalError``, ``InterfaceError``) become DEBUG records, dropped unless dbcluster
    logs at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not str(record.msg).startswith(_ECHOES):
            return True
        error = record.args[-1] if isinstance(record.args, tuple) and record.args else None
        if not _lost_connection(error):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger("dbcluster").isEnabledFor(logging.DEBUG)


def _lost_connection(error: object) -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the filter is installed with psycopg only
        return False
    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError))


_FILTER = LostConnectionEchoes()


def install() -> None:
    """Put the filter on the ``psycopg`` logger (once)."""
    logger = logging.getLogger("psycopg")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
