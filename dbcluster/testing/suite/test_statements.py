"""Every statement of the provider contract compiles with the dialect of the database under test.

The contract's methods are enumerated by introspection (:mod:`dbcluster.testing.suite.statements`):
a method added to :class:`~dbcluster.dialects.QueryProvider` is compiled here the day it is
written, with the dialect the connected engine uses (the server's version as it reported it), and
one that does not compile fails with its name. A provider's own further methods are its own.
"""

from __future__ import annotations

from typing import Any

from dbcluster.testing.suite.statements import CALLS, provider_methods, render_all

__all__ = ["test_every_statement_of_the_contract_compiles_on_this_database"]


def test_every_statement_of_the_contract_compiles_on_this_database(dbc_backend: Any) -> None:
    provider = dbc_backend.provider
    rendered = render_all(provider, contract_only=True)
    assert set(rendered) == provider_methods(type(provider), contract_only=True) & set(CALLS)
    assert sum(len(found.sql) for found in rendered.values()) > 100
