"""The node's maintainers: one periodic service each, built from the coordination store, the
settings and the events (never from a Node), acting under the identity ``usable_identity()``
returns (None: not now)."""
