"""IN lists every supported database accepts.

Oracle refuses more than 1,000 expressions in one list (ORA-01795) and SQL Server more than 2,100
parameters in one statement (error 8003), so a list whose length depends on the data is sent in
slices: every such ``column.in_(...)`` in dbcluster takes its values from :func:`in_batches`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: Values in one IN list: under both limits, with room for the statement's other parameters.
IN_LIST_MAX = 500


def in_batches(items: Iterable[T], size: int = IN_LIST_MAX) -> Iterator[list[T]]:
    """``items`` in consecutive slices of at most ``size`` (never more than :data:`IN_LIST_MAX`);
    nothing for no items."""
    if size < 1:
        raise ValueError(f"an IN-list slice holds at least one value, not {size}")
    size = min(size, IN_LIST_MAX)
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
