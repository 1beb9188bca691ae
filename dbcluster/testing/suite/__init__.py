"""The dbcluster conformance suite (``pip install 'dbcluster[conformance]'``)::

    pytest -p dbcluster.testing.plugin --pyargs dbcluster.testing.suite --dbcluster-url URL

The plugin (options, fixtures) is opt-in: ``-p dbcluster.testing.plugin``, or
``pytest_plugins = ["dbcluster.testing.plugin"]`` in a project's root ``conftest.py``.

``test_provider`` proves the query provider contract (clock, staleness, registration, guarded
transitions, DDL; the guarded transitions are written in ``claims`` and its helpers in
``provider_helpers``, and collected through ``test_provider``); ``test_statements`` compiles
every statement of the contract, enumerated by introspection (``statements``), with the dialect
of the database under test; ``test_processes`` proves the cluster invariants with real node
processes and real faults (a short chaos run).
A project that runs the suite over its own backend matrix imports these modules' tests
(``from dbcluster.testing.suite.test_provider import *``) and overrides the ``dbc_backend`` fixture.
"""
