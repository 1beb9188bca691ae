"""The conformance suite's short chaos run (real processes, one of each fault) on each backend."""

from dbcluster.testing.suite.test_processes import *  # noqa: F403
