"""Writers made of writers: all of them in turn, or one per item by a classifier."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.items.base import is_stream
from dbcluster.batch.scope import ChunkContext


class _Delegating:
    """Opens, updates and closes the delegates that are streams (each keeps its own position
    under its own name in the step context)."""

    def __init__(self, delegates: Sequence[Any]) -> None:
        for writer in delegates:
            if not callable(getattr(writer, "write", None)):
                raise TypeError(f"{writer!r} has no write() method")
        self._streams = [w for w in delegates if is_stream(w)]

    def open(self, context: ExecutionContext) -> None:
        for stream in self._streams:
            stream.open(context)

    def update(self, context: ExecutionContext) -> None:
        for stream in self._streams:
            stream.update(context)

    def close(self) -> None:
        errors = []
        for stream in reversed(self._streams):
            try:
                stream.close()
            except Exception as error:  # noqa: BLE001 - close the others, then raise the first
                errors.append(error)
        if errors:
            raise errors[0]


class CompositeItemWriter(_Delegating):
    """Writes each chunk with every writer in turn, in the same transaction: all commit
    together or none does."""

    def __init__(self, writers: Sequence[Any]) -> None:
        if not writers:
            raise ValueError("a composite writer needs at least one writer")
        super().__init__(writers)
        self.writers = list(writers)

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        for writer in self.writers:
            writer.write(items, ctx)


class ClassifierItemWriter(_Delegating):
    """Sends each item to the writer ``classifier(item)`` names in ``writers`` (Spring's
    ``ClassifierCompositeItemWriter``); each writer gets its items of the chunk in their order,
    in the chunk's transaction. An item whose key names no writer goes to ``default``, or fails
    the chunk."""

    def __init__(
        self,
        classifier: Callable[[Any], Hashable],
        writers: Mapping[Hashable, Any],
        *,
        default: Any = None,
    ) -> None:
        delegates = [*writers.values(), *([default] if default is not None else [])]
        super().__init__(delegates)
        self.classifier = classifier
        self.writers = dict(writers)
        self.default = default

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        groups: dict[int, tuple[Any, list[Any]]] = {}
        for item in items:
            key = self.classifier(item)
            writer = self.writers.get(key, self.default)
            if writer is None:
                raise KeyError(f"no writer for items classified {key!r} (and no default)")
            groups.setdefault(id(writer), (writer, []))[1].append(item)
        for writer, group in groups.values():
            writer.write(group, ctx)
