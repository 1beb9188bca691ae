"""A master places partitions: their PENDING rows and their nodes' wake-ups, in its transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Text, bindparam, cast
from sqlalchemy.engine import Connection

from dbcluster.batch.repository import InsertExtras
from dbcluster.cluster.store.wakeups import WakeUps
from dbcluster.dialects.base import PLACED_COLUMNS, array_parameters
from dbcluster.inlists import in_batches


def _placed_arrays(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Partition rows as the array parameters of ``insert_partitions_from_arrays``."""
    unknown = {name for row in rows for name in row} - set(PLACED_COLUMNS)
    if unknown:
        raise ValueError(f"partition rows name columns a placement does not set: {unknown}")
    return array_parameters(rows, PLACED_COLUMNS)


class Placing(WakeUps):
    """``batch_partitions`` as a placement writes them."""

    def place_partitions(
        self,
        conn: Connection,
        rows: Sequence[dict[str, Any]],
        placed: Mapping[str, Sequence[int]],
        offers: Mapping[str, str] | None = None,
    ) -> None:
        """Insert PENDING partitions and wake the nodes they were placed on (``placed``: node ->
        step execution ids; ``offers``: node -> its wake-up's payload where that carries the
        executions), in the caller's transaction: in one statement where the provider can
        write from arrays and notify in the same statement, else as :meth:`insert_partitions`
        then :meth:`wake_nodes`."""
        provider = self.provider
        arrays = self.prepared(
            "insert partitions from arrays", provider.insert_partitions_from_arrays
        )
        insert_and_notify = None
        if arrays is not None and provider.supports_listen_notify and provider.notify_payload_max:
            insert_and_notify = self.prepared(
                "insert partitions and notify",
                lambda: provider.together(arrays, self.notify_with_offers()),
            )
        if insert_and_notify is None or not placed:
            self.insert_partitions(conn, rows)
            self.wake_nodes(conn, placed.keys(), placed, offers)
            return
        self._prebuilt.rows(
            conn,
            insert_and_notify,
            {**_placed_arrays(rows), **self.offer_parameters(sorted(placed), placed, offers)},
        )

    def lone_partition_placement(
        self, row: Mapping[str, Any], offer: tuple[str, str] | None = None
    ) -> InsertExtras | None:
        """A lone partition's row and the wake-up of its node, to go in the statement that
        creates its step execution (see :class:`~dbcluster.batch.repository.InsertExtras`): ``row``
        as :meth:`place_partitions` takes one, without its step execution's id; ``offer``: the
        wake-up's payload before and after that id where it carries the execution (see
        :func:`dbcluster.cluster.offers.split_around_id`). None where the database cannot wake
        a node from that statement (the partition is then placed by
        :meth:`place_partitions`)."""
        provider = self.provider
        if not (
            provider.supports_writable_cte
            and provider.supports_listen_notify
            and provider.notify_payload_max
        ):
            return None

        def build(step_execution_id: Any, _first_step: Any, source: Any) -> tuple[Any, Any]:
            placed = provider.insert_partition_from(source, step_execution_id)
            # The payload names the one partition, as offer_payload would (between the two
            # parts of a payload that carries its execution; both empty where it does not).
            payload = (
                bindparam("b_offer_head", type_=Text())
                + cast(step_execution_id, Text())
                + bindparam("b_offer_tail", type_=Text())
            )
            wake = provider.notify_from(source, bindparam("b_channel"), payload)
            assert wake is not None, f"{provider.name} wakes nodes, but not from a statement"
            return [placed], wake

        params: dict[str, Any] = {f"b_{name}": None for name in PLACED_COLUMNS}
        params.update({f"b_{name}": value for name, value in row.items()})
        params["b_channel"] = provider.wake_channel(row["assigned_node"])
        params["b_offer_head"], params["b_offer_tail"] = offer or ("", "")
        del params["b_step_execution_id"]
        return InsertExtras("place one, notified", build, params)

    def insert_partitions(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Place PENDING partitions in the caller's transaction, at most the provider's
        ``partition_write_batch`` rows a statement (SQL Server escalates a statement's row
        locks to a table lock past about 5,000)."""
        arrays = self.prepared(
            "insert partitions from arrays", self.provider.insert_partitions_from_arrays
        )
        if arrays is not None and len(rows) > 1:
            conn.execute(arrays, _placed_arrays(rows))
            return
        stmt = self.prepared("insert partitions", self.provider.insert_partitions)
        for batch in in_batches(rows, self.provider.partition_write_batch):
            conn.execute(stmt, batch)
