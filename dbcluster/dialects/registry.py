"""Picks the query provider for a URL, an engine, a dialect or a provider name.

Built-in providers are keyed by name, in the manner of Alembic's implementation registry; third
parties add theirs through the ``dbcluster.dialects`` entry-point group (name = the provider's
``name``, value = ``module:ProviderClass``).

There is one answer per database, wherever it is asked: a URL goes to the provider registered
under its scheme, else to the one whose ``sqlalchemy_names`` has the URL's dialect name; every
provider built here is bound to its dialect instance, so the column types of the tables compile
with the provider that was chosen (even when its dialect's name is also another provider's); a
dialect met without a binding goes by its name, and one that no provider serves is an error.
"""

from __future__ import annotations

import functools
import importlib
import re
import time
import weakref
from importlib.metadata import entry_points
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, NoSuchModuleError

from dbcluster import schema
from dbcluster.dialects.base import POOLER_OPTION, QueryProvider, SessionLimits
from dbcluster.errors import MissingDriverError, UnsupportedBackendError
from dbcluster.masking import safe_url

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
#: The provider chosen for each dialect instance the registry built or met (see the module doc).
_dialect_providers: weakref.WeakKeyDictionary[Dialect, type[QueryProvider]] = (
    weakref.WeakKeyDictionary()
)


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
        f"no dbcluster provider serves the SQLAlchemy dialect {dialect_name!r} (a provider lists "
        f"the dialect names it serves in sqlalchemy_names); supported: {', '.join(known_names())}"
    )


def provider_class_for_dialect(dialect: Dialect) -> type[QueryProvider]:
    """The provider serving a dialect instance: the one the registry chose for it, else the one
    that serves its name. Raises :class:`UnsupportedBackendError` when none does."""
    bound = _dialect_providers.get(dialect)
    if bound is not None:
        return bound
    found = provider_class_for_dialect_name(dialect.name)
    assert found is not None
    return found


# The tables' column types ask the provider of the dialect they compile for: the schema does not
# import the providers, this plugs the one answer in.
schema.use_column_types(provider_class_for_dialect)


def _bind(provider: QueryProvider) -> QueryProvider:
    _dialect_providers[provider.dialect] = type(provider)
    return provider


def parse_url(url: str | URL) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise UnsupportedBackendError(
            f"cannot parse database URL {_safe(url)!r}; expected e.g. "
            "postgresql+psycopg://user@host/db or sqlite:///path/to/file.db"
        ) from exc


#: A URL fit to print: never a password (see :mod:`dbcluster.masking`).
_safe = safe_url


def _provider_class_for_url(url: URL) -> type[QueryProvider]:
    backend = url.get_backend_name()
    if backend in known_names():
        return provider_class(backend)
    found = provider_class_for_dialect_name(backend, missing_ok=True)
    if found is None:
        # A scheme that is an alias of a dialect (its entry point names another dialect class):
        # the provider of the dialect SQLAlchemy will load, as an engine for this URL would say.
        try:
            dialect_name = url.get_dialect().name
        except (NoSuchModuleError, ImportError):
            dialect_name = None
        if dialect_name is not None:
            found = provider_class_for_dialect_name(dialect_name, missing_ok=True)
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
        driver = url.drivername.partition("+")[2] or None
        raise MissingDriverError(
            f"SQLAlchemy cannot load the dialect for {_safe(url)}; "
            f"{provider.driver_install_hint(driver)}"
        ) from exc


#: The library a failed ``dlopen`` names: "libodbc.so.2: cannot open shared object file",
#: "Library not loaded: libodbc.2.dylib", "DLL load failed ... odbc32.dll".
_SHARED_LIBRARY = re.compile(r"(lib[\w+-]+\.(?:so|dylib)[\w.]*|[\w-]+\.dll)")


