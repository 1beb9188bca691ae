"""The reader / processor / writer / stream protocols of chunk steps."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.scope import ChunkContext


@runtime_checkable
class ItemReader(Protocol):
    """``read()`` returns the next item, or None when the input is exhausted."""

    def read(self) -> Any: ...


@runtime_checkable
class ItemProcessor(Protocol):
    """``process(item)`` returns the item to write, or None to filter it out."""

    def process(self, item: Any) -> Any: ...


@runtime_checkable
class ItemWriter(Protocol):
    """``write(items, ctx)`` writes one chunk inside the chunk's transaction
    (``ctx.connection``)."""

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None: ...


@runtime_checkable
class ItemStream(Protocol):
    """A reader/writer that keeps its position in the step's execution context.

    ``open(ctx)`` restores the position saved by an earlier run (if any); ``update(ctx)`` saves
    the current position, inside the chunk's transaction just before commit; ``close()`` releases
    resources.
    """

    def open(self, context: ExecutionContext) -> None: ...

    def update(self, context: ExecutionContext) -> None: ...

    def close(self) -> None: ...


class FunctionItemWriter:
    """An :class:`ItemWriter` around a function ``fn(items, ctx)``."""

    def __init__(self, fn: Callable[[Sequence[Any], ChunkContext], None]) -> None:
        self.fn = fn

    def write(self, items: Sequence[Any], ctx: ChunkContext) -> None:
        self.fn(items, ctx)


def item_writer(fn: Callable[[Sequence[Any], ChunkContext], None]) -> FunctionItemWriter:
    """Decorator: turn ``def write(items, ctx)`` into an item writer."""
    return FunctionItemWriter(fn)


def is_stream(obj: object) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("open", "update", "close"))


def is_code(value: object) -> bool:
    """Whether ``value`` is a function rather than an item: what a writer is given when a
    processor factory was called as if it were the processor. (An object with methods may well
    be an item, so only functions are told apart.)"""
    return isinstance(
        value,
        (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial),
    )


def refuse_code(items: Sequence[Any], writer: object) -> None:
    """Fail loudly when a writer is handed functions instead of items."""
    for item in items:
        if is_code(item):
            raise TypeError(
                f"{type(writer).__name__} was given {item!r}, a function, as an item (is a "
                f"processor factory being called as the processor?)"
            )
