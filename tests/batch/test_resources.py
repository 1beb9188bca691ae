"""Application resources: made once per process on first use, closed when its nodes stop."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dbcluster import JobRegistry, Resource
from dbcluster.batch import StepConfigurationError
from dbcluster.batch.resources import Resources


class Handle:
    def __init__(self) -> None:
        self.disposed = 0

    def dispose(self) -> None:
        self.disposed += 1


def test_a_resource_is_made_once_on_first_call_and_shared_by_threads() -> None:
    registry = JobRegistry()
    made: list[int] = []
    gate = threading.Event()

    @registry.resource
    def slow() -> dict[str, int]:
        gate.wait(5)
        made.append(1)
        return {"n": len(made)}

    assert made == []  # nothing is made at registration
    got: list[dict[str, int]] = []
    threads = [threading.Thread(target=lambda: got.append(slow())) for _ in range(8)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)
    assert made == [1]
    assert len(got) == 8 and all(value is got[0] for value in got)
    assert slow.is_open


def test_a_generator_resource_runs_its_teardown_at_close_and_is_made_again_after() -> None:
    registry = JobRegistry()
    events: list[str] = []

    @registry.resource
    def connection() -> Iterator[str]:
        events.append("open")
        yield f"conn-{len(events)}"
        events.append("closed")

    assert connection() == "conn-1"
    registry.resources.close()
    assert events == ["open", "closed"] and not connection.is_open
    assert connection() == "conn-3"  # made again on the next call
    assert events == ["open", "closed", "open"]


def test_a_plain_resource_is_disposed_or_closed_at_close() -> None:
    registry = JobRegistry()

    @registry.resource
    def engine() -> Handle:
        return Handle()

    closed: list[str] = []

    class Closing:
        def close(self) -> None:
            closed.append("closed")

    closing = registry.resource(Closing)
    settings = registry.resource(lambda: {"batch": 10})  # nothing to close: left alone

    handle, _, _ = engine(), closing(), settings()
    registry.resources.close()
    assert handle.disposed == 1 and closed == ["closed"]


def test_resources_close_when_the_last_holder_releases_them() -> None:
    registry = JobRegistry()
    handle = registry.resource(Handle)
    registry.resources.hold()
    registry.resources.hold()
    value = handle()
    registry.resources.release()
    assert value.disposed == 0 and handle.is_open  # another node of the process still runs
    registry.resources.release()
    assert value.disposed == 1 and not handle.is_open


def test_a_teardown_that_fails_is_logged_and_the_rest_still_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = JobRegistry()
    first = registry.resource(Handle)

    @registry.resource
    def broken() -> Iterator[int]:
        yield 1
        raise RuntimeError("cannot close")

    value, _ = first(), broken()
    with caplog.at_level(logging.WARNING, logger="dbcluster.batch.resources"):
        registry.resources.close()
    assert value.disposed == 1
    assert any(
        "closing resource" in r.getMessage() and "broken" in r.getMessage() for r in caplog.records
    )


def test_a_factory_error_reaches_the_caller_and_the_next_call_tries_again() -> None:
    registry = JobRegistry()
    tries: list[int] = []

    @registry.resource
    def flaky() -> int:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("database down")
        return 7

    with pytest.raises(ConnectionError):
        flaky()
    assert flaky() == 7 and len(tries) == 2


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("empty", "yielded nothing"),
        ("itself", "calls itself"),
    ],
)
def test_a_resource_that_cannot_work_says_so_in_one_line(factory: str, message: str) -> None:
    registry = JobRegistry()

    def empty() -> Iterator[int]:
        return
        yield  # a generator

    def itself() -> Any:
        return resource()

    resource = registry.resource({"empty": empty, "itself": itself}[factory])
    with pytest.raises(StepConfigurationError) as raised:
        resource()
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_resource_needs_a_function() -> None:
    with pytest.raises(StepConfigurationError, match="needs a function"):
        Resource(42)  # type: ignore[arg-type]


def _made_in_child(resource: Resource[Handle], parent_id: int, out: Any) -> None:
    value = resource()
    out.send((id(value) != parent_id, value.disposed))


def test_a_forked_process_makes_its_own_value_and_leaves_the_parents_alone() -> None:
    registry = JobRegistry()
    handle = registry.resource(Handle)
    parent_value = handle()
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_made_in_child, args=(handle, id(parent_value), send)
    )
    child.start()
    child.join(30)
    assert receive.poll(5)
    fresh, disposed = receive.recv()
    assert fresh and disposed == 0
    assert handle() is parent_value and parent_value.disposed == 0


def test_a_resource_keeps_its_factorys_name_and_doc() -> None:
    registry = JobRegistry()

    @registry.resource
    def shop() -> Handle:
        """The shop's database."""
        return Handle()

    assert isinstance(shop, Resource)
    assert shop.name == "test_a_resource_keeps_its_factorys_name_and_doc.<locals>.shop"
    assert shop.__doc__ == "The shop's database."
    assert list(registry.resources) == [shop]
    assert isinstance(registry.resources, Resources)
