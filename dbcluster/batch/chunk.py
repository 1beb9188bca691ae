"""Chunk-oriented steps: read, process and write ``chunk_size`` items per transaction."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dbcluster.batch.domain import StepExecution
from dbcluster.batch.exceptions import (
    OptimisticLockingFailureError,
    SkipLimitExceededError,
    StepConfigurationError,
)
from dbcluster.batch.items.base import is_stream
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.step import Step, persist_step

if TYPE_CHECKING:
    from dbcluster.batch.runtime import BatchRuntime

log = logging.getLogger(__name__)

#: A reader/writer/processor instance, or a factory ``fn(step_execution) -> instance`` (step scope:
#: a partition's reader reads its slice from ``step_execution.execution_context``).
Component = Any


def resolve(spec: Component, step_execution: StepExecution, method: str, role: str) -> Any:
    """``spec`` itself if it has ``method``; otherwise the result of calling it as a factory."""
    if spec is None:
        return None
    if not isinstance(spec, type) and callable(getattr(spec, method, None)):
        return spec
    if callable(spec):
        made = spec(step_execution)
        if not callable(getattr(made, method, None)):
            raise StepConfigurationError(
                f"the {role} factory {spec!r} returned {made!r}, which has no {method}() method"
            )
        return made
    raise StepConfigurationError(
        f"{role} {spec!r} must have a {method}() method or be a factory taking the StepExecution"
    )


class ChunkStep(Step):
    """reader -> processor -> writer, ``chunk_size`` items per transaction.

    - ``reader.read()`` returns an item or None at the end.
    - ``processor`` (optional): an object with ``process(item)`` or a callable ``fn(item)``;
      returning None filters the item out.
    - ``writer.write(items, ctx)`` writes a chunk through ``ctx.connection``: the same transaction
      in which the step's counters and context (the readers' positions) are committed.
    - Readers, processors and writers that are streams (``open/update/close``) save their position
      into the step context at each commit and restore it on restart.
    - ``skip_limit`` / ``skippable``: that many items (read, process and write skips together) may
      fail with one of the ``skippable`` exception types and be skipped.
    - ``retry_limit`` / ``retryable``: processing and writing are retried that many times on the
      ``retryable`` exception types (a write retry re-runs the whole chunk transaction).
    """

    def __init__(
        self,
        name: str,
        *,
        reader: Component,
        writer: Component,
        processor: Component = None,
        chunk_size: int = 100,
        skip_limit: int = 0,
        skippable: Sequence[type[BaseException]] = (),
        retry_limit: int = 0,
        retryable: Sequence[type[BaseException]] = (),
        **options: Any,
    ) -> None:
        super().__init__(name, **options)
        if chunk_size < 1:
            raise StepConfigurationError(f"chunk_size must be at least 1, not {chunk_size}")
        self.reader = reader
        self.writer = writer
        self.processor = processor
        self.chunk_size = chunk_size
        self.skip_limit = skip_limit
        self.skippable = tuple(skippable)
        self.retry_limit = retry_limit
        self.retryable = tuple(retryable)

    # --- policy ------------------------------------------------------------------------------

    def _can_skip(self, error: BaseException) -> bool:
        return (
            self.skip_limit > 0
            and isinstance(error, self.skippable)
            and not isinstance(error, OptimisticLockingFailureError)
        )

    def _can_retry(self, error: BaseException, attempt: int) -> bool:
        return (
            attempt < self.retry_limit
            and isinstance(error, self.retryable)
            and not isinstance(error, OptimisticLockingFailureError)
        )

    def _skip(self, se: StepExecution, counter: str, error: BaseException) -> None:
        setattr(se, counter, getattr(se, counter) + 1)
        log.info("step %s skipped an item (%s): %s", se.step_name, counter, error)
        if se.skip_count > self.skip_limit:
            raise SkipLimitExceededError(
                f"step {se.step_name!r} exceeded its skip limit of {self.skip_limit}: {error!r}"
            ) from error

    # --- execution ---------------------------------------------------------------------------

    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        se = step_execution
        reader = resolve(self.reader, se, "read", "reader")
        writer = resolve(self.writer, se, "write", "writer")
        processor = self._resolve_processor(se)
        streams = [c for c in (reader, processor, writer) if c is not None and is_stream(c)]
        write_streams = [c for c in (processor, writer) if c is not None and is_stream(c)]
        opened: list[Any] = []
        try:
            for stream in streams:
                stream.open(se.execution_context)
                opened.append(stream)
            self._run_chunks(se, runtime, reader, processor, writer, streams, write_streams)
        finally:
            for stream in reversed(opened):
                try:
                    stream.close()
                except Exception:  # noqa: BLE001 - closing must not hide the step's outcome
                    log.exception("closing %r failed", stream)

    def _resolve_processor(self, se: StepExecution) -> Any:
        """The processor as given: an object with ``process(item)`` or a callable ``fn(item)``."""
        return self.processor

    def _run_chunks(
        self,
        se: StepExecution,
        runtime: BatchRuntime,
        reader: Any,
        processor: Any,
        writer: Any,
        streams: list[Any],
        write_streams: list[Any],
    ) -> None:
        while not se.terminate_only:
            snapshot = se.snapshot()
            try:
                items, exhausted = self._read_chunk(se, reader)
                if not items and se.read_skip_count == snapshot["read_skip_count"]:
                    return
                outputs = self._process_chunk(se, processor, items)
                self._write_chunk(se, runtime, writer, outputs, streams, write_streams)
            except Exception:
                rollbacks = se.rollback_count
                se.restore(snapshot)
                se.rollback_count = max(rollbacks, snapshot["rollback_count"] + 1)
                raise
            if exhausted:
                return

    def _read_chunk(self, se: StepExecution, reader: Any) -> tuple[list[Any], bool]:
        items: list[Any] = []
        while len(items) < self.chunk_size:
            try:
                item = reader.read()
            except Exception as error:
                if self._can_skip(error):
                    self._skip(se, "read_skip_count", error)
                    continue
                raise
            if item is None:
                return items, True
            se.read_count += 1
            items.append(item)
        return items, False

    def _process_chunk(self, se: StepExecution, processor: Any, items: list[Any]) -> list[Any]:
        if processor is None:
            return items
        process = processor.process if hasattr(processor, "process") else processor
        outputs = []
        for item in items:
            attempt = 0
            while True:
                try:
                    result = process(item)
                    break
                except Exception as error:
                    if self._can_retry(error, attempt):
                        attempt += 1
                        continue
                    if self._can_skip(error):
                        self._skip(se, "process_skip_count", error)
                        result = _SKIPPED
                        break
                    raise
            if result is _SKIPPED:
                continue
            if result is None:
                se.filter_count += 1
                continue
            outputs.append(result)
        return outputs

    def _commit(
        self, se: StepExecution, runtime: BatchRuntime, streams: list[Any], conn: Any
    ) -> None:
        for stream in streams:
            stream.update(se.execution_context)
        se.commit_count += 1
        persist_step(se, runtime, conn)

    def _write_chunk(
        self,
        se: StepExecution,
        runtime: BatchRuntime,
        writer: Any,
        outputs: list[Any],
        streams: list[Any],
        write_streams: list[Any],
    ) -> None:
        attempt = 0
        while True:
            before = se.snapshot()
            try:
                with runtime.repository.engine.begin() as conn:
                    if outputs:
                        writer.write(outputs, ChunkContext(conn, se, runtime))
                    se.write_count += len(outputs)
                    self._commit(se, runtime, streams, conn)
                return
            except Exception as error:
                se.restore(before)
                se.rollback_count += 1
                if self._can_retry(error, attempt):
                    attempt += 1
                    continue
                if self._can_skip(error) and len(outputs) > 0:
                    self._scan(se, runtime, writer, outputs, streams, write_streams)
                    return
                raise

    def _scan(
        self,
        se: StepExecution,
        runtime: BatchRuntime,
        writer: Any,
        outputs: list[Any],
        streams: list[Any],
        write_streams: list[Any],
    ) -> None:
        """Write a failed chunk item by item, one transaction each, skipping the bad items.

        Like Spring Batch's scan, the items written here commit before the reader's position does,
        so a crash in the middle of a scan may write some of them twice on restart.
        """
        for item in outputs:
            before = se.snapshot()
            try:
                with runtime.repository.engine.begin() as conn:
                    writer.write([item], ChunkContext(conn, se, runtime))
                    se.write_count += 1
                    for stream in write_streams:
                        stream.update(se.execution_context)
                    persist_step(se, runtime, conn)
            except Exception as error:
                se.restore(before)
                se.rollback_count += 1
                if self._can_skip(error):
                    self._skip(se, "write_skip_count", error)
                    continue
                raise
        with runtime.repository.engine.begin() as conn:
            self._commit(se, runtime, streams, conn)


_SKIPPED = object()
