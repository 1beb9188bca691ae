"""The errors a user can cause. The CLI prints their message on one line and exits 2."""

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
