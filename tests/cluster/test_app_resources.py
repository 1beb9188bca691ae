"""A node holds its registry's resources while it runs: the last node of the process to stop
closes them, after its partitions ended."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dbcluster import ChunkContext, Cluster, JobRegistry
from dbcluster.batch import BatchStatus
from dbcluster.testing.app import FAST_SETTINGS


def test_the_last_node_of_the_process_to_stop_closes_the_resources(backend: Any) -> None:
    registry = JobRegistry()
    events: list[str] = []

    @registry.resource
    def counter() -> Iterator[list[int]]:
        events.append("made")
        yield []
        events.append("closed")

    @registry.partitioned_job(ids=range(0, 40), partitions=4, chunk_size=5)
    def tally(ids: range, ctx: ChunkContext) -> None:
        counter().extend(ids)

    first = Cluster(backend.url, registry, FAST_SETTINGS).start()
    second = Cluster(backend.url, registry, FAST_SETTINGS).start()
    try:
        execution = first.launch("tally", {"run": 1})
        assert execution.status is BatchStatus.COMPLETED
        assert sorted(counter()) == list(range(40))  # one value for both nodes of the process
        assert events == ["made"]
    finally:
        first.stop(drain_timeout_ms=2000)
    assert events == ["made"] and counter.is_open  # the second node still runs
    second.stop(drain_timeout_ms=2000)
    assert events == ["made", "closed"] and not counter.is_open
    second.stop(drain_timeout_ms=2000)  # stopping again releases nothing twice
    assert events == ["made", "closed"]
