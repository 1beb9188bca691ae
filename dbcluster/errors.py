"""The errors a user can cause. The CLI prints their message on one line and exits 2 (3 for
:class:`DatabaseUnreachableError`)."""

from __future__ import annotations


class DbclusterError(Exception):
    """Base of every error dbcluster raises on purpose: the message says what to do."""


class ConfigurationError(DbclusterError):
    """A setting, URL or argument that cannot work."""


class UnsupportedBackendError(ConfigurationError):
    """The URL names a database no registered provider speaks."""


class MissingDriverError(ConfigurationError):
    """The URL's driver package is not installed."""


class SchemaMissingError(DbclusterError):
    """The dbcluster tables do not exist in the database."""


class DatabaseUnreachableError(DbclusterError):
    """The database did not answer."""


class SchemaVersionError(DbclusterError):
    """The dbcluster tables are of another schema version than this dbcluster's."""


def unreachable(url: object, error: BaseException) -> DatabaseUnreachableError:
    """The one-line error for a database that did not answer: the URL and the driver's first
    line, both without a password."""
    from dbcluster.masking import safe_url

    return DatabaseUnreachableError(f"cannot connect to {safe_url(url)}: {reason_of(error)}")  # type: ignore[arg-type]


def reason_of(error: BaseException) -> str:
    """The first line of the driver's message for a database error (SQLAlchemy's wrapper
    left out), without a password."""
    from dbcluster.masking import mask_secrets

    orig = getattr(error, "orig", None)
    lines = str(orig if orig is not None else error).strip().splitlines()
    return mask_secrets(lines[0]) if lines else type(error).__name__
