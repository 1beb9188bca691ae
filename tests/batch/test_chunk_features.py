"""Chunk steps: processor factories, listeners at every level, retry backoff, skip policies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import insert

from dbcluster.batch import (
    BatchStatus,
    ChunkStep,
    IterableItemReader,
    Job,
    JobLauncher,
    JobRepository,
    ListItemWriter,
    StepExecution,
    item_writer,
    step_scope,
)
from dbcluster.batch.policy import Backoff
from dbcluster.errors import ConfigurationError


def _run(launcher: JobLauncher, step: ChunkStep, run: int = 1) -> Any:
    return launcher.run(Job(f"job-{step.name}", [step]), {"run": run})


def test_a_processor_factory_is_resolved_once_per_step(launcher: JobLauncher) -> None:
    """Regression: a factory ``fn(step_execution) -> callable`` was called once per item and the
    functions it returned were written as the items, and the job COMPLETED."""
    made: list[int] = []

    def make_processor(step_execution: StepExecution) -> Any:
        made.append(step_execution.id)
        return lambda item: item * 10

    @step_scope
    def make_other(se: Any) -> Any:
        return lambda item: item + 1

    out, other = ListItemWriter(), ListItemWriter()
    first = ChunkStep(
        "factory",
        reader=IterableItemReader(range(5)),
        processor=make_processor,
        writer=out,
        chunk_size=2,
    )
    second = ChunkStep(
        "scoped",
        reader=IterableItemReader(range(3)),
        processor=make_other,
        writer=other,
    )
    assert _run(launcher, first).status is BatchStatus.COMPLETED
    assert out.items == [0, 10, 20, 30, 40] and len(made) == 1
    assert _run(launcher, second).status is BatchStatus.COMPLETED
    assert other.items == [1, 2, 3]


def test_a_factory_taken_for_a_processor_fails_loudly_before_writing(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    written = ListItemWriter()
    step = ChunkStep(
        "unmarked",
        reader=IterableItemReader(range(3)),
        processor=lambda se: lambda item: item,  # neither named nor marked
        writer=written,
    )
    execution = _run(launcher, step)
    assert execution.status is BatchStatus.FAILED
    assert written.items == []
    failed = repo.get_step_executions(execution)[0]
    assert "not an item" in failed.exit_status.description
    with pytest.raises(TypeError, match="a function, as an item"):
        ListItemWriter().write([lambda item: item], None)  # type: ignore[arg-type]


class ReadError(Exception):
    pass


class Flaky(Exception):
    pass


class Bad(Exception):
    pass


class WriteBad(Exception):
    pass


class Recorder:
    """A listener of every chunk-level event, recording (event, detail)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def __getattr__(self, event: str) -> Any:
        if event.startswith(("before_", "after_", "on_")) and event not in ("before_step",):
            return lambda *args: self.events.append((event, args[0] if args else None))
        raise AttributeError(event)

    def count(self, event: str) -> int:
        return sum(1 for name, _ in self.events if name == event)

    def details(self, event: str) -> list[Any]:
        return [detail for name, detail in self.events if name == event]


class OnceFailingReader:
    def __init__(self, items: list[int], fail_at_call: int) -> None:
        self.items, self.calls, self.fail_at_call = list(items), 0, fail_at_call

    def read(self) -> int | None:
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise ReadError("unreadable record")
        return self.items.pop(0) if self.items else None


def test_listeners_at_every_level_see_reads_retries_and_skips(launcher: JobLauncher) -> None:
    tries: Counter[int] = Counter()

    def process(item: int) -> int:
        tries[item] += 1
        if item == 4 and tries[item] == 1:
            raise Flaky("try again")
        if item == 6:
            raise Bad("bad item")
        return item

    out: list[int] = []

    def write(items: Sequence[int], ctx: Any) -> None:
        if 8 in items:
            raise WriteBad("cannot write 8")
        out.extend(items)

    recorder = Recorder()
    step = ChunkStep(
        "listened",
        reader=OnceFailingReader(list(range(10)), fail_at_call=3),
        processor=process,
        writer=item_writer(write),
        chunk_size=5,
        skip_limit=5,
        skippable=(ReadError, Bad, WriteBad),
        retry_limit=2,
        retryable=(Flaky,),
        retry_backoff=Backoff.fixed(0.01),
        listeners=[recorder],
    )
    execution = _run(launcher, step)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert out == [0, 1, 2, 3, 4, 5, 7, 9]
    assert recorder.count("after_chunk") == 2 and recorder.count("after_chunk_error") == 0
    assert recorder.count("after_read") == 10 and recorder.count("on_read_error") == 1
    assert [str(e) for e in recorder.details("on_retry")] == ["try again"]
    assert recorder.count("on_skip_in_read") == 1
    assert recorder.details("on_skip_in_process") == [6]
    assert recorder.details("on_skip_in_write") == [8]
    assert recorder.count("on_process_error") == 2, "item 4's first try, item 6"
    assert recorder.count("on_write_error") == 2, "the chunk's write, then item 8 in the scan"
    assert recorder.count("after_write") == 4, "chunk 1, then 5, 7 and 9 one by one"


