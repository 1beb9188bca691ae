"""Listener protocols: implement any subset of the methods."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dbcluster.batch.domain import JobExecution, StepExecution
    from dbcluster.batch.status import ExitStatus


class JobListener:
    """Called before and after a job execution (override what you need)."""

    def before_job(self, job_execution: JobExecution) -> None:
        return None

    def after_job(self, job_execution: JobExecution) -> None:
        return None


class StepListener:
    """Called before and after a step execution; ``after_step`` may return an exit status that is
    combined (``and_``) with the step's own."""

    def before_step(self, step_execution: StepExecution) -> None:
        return None

    def after_step(self, step_execution: StepExecution) -> ExitStatus | None:
        return None


class ChunkListener:
    """Around each chunk of a chunk step: ``before_chunk`` before its items are read,
    ``after_chunk`` after its transaction committed, ``after_chunk_error`` when it failed (the
    step then fails, unless a retry or skip takes it on)."""

    def before_chunk(self, step_execution: StepExecution) -> None:
        return None

    def after_chunk(self, step_execution: StepExecution) -> None:
        return None

    def after_chunk_error(self, step_execution: StepExecution, error: BaseException) -> None:
        return None


class ItemReadListener:
    """Around each ``read()`` (``after_read`` is not called at the end of the input)."""

    def before_read(self) -> None:
        return None

    def after_read(self, item: Any) -> None:
        return None

    def on_read_error(self, error: BaseException) -> None:
        return None


class ItemProcessListener:
    """Around each call of the processor (each try, when it is retried); ``result`` None means
    the item was filtered out."""

    def before_process(self, item: Any) -> None:
        return None

    def after_process(self, item: Any, result: Any) -> None:
        return None

    def on_process_error(self, item: Any, error: BaseException) -> None:
        return None


class ItemWriteListener:
    """Around each ``write()``, inside the chunk's transaction (so, repeated with it when a
    transient database error repeats the transaction)."""

    def before_write(self, items: Sequence[Any]) -> None:
        return None

    def after_write(self, items: Sequence[Any]) -> None:
        return None

    def on_write_error(self, error: BaseException, items: Sequence[Any]) -> None:
        return None


class SkipListener:
    """Each skipped item, once, after the transaction that skipped it committed (a chunk that
    rolls back reports nothing)."""

    def on_skip_in_read(self, error: BaseException) -> None:
        return None

    def on_skip_in_process(self, item: Any, error: BaseException) -> None:
        return None

    def on_skip_in_write(self, item: Any, error: BaseException) -> None:
        return None


class RetryListener:
    """Each failed try of a retried operation (an item's processing, a chunk's write):
    ``on_retry`` when it will be tried again (``attempt`` is the try that failed, from 1),
    ``on_retry_exhausted`` when no tries are left."""

    def on_retry(self, error: BaseException, attempt: int) -> None:
        return None

    def on_retry_exhausted(self, error: BaseException, attempts: int) -> None:
        return None


#: Every item-level listener method a chunk step calls.
CHUNK_EVENTS = (
    "before_chunk",
    "after_chunk",
    "after_chunk_error",
    "before_read",
    "after_read",
    "on_read_error",
    "before_process",
    "after_process",
    "on_process_error",
    "before_write",
    "after_write",
    "on_write_error",
    "on_skip_in_read",
    "on_skip_in_process",
    "on_skip_in_write",
    "on_retry",
    "on_retry_exhausted",
)


class ChunkHooks:
    """The listener methods of a chunk step, per event, looked up once: an event without
    listeners costs one truthiness check of an empty tuple."""

    before_chunk: tuple[Callable[..., Any], ...]
    after_chunk: tuple[Callable[..., Any], ...]
    after_chunk_error: tuple[Callable[..., Any], ...]
    before_read: tuple[Callable[..., Any], ...]
    after_read: tuple[Callable[..., Any], ...]
    on_read_error: tuple[Callable[..., Any], ...]
    before_process: tuple[Callable[..., Any], ...]
    after_process: tuple[Callable[..., Any], ...]
    on_process_error: tuple[Callable[..., Any], ...]
    before_write: tuple[Callable[..., Any], ...]
    after_write: tuple[Callable[..., Any], ...]
    on_write_error: tuple[Callable[..., Any], ...]
    on_skip_in_read: tuple[Callable[..., Any], ...]
    on_skip_in_process: tuple[Callable[..., Any], ...]
    on_skip_in_write: tuple[Callable[..., Any], ...]
    on_retry: tuple[Callable[..., Any], ...]
    on_retry_exhausted: tuple[Callable[..., Any], ...]

    def __init__(self, listeners: Sequence[Any]) -> None:
        for event in CHUNK_EVENTS:
            found = tuple(
                fn for listener in listeners if callable(fn := getattr(listener, event, None))
            )
            setattr(self, event, found)


def fire(hooks: tuple[Callable[..., Any], ...], *args: Any) -> None:
    """Call each of ``hooks`` with ``args``."""
    for hook in hooks:
        hook(*args)


def call_listeners(listeners: list[Any], method: str, *args: Any) -> list[Any]:
    """Call ``method`` on every listener that has it; return the results."""
    results = []
    for listener in listeners:
        fn = getattr(listener, method, None)
        if fn is not None:
            results.append(fn(*args))
    return results
