"""Ready-made partitioners for the common "split by key range" case."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Engine, Table, func, select

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.partition import BasePartitioner


class IntegerRangePartitioner(BasePartitioner):
    """Splits the integer range ``[lo, hi)`` into ``grid_size`` (or ``partitions``) contiguous
    slices. Each context holds ``lo`` and ``hi``; the name is ``"<prefix><lo>-<hi>"``, derived
    from the slice."""

    def __init__(
        self,
        lo: int,
        hi: int,
        *,
        partitions: int | None = None,
        prefix: str = "range-",
        transferable: bool = True,
    ) -> None:
        self.lo = lo
        self.hi = hi
        self.partitions = partitions
        self.prefix = prefix
        self.transferable = transferable

    def partition(self, grid_size: int) -> dict[str, ExecutionContext]:
        count = max(1, self.partitions or grid_size)
        span = self.hi - self.lo
        if span <= 0:
            return {}
        count = min(count, span)
        result: dict[str, ExecutionContext] = {}
        for index in range(count):
            lo = self.lo + span * index // count
            hi = self.lo + span * (index + 1) // count
            result[f"{self.prefix}{lo}-{hi}"] = ExecutionContext({"lo": lo, "hi": hi})
        return result

    def is_transferable(self, name: str, context: ExecutionContext) -> bool:
        return self.transferable


class ColumnRangePartitioner(IntegerRangePartitioner):
    """An :class:`IntegerRangePartitioner` over ``[min(key), max(key) + 1)`` of a table, read when
    partitioning."""

    def __init__(
        self, engine: Engine, table: Table, key: str | Column[Any], **options: Any
    ) -> None:
        super().__init__(0, 0, **options)
        self.engine = engine
        self.table = table
        self.key = table.c[key] if isinstance(key, str) else key

    def partition(self, grid_size: int) -> dict[str, ExecutionContext]:
        with self.engine.connect() as conn:
            lo, hi = conn.execute(select(func.min(self.key), func.max(self.key))).one()
        if lo is None:
            return {}
        self.lo, self.hi = int(lo), int(hi) + 1
        return super().partition(grid_size)
