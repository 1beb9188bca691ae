"""Wake-ups: a placement wakes the nodes it placed partitions on, where the database has
``LISTEN``/``NOTIFY`` (``supports_listen_notify``); elsewhere nodes poll. The base has none of
these statements (each raises, or answers None); a provider with notifications overrides
``notify``, ``notify_parameter``, ``open_listener`` and, for a wake-up that rides on the
statement creating a partition, ``notify_from``.
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import Engine, Select

from dbcluster.dialects.family import StatementFamily


class Listener(Protocol):
    """A connection listening for wake-ups (see :meth:`QueryProvider.open_listener`)."""

    def wait(self, timeout: float) -> list[str] | None:
        """Block up to ``timeout`` seconds; the payloads of the notifications that arrived
        (empty strings for those without one), or None when none did."""
        ...

    def close(self) -> None: ...


class WakeUpStatements(StatementFamily):
    """The wake-ups' statements and listening connection."""

    def wake_channel(self, node_id: str) -> str:
        """The notification channel a node listens on: an identifier derived from its id."""
        import hashlib

        return "dbcluster_" + hashlib.sha1(node_id.encode()).hexdigest()[:24]

    def notify(self, channels: Any, payloads: Any = None) -> Any:
        """One statement that wakes the listeners of every channel in ``channels`` (a parameter
        made by :meth:`notify_parameter`) once its transaction commits (only where
        :attr:`supports_listen_notify`); with ``payloads`` (a parameter of the same kind, one
        text per channel, at most :attr:`notify_payload_max` bytes) each carries its own."""
        raise NotImplementedError(f"{self.name} has no LISTEN/NOTIFY")

    def notify_parameter(self, name: str) -> Any:
        """The bound parameter :meth:`notify` takes its list of channels (or payloads) in."""
        raise NotImplementedError(f"{self.name} has no LISTEN/NOTIFY")

    def notify_from(self, source: Any, channel: Any, payload: Any) -> Select[Any] | None:
        """A read that wakes ``channel`` with ``payload`` (expressions of ``source``, a
        statement's new row) once per row of ``source``, for a statement that places one
        partition as it creates its step execution; None where the database cannot."""
        return None

    def open_listener(self, engine: Engine, channel: str) -> Listener:
        """A connection of its own listening on ``channel`` (only where
        :attr:`supports_listen_notify`)."""
        raise NotImplementedError(f"{self.name} has no LISTEN/NOTIFY")
