"""What a dialect can do, declared once on its provider, and what each suite test needs.

In the manner of SQLAlchemy's ``SuiteRequirements``: a provider's capability flags (class
attributes of :class:`~dbcluster.dialects.QueryProvider`) say what its database can do, and a
suite test that needs a capability is marked ``@requires("name")``; on a provider that lacks it the
test is skipped with the reason, never silently passed.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

#: capability -> (provider flag, what it means when false)
CAPABILITIES: dict[str, tuple[str, str]] = {
    "multiple_processes": (
        "supports_multiple_processes",
        "several operating-system processes cannot share this database",
    ),
    "network": (
        "network_backend",
        "the database is not reached over TCP, so no proxy can cut one node's connection",
    ),
    "create_database": (
        "can_create_database",
        "the server cannot create a scratch database",
    ),
}


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Mark a test as needing the named capabilities."""
    unknown = set(capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {sorted(CAPABILITIES)}")
    return pytest.mark.dbcluster_requires(*capabilities)


def missing(provider: Any, engine: Engine, capabilities: tuple[str, ...]) -> str | None:
    """The reason the provider (on this engine's database) lacks one of the capabilities, or
    None."""
    for name in capabilities:
        flag, meaning = CAPABILITIES[name]
        if not getattr(provider, flag, False):
            return f"provider {provider.name!r} declares {flag} = False: {meaning}"
        if name == "multiple_processes" and provider.private_to_engine(engine):
            return (
                f"provider {provider.name!r} says this database lives inside one engine "
                "(private_to_engine, e.g. in memory), so processes cannot share it"
            )
    return None


def skip_unless_capable(request: pytest.FixtureRequest, provider: Any, engine: Engine) -> None:
    marker = request.node.get_closest_marker("dbcluster_requires")
    if marker is not None:
        reason = missing(provider, engine, tuple(marker.args))
        if reason:
            pytest.skip(reason)