def check_driver(url: URL, provider: type[QueryProvider]) -> None:
    """Fail with the pip command to run when the URL's driver is not installed, or with the
    system library to install when the driver is there but cannot load it."""
    dialect_class = _dialect_class(url, provider)
    driver = url.get_driver_name()
    try:
        dialect_class.import_dbapi()
    except ImportError as exc:
        library = _SHARED_LIBRARY.search(str(exc))
        if library is not None and not isinstance(exc, ModuleNotFoundError):
            name = library.group(1)
            hints = provider.system_libraries.items()
            what = next(
                (how for prefix, how in hints if name.startswith(prefix)),
                "the operating system package that provides it",
            )
            raise MissingDriverError(
                f"the driver {driver!r} for {provider.name} is installed but cannot load the "
                f"system library {name}; install {what}"
            ) from exc
        installed = _installed_driver(url, provider) if "+" not in url.drivername else None
        if installed is not None:
            # mysql:// means SQLAlchemy's default (mysqlclient); the extra the docs name
            # installed another: the URL is what to change, not what to install.
            raise MissingDriverError(
                f"the driver {driver!r} that {url.drivername}:// means is not installed, but "
                f"{installed!r} is: use {url.drivername}+{installed}:// in the URL"
            ) from exc
        raise MissingDriverError(
            f"the driver {driver!r} for {provider.name} is not installed; "
            f"{provider.driver_install_hint(driver)}"
        ) from exc


def _installed_driver(url: URL, provider: type[QueryProvider]) -> str | None:
    """Another of the provider's drivers for the URL's database that imports, if any."""
    for driver in provider.drivers:
        try:
            url.set(drivername=f"{url.drivername}+{driver}").get_dialect().import_dbapi()
        except (NoSuchModuleError, ImportError):
            continue
        return driver
    return None


def provider_for_url(
    url: str | URL, server_version: tuple[int, ...] | None = None
) -> QueryProvider:
    """A provider instance for a URL, with the URL's own dialect made fit to compile statements
    and DDL without a server for ``server_version`` (default: the oldest the provider supports;
    :meth:`QueryProvider.offline_dialect`); no connection is made."""
    parsed = parse_url(url)
    provider = _provider_class_for_url(parsed)
    return _bind(
        provider(_offline_dialect(provider, _dialect_class(parsed, provider), server_version))
    )


def provider_for_name(name: str, server_version: tuple[int, ...] | None = None) -> QueryProvider:
    """A provider instance for a provider name, with a dialect fit to compile statements for
    ``server_version`` (default: the oldest the provider supports)."""
    provider = provider_class(name)
    dialect_class = _dialect_class(make_url(provider.example_url), provider)
    return _bind(provider(_offline_dialect(provider, dialect_class, server_version)))


def _offline_dialect(
    provider: type[QueryProvider],
    dialect_class: type[Dialect],
    server_version: tuple[int, ...] | None,
) -> Dialect:
    oldest = provider.min_server_version
    if server_version is not None and oldest and server_version < oldest:
        raise UnsupportedBackendError(
            f"dbcluster supports {provider.name} {_version(oldest)} and later, "
            f"not {_version(server_version)}"
        )
    if server_version is None:
        # A third party's hook may predate the server_version argument.
        return provider.offline_dialect(dialect_class)
    return provider.offline_dialect(dialect_class, server_version)