def test_a_skip_policy_and_a_no_skip_list_decide_beside_the_limit(
    launcher: JobLauncher,
) -> None:
    class Fatal(ValueError):
        pass

    def bad_on(*bad: int, error: type[Exception] = ValueError) -> Any:
        def process(item: int) -> int:
            if item in bad:
                raise error(f"item {item}")
            return item

        return process

    seen: list[int] = []

    def policy(error: BaseException, skipped: int) -> bool:
        seen.append(skipped)
        return isinstance(error, ValueError) and skipped < 2

    def step(name: str, **options: Any) -> ChunkStep:
        return ChunkStep(
            name, reader=IterableItemReader(range(10)), writer=ListItemWriter(), **options
        )

    by_policy = step("policy", processor=bad_on(1, 2), skip_policy=policy)
    assert _run(launcher, by_policy).status is BatchStatus.COMPLETED and seen == [0, 1]
    too_many = step("policy-3", processor=bad_on(1, 2, 3), skip_policy=policy)
    assert _run(launcher, too_many).status is BatchStatus.FAILED
    never = step(
        "no-skip",
        processor=bad_on(5, error=Fatal),
        skip_limit=10,
        skippable=(ValueError,),
        no_skip=(Fatal,),
    )
    assert _run(launcher, never).status is BatchStatus.FAILED


def test_a_no_rollback_writer_error_keeps_the_chunk(
    launcher: JobLauncher, repo: JobRepository, tables: Any
) -> None:
    class Invalid(Exception):
        pass

    def write(items: Sequence[int], ctx: Any) -> None:
        ctx.connection.execute(insert(tables.out), [{"item": i} for i in items])
        if 3 in items:
            raise Invalid("chunk holds 3")

    step = ChunkStep(
        "keep",
        reader=IterableItemReader(range(6)),
        writer=item_writer(write),
        chunk_size=2,
        no_rollback=(Invalid,),
    )
    execution = _run(launcher, step)
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    assert tables.out_items() == list(range(6)), "the chunk written before the error committed"
    done = repo.get_step_executions(execution)[0]
    assert (done.write_count, done.write_skip_count, done.rollback_count) == (4, 2, 0)


def test_backoff_fixed_exponential_and_jitter() -> None:
    exponential = Backoff.exponential(0.1, multiplier=2, maximum=0.3)
    assert [round(exponential.delay(n), 6) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]
    assert Backoff.fixed(0.5).delay(7) == 0.5
    jittered = Backoff.exponential(1.0, jitter=0.5)
    assert jittered.delay(2, rng=lambda: 1.0) == 1.0 and jittered.delay(2, rng=lambda: 0.0) == 2.0
    with pytest.raises(ConfigurationError):
        Backoff(initial=1.0, jitter=2.0)


class _PageReader:
    """Items 0..n-1 through ``read`` or ``read_chunk``, counting the calls of each."""

    def __init__(self, n: int, page: int) -> None:
        self.items = list(range(n))
        self.page = page
        self.calls: Counter[str] = Counter()

    def read(self) -> Any:
        self.calls["read"] += 1
        return self.items.pop(0) if self.items else None

    def read_chunk(self, limit: int) -> list[Any]:
        self.calls["read_chunk"] += 1
        taken = self.items[: min(limit, self.page)]
        del self.items[: len(taken)]
        return taken


class _SeesReads:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def after_read(self, item: Any) -> None:
        self.seen.append(item)


@pytest.mark.parametrize("listening", [False, True])
def test_a_reader_with_read_chunk_is_read_in_bulk_unless_a_listener_needs_each_read(
    launcher: JobLauncher, listening: bool
) -> None:
    reader, out, listener = _PageReader(23, page=4), ListItemWriter(), _SeesReads()
    step = ChunkStep(
        f"bulk-{listening}",
        reader=reader,
        writer=out,
        chunk_size=10,
        listeners=[listener] if listening else [],
    )
    execution = _run(launcher, step)
    assert execution.status is BatchStatus.COMPLETED
    assert out.items == list(range(23))
    (se,) = execution.step_executions
    assert se.read_count == 23 and se.write_count == 23 and se.commit_count == 3
    if listening:
        assert listener.seen == list(range(23)) and reader.calls == {"read": 24}
    else:
        # Pages of at most 4 fill chunks of 10 (4+4+2, 4+4+2), then 3 and an empty call.
        assert reader.calls == {"read_chunk": 8}
