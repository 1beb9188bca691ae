"""Deprecated: moved to :mod:`dbcluster.cli.options` (this alias goes in a later release)."""

from __future__ import annotations

import warnings

from dbcluster.cli.options import (
    DURATION_MS,
    DURATION_S,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Duration,
    chosen_level,
    log_options,
)

__all__ = [
    "DURATION_MS",
    "DURATION_S",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "Duration",
    "chosen_level",
    "log_options",
]

warnings.warn(
    "dbcluster.cli_options moved to dbcluster.cli.options; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
