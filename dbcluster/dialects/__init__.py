"""One query provider per database, and the registry that picks one."""

from __future__ import annotations

from dbcluster.dialects.base import QueryProvider
from dbcluster.dialects.registry import (
    BUILTIN_NAMES,
    ENTRY_POINT_GROUP,
    get_provider,
    make_engine,
    provider_class,
    provider_for_name,
    provider_for_url,
    safe_url,
)

__all__ = [
    "BUILTIN_NAMES",
    "ENTRY_POINT_GROUP",
    "QueryProvider",
    "get_provider",
    "make_engine",
    "provider_class",
    "provider_for_name",
    "provider_for_url",
    "safe_url",
]
