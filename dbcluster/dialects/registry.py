"""Picks the query provider for a URL, an engine or a dialect name.

Built-in providers are keyed by name, in the manner of Alembic's implementation registry; third
parties add theirs through the ``dbcluster.dialects`` entry-point group (name = the provider's
``name``, value = ``module:ProviderClass``).
"""

from __future__ import annotations

import functools
import importlib
import weakref
from importlib.metadata import entry_points
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from dbcluster.dialects.base import QueryProvider
from dbcluster.errors import MissingDriverError, UnsupportedBackendError

ENTRY_POINT_GROUP = "dbcluster.dialects"

_BUILTIN: dict[str, str] = {
    "postgresql": "dbcluster.dialects.postgresql:PostgreSQLProvider",
    "mysql": "dbcluster.dialects.mysql:MySQLProvider",
    "mariadb": "dbcluster.dialects.mysql:MariaDBProvider",
    "oracle": "dbcluster.dialects.oracle:OracleProvider",
    "mssql": "dbcluster.dialects.mssql:MSSQLProvider",
    "db2": "dbcluster.dialects.db2:Db2Provider",
    "sqlite": "dbcluster.dialects.sqlite:SQLiteProvider",
}
BUILTIN_NAMES: tuple[str, ...] = tuple(_BUILTIN)

_classes: dict[str, type[QueryProvider]] = {}
_engine_providers: weakref.WeakKeyDictionary[Engine, QueryProvider] = weakref.WeakKeyDictionary()


def _load(target: str) -> type[QueryProvider]:
    module_name, _, attr = target.partition(":")
    provider_class = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(provider_class, type) and issubclass(provider_class, QueryProvider)):
        raise UnsupportedBackendError(f"{target} is not a dbcluster QueryProvider subclass")
    return provider_class


@functools.cache
def _third_party() -> dict[str, Any]:
    """Entry points are read once per process (scanning them is slow and they do not change)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_names() -> list[str]:
    return list(BUILTIN_NAMES) + sorted(set(_third_party()) - set(BUILTIN_NAMES))


def provider_class(name: str) -> type[QueryProvider]:
    """The provider class registered under ``name`` (built-in or entry point)."""
    if name in _classes:
        return _classes[name]
    if name in _BUILTIN:
        found = _load(_BUILTIN[name])
    else:
        third_party = _third_party()
        if name not in third_party:
            raise UnsupportedBackendError(
                f"no dbcluster provider for {name!r}; supported: {', '.join(known_names())}"
            )
        found = third_party[name].load()
        if not (isinstance(found, type) and issubclass(found, QueryProvider)):
            raise UnsupportedBackendError(
                f"entry point {name!r} in {ENTRY_POINT_GROUP} is not a QueryProvider subclass"
            )
    _classes[name] = found
    return found


def provider_class_for_dialect_name(
    dialect_name: str, *, missing_ok: bool = False
) -> type[QueryProvider] | None:
    """The provider serving a SQLAlchemy dialect name (``engine.dialect.name``)."""
    for name in known_names():
        try:
            candidate = provider_class(name)
        except (ImportError, UnsupportedBackendError):
            continue
        if dialect_name in candidate.sqlalchemy_names or dialect_name == candidate.name:
            return candidate
    if missing_ok:
        return None
    raise UnsupportedBackendError(
        f"no dbcluster provider for the SQLAlchemy dialect {dialect_name!r}; "
        f"supported: {', '.join(known_names())}"
    )


def parse_url(url: str | URL) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise UnsupportedBackendError(
            f"cannot parse database URL {_safe(url)!r}; expected e.g. "
            "postgresql+psycopg://user@host/db or sqlite:///path/to/file.db"
        ) from exc


def _safe(url: str | URL) -> str:
    """A URL fit to print: never the password."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - unparseable: print only what precedes the credentials
        scheme, sep, _ = str(url).partition("://")
        return f"{scheme}{sep}..." if sep else str(url)


safe_url = _safe


def _provider_class_for_url(url: URL) -> type[QueryProvider]:
    backend = url.get_backend_name()
    if backend in known_names():
        return provider_class(backend)
    found = provider_class_for_dialect_name(backend, missing_ok=True)
    if found is None:
        raise UnsupportedBackendError(
            f"unsupported database {backend!r} in {_safe(url)}; "
            f"supported: {', '.join(known_names())}"
        )
    return found


def _dialect_class(url: URL, provider: type[QueryProvider]) -> type[Dialect]:
    try:
        return url.get_dialect()
    except NoSuchModuleError as exc:
        extra = next(iter(provider.drivers.values()), provider.name)
        raise MissingDriverError(
            f"SQLAlchemy cannot load the dialect for {_safe(url)}; "
            f"install it with: pip install 'dbcluster[{extra}]'"
        ) from exc


def check_driver(url: URL, provider: type[QueryProvider]) -> None:
    """Fail with the pip command to run when the URL's driver is not installed."""
    dialect_class = _dialect_class(url, provider)
    try:
        dialect_class.import_dbapi()
    except ImportError as exc:
        driver = url.get_driver_name()
        extra = provider.drivers.get(driver, provider.name)
        raise MissingDriverError(
            f"the driver {driver!r} for {provider.name} is not installed; "
            f"install it with: pip install 'dbcluster[{extra}]'"
        ) from exc


def provider_for_url(url: str | URL) -> QueryProvider:
    """A provider instance for a URL, with the URL's own dialect (no connection made)."""
    parsed = parse_url(url)
    provider = _provider_class_for_url(parsed)
    return provider(_dialect_class(parsed, provider)())


def provider_for_name(name: str) -> QueryProvider:
    """A provider instance for a provider name, with a dialect fit to compile statements."""
    provider = provider_class(name)
    dialect_class = _dialect_class(make_url(provider.example_url), provider)
    return provider(provider.offline_dialect(dialect_class))


def make_engine(url: str | URL, *, coordination: bool = False, **kwargs: Any) -> Engine:
    """``create_engine`` with what the URL's database needs (pragmas, isolation, pool checks),
    after checking that the provider and driver exist. ``coordination`` marks a node's own
    engine for its short coordination statements."""
    parsed = parse_url(url)
    provider_cls = _provider_class_for_url(parsed)
    check_driver(parsed, provider_cls)
    provider = provider_cls(_dialect_class(parsed, provider_cls)())
    options = {**provider.engine_options()}
    if coordination:
        extra = provider.coordination_engine_options()
        connect_args = {**options.get("connect_args", {}), **extra.pop("connect_args", {})}
        options.update(extra)
        if connect_args:
            options["connect_args"] = connect_args
    options.update(kwargs)
    engine = create_engine(parsed, **options)
    provider.dialect = engine.dialect
    provider.configure_engine(engine, coordination=coordination)
    _engine_providers[engine] = provider
    return engine


def get_provider(engine: Engine) -> QueryProvider:
    """The provider for an engine (the one it was made with, or one chosen from its dialect)."""
    provider = _engine_providers.get(engine)
    if provider is None:
        by_url = engine.url.get_backend_name()
        provider_cls = (
            provider_class(by_url)
            if by_url in known_names()
            else provider_class_for_dialect_name(engine.dialect.name)
        )
        assert provider_cls is not None
        provider = provider_cls(engine.dialect)
        _engine_providers[engine] = provider
    return provider
