"""In-memory readers and writers."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.items.base import refuse_code
from dbcluster.batch.scope import ChunkContext


class IterableItemReader:
    """Reads an iterable's items in order. Restartable: it saves how many items it has returned and
    skips that many when reopened (so the iterable must yield the same items again)."""

    def __init__(self, items: Iterable[Any], name: str = "iterable") -> None:
        self.items = items
        self.name = name
        self._iterator: Iterator[Any] | None = None
        self._count = 0

    @property
    def _key(self) -> str:
        return f"{self.name}.read_count"

    def open(self, context: ExecutionContext) -> None:
        self._iterator = iter(self.items)
        self._count = 0
        for _ in range(int(context.get(self._key, 0))):
            if next(self._iterator, _END) is _END:
                break
            self._count += 1

    def read(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self.items)
        item = next(self._iterator, _END)
        if item is _END:
            return None
        self._count += 1
        return item

    def update(self, context: ExecutionContext) -> None:
        context.put(self._key, self._count)

    def close(self) -> None:
        self._iterator = None


class ListItemWriter:
    """Collects written items in memory (thread-safe); handy in tests. Not transactional."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._lock = threading.Lock()

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        refuse_code(items, self)
        with self._lock:
            self.items.extend(items)


_END = object()
