"""Chunk-oriented steps: read, process and write ``chunk_size`` items per transaction."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from dbcluster.batch.domain import StepExecution
from dbcluster.batch.exceptions import (
    OptimisticLockingFailureError,
    SkipLimitExceededError,
    StepConfigurationError,
)
from dbcluster.batch.items.base import is_code, is_stream
from dbcluster.batch.listeners import ChunkHooks, fire
from dbcluster.batch.policy import Backoff, SkipPolicy
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.step import Step, commit_step

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


def step_scope(factory: Any) -> Any:
    """Mark ``factory`` as a factory ``fn(step_execution) -> component`` (like Spring's
    ``@StepScope``): needed only for a processor factory whose parameter is neither named
    ``step_execution`` nor annotated :class:`StepExecution`, since a processor may also be a plain
    function of the item."""
    factory.__dbcluster_step_scope__ = True
    return factory


def _is_factory(fn: Any) -> bool:
    """Whether a callable processor is a factory taking the StepExecution rather than a function
    of the item: marked with :func:`step_scope`, or its first parameter is named
    ``step_execution`` or annotated ``StepExecution``."""
    if getattr(fn, "__dbcluster_step_scope__", False):
        return True
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: a function of the item
        return False
    if not parameters:
        return False
    first = parameters[0]
    annotation = first.annotation
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return first.name == "step_execution" or named.rsplit(".", 1)[-1] == "StepExecution"


def resolve_processor(spec: Component, step_execution: StepExecution) -> Any:
    """The processor: an object with ``process(item)`` or a plain function of the item, as given
    or as made by a factory ``fn(step_execution)``."""
    if spec is None:
        return None
    if not isinstance(spec, type) and callable(getattr(spec, "process", None)):
        return spec
    if not callable(spec):
        raise StepConfigurationError(
            f"processor {spec!r} must have a process() method, be a function of the item, or be "
            f"a factory taking the StepExecution"
        )
    if not isinstance(spec, type) and not _is_factory(spec):
        return spec
    made = spec(step_execution)
    if callable(made) and not isinstance(made, type):
        return made
    raise StepConfigurationError(
        f"the processor factory {spec!r} returned {made!r}, which is neither a processor nor a "
        f"function of the item"
    )


class ChunkStep(Step):
    """reader -> processor -> writer, ``chunk_size`` items per transaction.

    - ``reader.read()`` returns an item or None at the end. A reader may also offer
      ``read_chunk(limit)`` (up to ``limit`` of its next items, empty at the end; the SQL
      readers do): without read listeners the step then takes its items that way.
    - ``processor`` (optional): an object with ``process(item)``, a callable ``fn(item)``, or a
      factory ``fn(step_execution)`` returning either (its parameter named ``step_execution``,
      annotated ``StepExecution``, or the factory marked with :func:`step_scope`); returning
      None filters the item out. A processor that returns a function instead of an item fails
      the step before anything is written.
    - ``writer.write(items, ctx)`` writes a chunk through ``ctx.connection``: the same transaction
      in which the step's counters and context (the readers' positions) are committed.
    - Readers, processors and writers that are streams (``open/update/close``) save their position
      into the step context at each commit and restore it on restart.

    Fault tolerance (Spring Batch's ``faultTolerant()``):

    - ``skip_limit`` / ``skippable``: that many items (read, process and write skips together) may
      fail with one of the ``skippable`` exception types and be skipped; ``no_skip`` types are
      never skipped, even when they derive from a skippable one. ``skip_policy(error,
      skip_count) -> bool`` decides instead of ``skip_limit``/``skippable`` when given (an error
      it refuses fails the step).
    - ``retry_limit`` / ``retryable``: processing and writing are retried that many times on the
      ``retryable`` exception types but not the ``no_retry`` ones (a write retry re-runs the whole
      chunk transaction), waiting ``retry_backoff`` (a :class:`~dbcluster.batch.policy.Backoff`:
      fixed, exponential, with jitter) before each retry, outside any transaction.
    - ``no_rollback``: writer exceptions of these types keep the chunk's transaction: what was
      written before the error commits with the chunk's counters and position, and the chunk's
      items count as write skips. For errors that leave the transaction sound (a validation
      error raised before writing).

    Listeners (``listeners=[...]``, any object with any of these methods; see
    :mod:`dbcluster.batch.listeners`): step, chunk, item read/process/write, skip and retry.
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
        no_skip: Sequence[type[BaseException]] = (),
        skip_policy: SkipPolicy | None = None,
        retry_limit: int = 0,
        retryable: Sequence[type[BaseException]] = (),
        no_retry: Sequence[type[BaseException]] = (),
        retry_backoff: Backoff | None = None,
        no_rollback: Sequence[type[BaseException]] = (),
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
        # Never skipped, retried or kept: a fenced or stale write must roll back and fail.
        self.no_skip = (*no_skip, OptimisticLockingFailureError)
        self.skip_policy = skip_policy
        self.retry_limit = retry_limit
        self.retryable = tuple(retryable)
        self.no_retry = (*no_retry, OptimisticLockingFailureError)
        self.retry_backoff = retry_backoff
        self.no_rollback = tuple(no_rollback)
        #: The listeners' chunk-level methods (read when the step is built).
        self.hooks = ChunkHooks(self.listeners)

    # --- policy ------------------------------------------------------------------------------

    def _can_skip(self, error: BaseException, se: StepExecution) -> bool:
        if isinstance(error, self.no_skip):
            return False
        if self.skip_policy is not None:
            return bool(self.skip_policy(error, se.skip_count))
        return self.skip_limit > 0 and isinstance(error, self.skippable)

    def _can_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether try ``attempt + 1`` follows (waiting out the backoff first)."""
        if not isinstance(error, self.retryable) or isinstance(error, self.no_retry):
            return False
        hooks = self.hooks
        if attempt >= self.retry_limit:
            fire(hooks.on_retry_exhausted, error, attempt + 1)
            return False
        fire(hooks.on_retry, error, attempt + 1)
        if self.retry_backoff is not None:
            time.sleep(self.retry_backoff.delay(attempt + 1))
        return True

    def _skip(
        self,
        se: StepExecution,
        counter: str,
        error: BaseException,
        skipped: list[tuple[str, Any, BaseException]],
        item: Any = None,
    ) -> None:
        setattr(se, counter, getattr(se, counter) + 1)
        skipped.append((counter, item, error))
        log.info("step %s skipped an item (%s): %s", se.step_name, counter, error)
        if self.skip_policy is None and se.skip_count > self.skip_limit:
            raise SkipLimitExceededError(
                f"step {se.step_name!r} exceeded its skip limit of {self.skip_limit}: {error!r}"
            ) from error

    def _report_skips(self, skipped: list[tuple[str, Any, BaseException]]) -> None:
        hooks = self.hooks
        for counter, item, error in skipped:
            if counter == "read_skip_count":
                fire(hooks.on_skip_in_read, error)
            elif counter == "process_skip_count":
                fire(hooks.on_skip_in_process, item, error)
            else:
                fire(hooks.on_skip_in_write, item, error)

    # --- execution ---------------------------------------------------------------------------

    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        se = step_execution
        reader = resolve(self.reader, se, "read", "reader")
        writer = resolve(self.writer, se, "write", "writer")
        processor = resolve_processor(self.processor, se)
        process = processor.process if callable(getattr(processor, "process", None)) else processor
        streams = [c for c in (reader, processor, writer) if c is not None and is_stream(c)]
        write_streams = [c for c in (processor, writer) if c is not None and is_stream(c)]
        opened: list[Any] = []
        try:
            for stream in streams:
                stream.open(se.execution_context)
                opened.append(stream)
            self._run_chunks(se, runtime, reader, process, writer, streams, write_streams)
        finally:
            for stream in reversed(opened):
                try:
                    stream.close()
                except Exception:  # noqa: BLE001 - closing must not hide the step's outcome
                    log.exception("closing %r failed", stream)

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
        hooks = self.hooks
        while not se.should_stop:
            snapshot = se.snapshot()
            skipped: list[tuple[str, Any, BaseException]] = []
            try:
                fire(hooks.before_chunk, se)
                items, exhausted = self._read_chunk(se, reader, skipped)
                if not items and se.read_skip_count == snapshot["read_skip_count"]:
                    return
                outputs = self._process_chunk(se, processor, items, skipped)
                self._write_chunk(se, runtime, writer, outputs, streams, write_streams, skipped)
            except Exception as error:
                rollbacks = se.rollback_count
                se.restore(snapshot)
                se.rollback_count = max(rollbacks, snapshot["rollback_count"] + 1)
                fire(hooks.after_chunk_error, se, error)
                raise
            self._report_skips(skipped)
            fire(hooks.after_chunk, se)
            if exhausted:
                return

    def _read_chunk(
        self, se: StepExecution, reader: Any, skipped: list[tuple[str, Any, BaseException]]
    ) -> tuple[list[Any], bool]:
        hooks = self.hooks
        items: list[Any] = []
        bulk = getattr(reader, "read_chunk", None)
        if callable(bulk) and not hooks.before_read and not hooks.after_read:
            # Nothing to call per item: take the items a page at a time.
            while len(items) < self.chunk_size:
                try:
                    got = bulk(self.chunk_size - len(items))
                except Exception as error:
                    self._read_failed(se, error, skipped)
                    continue
                if not got:
                    return items, True
                se.read_count += len(got)
                items.extend(got)
            return items, False
        while len(items) < self.chunk_size:
            fire(hooks.before_read)
            try:
                item = reader.read()
            except Exception as error:
                self._read_failed(se, error, skipped)
                continue
            if item is None:
                return items, True
            fire(hooks.after_read, item)
            se.read_count += 1
            items.append(item)
        return items, False

    def _read_failed(
        self, se: StepExecution, error: Exception, skipped: list[tuple[str, Any, BaseException]]
    ) -> None:
        """A read raised ``error``: tell the listeners, then skip it if the policy allows, else
        raise it again."""
        fire(self.hooks.on_read_error, error)
        if not self._can_skip(error, se):
            raise error
        self._skip(se, "read_skip_count", error, skipped)

    def _process_chunk(
        self,
        se: StepExecution,
        process: Any,
        items: list[Any],
        skipped: list[tuple[str, Any, BaseException]],
    ) -> list[Any]:
        if process is None:
            return items
        hooks = self.hooks
        outputs = []
        for item in items:
            attempt = 0
            while True:
                fire(hooks.before_process, item)
                try:
                    result = process(item)
                except Exception as error:
                    fire(hooks.on_process_error, item, error)
                    if self._can_retry(error, attempt):
                        attempt += 1
                        continue
                    if self._can_skip(error, se):
                        self._skip(se, "process_skip_count", error, skipped, item)
                        result = _SKIPPED
                        break
                    raise
                fire(hooks.after_process, item, result)
                break
            if result is _SKIPPED:
                continue
            if result is None:
                se.filter_count += 1
                continue
            if is_code(result):
                raise StepConfigurationError(
                    f"the processor of step {se.step_name!r} returned {result!r} for an item, "
                    f"which is not an item: a factory taking the StepExecution must name its "
                    f"parameter step_execution, annotate it StepExecution, or use @step_scope"
                )
            outputs.append(result)
        return outputs

    def _write_items(
        self,
        se: StepExecution,
        runtime: BatchRuntime,
        writer: Any,
        items: list[Any],
        conn: Connection,
    ) -> BaseException | None:
        """Write ``items`` in the chunk's transaction, with the write listeners; a
        ``no_rollback`` error is returned (the transaction goes on), any other raised."""
        hooks = self.hooks
        fire(hooks.before_write, items)
        try:
            writer.write(items, ChunkContext(conn, se, runtime))
        except Exception as error:
            fire(hooks.on_write_error, error, items)
            if self.no_rollback and isinstance(error, self.no_rollback):
                log.info("step %s kept its chunk after a writer error: %s", se.step_name, error)
                return error
            raise
        fire(hooks.after_write, items)
        return None

    def _write_chunk(
        self,
        se: StepExecution,
        runtime: BatchRuntime,
        writer: Any,
        outputs: list[Any],
        streams: list[Any],
        write_streams: list[Any],
        skipped: list[tuple[str, Any, BaseException]],
    ) -> None:
        kept: list[tuple[str, Any, BaseException]] = []

        def write(conn: Connection) -> None:
            kept.clear()
            error = self._write_items(se, runtime, writer, outputs, conn) if outputs else None
            if error is None:
                se.write_count += len(outputs)
            else:
                se.write_skip_count += len(outputs)
                kept.extend(("write_skip_count", item, error) for item in outputs)
            for stream in streams:
                stream.update(se.execution_context)
            se.commit_count += 1

        attempt = 0
        while True:
            try:
                commit_step(se, runtime, write)
                skipped.extend(kept)
                return
            except Exception as error:
                se.rollback_count += 1
                if self._can_retry(error, attempt):
                    attempt += 1
                    continue
                if len(outputs) > 0 and self._can_skip(error, se):
                    self._scan(se, runtime, writer, outputs, streams, write_streams, skipped)
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
        skipped: list[tuple[str, Any, BaseException]],
    ) -> None:
        """Write a failed chunk item by item, one transaction each, skipping the bad items.

        Like Spring Batch's scan, the items written here commit before the reader's position does,
        so a crash in the middle of a scan may write some of them twice on restart.
        """
        for item in outputs:

            def write_one(conn: Connection, item: Any = item) -> None:
                error = self._write_items(se, runtime, writer, [item], conn)
                if error is not None:
                    raise error  # kept or not, a scan writes an item or skips it
                se.write_count += 1
                for stream in write_streams:
                    stream.update(se.execution_context)

            try:
                commit_step(se, runtime, write_one)
            except Exception as error:
                se.rollback_count += 1
                if self._can_skip(error, se):
                    self._skip(se, "write_skip_count", error, skipped, item)
                    continue
                raise

        def close_chunk(conn: Connection) -> None:
            for stream in streams:
                stream.update(se.execution_context)
            se.commit_count += 1

        commit_step(se, runtime, close_chunk)


_SKIPPED = object()