def _version(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def make_engine(
    url: str | URL,
    *,
    coordination: bool = False,
    limits: SessionLimits | None = None,
    autocommit: bool = False,
    ping: bool = True,
    **kwargs: Any,
) -> Engine:
    """``create_engine`` with what the URL's database needs (pragmas, isolation, pool checks),
    after checking that the provider and driver exist. ``coordination`` marks a node's own
    engine for its short coordination statements; ``limits`` bounds every session's lock waits
    and idle transactions (see :class:`~dbcluster.dialects.base.SessionLimits`); ``autocommit``
    makes every statement commit on its own (only where the provider ``supports_autocommit``);
    ``ping`` checks a pooled connection of a network database that sat idle for a while
    before handing it out (see :attr:`~dbcluster.dialects.base.QueryProvider.ping_idle_after_s`)."""
    parsed = parse_url(url)
    provider_cls = _provider_class_for_url(parsed)
    check_driver(parsed, provider_cls)
    provider = provider_cls(_dialect_class(parsed, provider_cls)())
    provider.read_url_options(parsed)
    # A connection goes back to the pool rolled back only if it has a transaction open (see
    # _reset_when_needed): SQLAlchemy's own reset rolls back after every COMMIT, a round trip
    # with drivers that do not check first.
    options: dict[str, Any] = {"pool_reset_on_return": None, **provider.engine_options()}
    chosen = {**options, **kwargs}
    if provider.network_backend and "poolclass" not in chosen and "pool" not in chosen:
        # The connection used last goes out first: a few hot connections carry the work, with
        # their server-side prepared statements and cached plans (a driver prepares a statement
        # on its fifth use on a connection; PostgreSQL plans it afresh for five more), and the
        # others sit idle until the pool or the server closes them. First in, first out spreads
        # every statement over every pooled connection: a claim planned afresh each time.
        options["pool_use_lifo"] = True
    if autocommit:
        if not provider.supports_autocommit:
            raise UnsupportedBackendError(f"{provider.name} has no autocommit engine")
        options.update(provider.autocommit_engine_options())
    if limits is not None:
        extra = provider.session_engine_options(limits)
        connect_args = {**options.get("connect_args", {}), **extra.pop("connect_args", {})}
        options.update(extra)
        if connect_args:
            options["connect_args"] = connect_args
    options.update(kwargs)
    engine = create_engine(parsed, **options)
    provider.dialect = engine.dialect
    provider.limits = limits
    if autocommit:
        provider.configure_engine(engine, coordination=coordination, autocommit=True)
    else:
        provider.configure_engine(engine, coordination=coordination)
    if ping and provider.network_backend and not kwargs.get("pool_pre_ping"):
        _ping_when_idle(engine, provider.ping_idle_after_s)
    if options.get("pool_reset_on_return", "rollback") is None and not autocommit:
        _reset_when_needed(engine, provider)
    if limits is not None and provider.needs_session_hook(limits):
        event.listen(
            engine,
            "connect",
            lambda dbapi_connection, _record: provider.configure_session(dbapi_connection, limits),
        )

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Dialect, _record: Any, cargs: Any, cparams: Any) -> Any:
        # Connects as SQLAlchemy would, so that a failure the user must mend outside dbcluster
        # (some, like PyMySQL's missing-package RuntimeError, are not driver errors at all)
        # becomes one clear line.
        cparams.pop(POOLER_OPTION, None)  # dbcluster's own (read_url_options), not the driver's
        try:
            return provider.connect(dialect, cargs, cparams)
        except Exception as exc:
            hint = provider.connect_error_hint(exc)
            if hint:
                raise MissingDriverError(hint) from exc
            raise

    _engine_providers[engine] = _bind(provider)
    return engine


def _ping_when_idle(engine: Engine, after_s: float) -> None:
    """Ping a pooled connection on checkout only when it sat idle for ``after_s`` or longer: a
    connection used moments ago costs no extra round trip (``pool_pre_ping`` pings every
    checkout). A failed ping makes the pool replace the connection."""

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["dbcluster_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("dbcluster_idle_since", None)
        if since is None or time.monotonic() - since < after_s:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # noqa: BLE001 - the pool replaces it and tries again
            raise DisconnectionError(f"a pooled connection failed its ping: {exc}") from exc


def _reset_when_needed(engine: Engine, provider: QueryProvider) -> None:
    """Roll back a connection coming back to the pool unless SQLAlchemy just ended its
    transaction or the driver says none is open (SQLAlchemy's "custom reset" recipe)."""

    @event.listens_for(engine, "reset")
    def _reset(dbapi_connection: Any, _record: Any, state: Any) -> None:
        if state.terminate_only or state.transaction_was_reset:
            return
        if provider.in_transaction(dbapi_connection) is False:
            return
        dbapi_connection.rollback()


def get_provider(engine: Engine) -> QueryProvider:
    """The provider for an engine (the one it was made with, or one chosen from its dialect)."""
    provider = _engine_providers.get(engine)
    if provider is None:
        provider = _provider_class_for_url(engine.url)(engine.dialect)
        provider.read_url_options(engine.url)
        provider = _bind(provider)
        _engine_providers[engine] = provider
    return provider
