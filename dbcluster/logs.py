"""Log output of the long-running commands: a level, and text or JSON lines.

``--log-format text`` (the default) writes ``2026-11-30T02:00:00.123Z INFO dbcluster.worker:
message``; ``--log-format json`` writes one JSON object per line with ``time`` (ISO 8601, UTC,
ending in ``Z``), ``level``, ``logger``, ``message`` and, when there is one, ``exception``.
Either way every record passes :class:`~dbcluster.masking.SecretsFilter`: no password
reaches a log.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

from dbcluster.masking import SecretsFilter

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")


def iso_utc(created: float) -> str:
    """A POSIX time as ISO 8601 in UTC with milliseconds and a ``Z``."""
    stamp = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``<ISO time>Z LEVEL logger: message`` (and the traceback, if any)."""

    def __init__(self, prefix: str = "%(levelname)s %(name)s: %(message)s") -> None:
        super().__init__(prefix)

    def format(self, record: logging.LogRecord) -> str:
        return f"{iso_utc(record.created)} {super().format(record)}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.threadName and record.threadName != "MainThread":
            line["thread"] = record.threadName
        return json.dumps(line, ensure_ascii=False, default=str)


def handler(log_format: str, stream: IO[str] | None = None) -> logging.Handler:
    """A stream handler (stderr by default) in ``log_format``, masking secrets."""
    made = logging.StreamHandler(stream or sys.stderr)
    made.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    made.addFilter(SecretsFilter())
    return made


def configure(level: str, log_format: str, stream: IO[str] | None = None) -> logging.Handler:
    """Log records of ``level`` and above to stderr in ``log_format``, replacing the root
    logger's handlers; returns the handler."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    made = handler(log_format, stream)
    root.addHandler(made)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    return made


def announce(
    message: str, log_format: str, *, level: int = logging.INFO, logger: str = "dbcluster"
) -> None:
    """A line a command always shows on stderr whatever the level (where it listens, a
    warning about how it was started): plain text, or one JSON log line with --log-format
    json, so that stderr stays all JSON."""
    if log_format != "json":
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        return
    record = logging.LogRecord(logger, level, __file__, 0, "%s", (message,), None)
    SecretsFilter().filter(record)
    sys.stderr.write(JsonFormatter().format(record) + "\n")
    sys.stderr.flush()


def json_requested(argv: list[str], environ: dict[str, str] | Any) -> bool:
    """Whether a command line (or DBCLUSTER_LOG_FORMAT) asks for JSON logs, read before the
    command parses its options (for what is said before that)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--log-format=json" or (
            arg == "--log-format" and i + 1 < len(argv) and argv[i + 1].lower() == "json"
        ):
            return True
    return str(environ.get("DBCLUSTER_LOG_FORMAT", "")).lower() == "json"
