"""The conformance suite's compile check of every contract statement, on every backend of the
matrix (with the dialect of the connected engine)."""

from dbcluster.testing.suite.test_statements import *  # noqa: F403
