"""Wake-ups: in the transaction that places work on nodes, a notification to each (where the
database has LISTEN/NOTIFY), naming what was placed; the notifier reads it back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from dbcluster.cluster.store.connector import Connector


def offer_payload(step_execution_ids: Iterable[int], limit: int) -> str:
    """A wake-up's payload: the ids placed on the node, comma-separated, as many as fit in
    ``limit`` bytes (the node polls for the rest)."""
    text = ""
    for sid in step_execution_ids:
        item = f"{text and ','}{int(sid)}"
        if len(text) + len(item) > limit:
            break
        text += item
    return text


def offered_ids(payload: str) -> list[int]:
    """The step execution ids a wake-up's payload names (none for an empty or foreign one)."""
    ids = []
    for item in payload.split(","):
        item = item.strip()
        if item.isdigit():
            ids.append(int(item))
    return ids


class WakeUps(Connector):
    """Notifications sent with the transactions that place partitions."""

    def wake_nodes(
        self,
        conn: Connection,
        node_ids: Iterable[str],
        placed: Mapping[str, Sequence[int]] | None = None,
        offers: Mapping[str, str] | None = None,
    ) -> None:
        """In the caller's transaction (which placed work on them): wake these nodes' pollers
        when it commits, where the database has LISTEN/NOTIFY (elsewhere they poll). With
        ``placed`` (node -> step execution ids placed on it), each wake-up names what it
        placed, as many as fit: the node claims those without polling first. ``offers``: the
        payload of a node's wake-up where it carries the partitions' executions (see
        :mod:`dbcluster.cluster.offers`)."""
        provider = self.provider
        if not provider.supports_listen_notify:
            return
        woken = sorted(set(node_ids))
        if not woken:
            return
        if placed is None or not provider.notify_payload_max:
            stmt = self.prepared(
                "notify", lambda: provider.notify(provider.notify_parameter("b_channels"))
            )
            conn.execute(stmt, {"b_channels": [provider.wake_channel(n) for n in woken]})
            return
        conn.execute(self.notify_with_offers(), self.offer_parameters(woken, placed, offers))

    def notify_with_offers(self) -> Any:
        provider = self.provider
        return self.prepared(
            "notify with offers",
            lambda: provider.notify(
                provider.notify_parameter("b_channels"), provider.notify_parameter("b_payloads")
            ),
        )

    def offer_parameters(
        self,
        woken: Sequence[str],
        placed: Mapping[str, Sequence[int]],
        offers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The parameters of a wake-up of each node of ``woken`` naming what was placed on it
        (``offers``: a node's payload where it carries the executions too)."""
        provider = self.provider
        offers = offers or {}
        return {
            "b_channels": [provider.wake_channel(node_id) for node_id in woken],
            "b_payloads": [
                offers.get(node_id)
                or offer_payload(placed.get(node_id, ()), provider.notify_payload_max)
                for node_id in woken
            ],
        }
