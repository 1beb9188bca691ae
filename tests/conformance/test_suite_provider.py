"""The conformance suite's provider contract, on every backend of the matrix."""

from dbcluster.testing.suite.test_provider import *  # noqa: F403
