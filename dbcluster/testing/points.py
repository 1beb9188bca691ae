"""The fault points, under the name tests used before they moved to :mod:`dbcluster.points`
(the engine reaches them there, without importing the test package). Same functions, same
handlers: installing one here arms the engine's point."""

from __future__ import annotations

from dbcluster.points import Handler, Parking, install, parked, reach, remove

__all__ = ["Handler", "Parking", "install", "parked", "reach", "remove"]
