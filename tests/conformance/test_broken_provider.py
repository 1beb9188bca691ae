"""The suite can fail: deliberately broken providers are caught by its own tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from dbcluster.dialects import registry
from dbcluster.dialects.base import PARTITION_CLAIMED
from dbcluster.dialects.sqlite import SQLiteProvider
from dbcluster.schema import job_coordination, partitions
from dbcluster.testing.backends import Backend, open_url
from dbcluster.testing.suite import test_provider as suite


class ClaimIgnoresItsGuard(SQLiteProvider):
    """Claims by id alone: any node, any attempt, any status."""

    def claim_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Any:
        return (
            update(partitions)
            .where(partitions.c.step_execution_id == step_execution_id)
            .values(status=PARTITION_CLAIMED, last_updated=self.now())
        )


class SecondPreciseStaleness(SQLiteProvider):
    """The Java reference's MySQL flaw: staleness in whole seconds."""

    def older_than(self, column: Any, ms: int) -> Any:
        return super().older_than(column, max(1000, -(-ms // 1000) * 1000))


class StrandedClaimWithoutGuard(SQLiteProvider):
    """Every survivor "wins" a stranded job."""

    def claim_stranded_master(
        self, job_execution_id: int, lost_master: str, epoch: int, status: str, new_owner: str
    ) -> Any:
        return (
            update(job_coordination)
            .where(job_coordination.c.job_execution_id == job_execution_id)
            .values(status="RECOVERING", master_node=new_owner, updated_time=self.now())
        )


class FenceIgnoresItsHolder(SQLiteProvider):
    """The fencing token is not checked: a reassigned partition's old holder still writes."""

    def hold_partition(self, step_execution_id: int, node_id: str, attempt: int) -> Any:
        return (
            update(partitions)
            .where(partitions.c.step_execution_id == step_execution_id)
            .values(last_updated=self.now())
        )


class RemovalLeavesClaimsAlone(SQLiteProvider):
    """A removed node's claims keep their attempt: its late commits would still land."""

    def fence_partitions_of_removing(self) -> Any:
        return super().fence_partitions_of_removing().where(partitions.c.attempt < 0)


class EverythingIsTransient(SQLiteProvider):
    """An over-broad classifier: every error is "try again" (issue 17, item 7)."""

    def is_transient(self, error: BaseException) -> bool:
        return True


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Iterator[Backend]:
    backend = open_url(f"sqlite:///{tmp_path}/broken.db")
    yield backend
    backend.close()


def _with(backend: Backend, provider_class: type[SQLiteProvider]) -> Backend:
    registry._engine_providers[backend.engine] = provider_class(backend.engine.dialect)
    return backend


@pytest.mark.parametrize(
    ("provider_class", "tests"),
    [
        (
            ClaimIgnoresItsGuard,
            [
                suite.test_claim_changes_one_row_only_under_its_guard,
                suite.test_concurrent_claims_exactly_one_wins,
            ],
        ),
        (SecondPreciseStaleness, [suite.test_older_than_is_subsecond_precise]),
        (
            StrandedClaimWithoutGuard,
            [suite.test_concurrent_stranded_master_claims_exactly_one_wins],
        ),
        (FenceIgnoresItsHolder, [suite.test_reassignment_fences_the_previous_attempt]),
        (RemovalLeavesClaimsAlone, [suite.test_removing_a_node_fences_what_it_claimed]),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_the_suite_catches_a_broken_provider(
    sqlite_backend: Backend, provider_class: type[SQLiteProvider], tests: list[Any]
) -> None:
    for test in tests:
        sqlite_backend.reset()
        # The sound provider passes the very same test...
        registry._engine_providers[sqlite_backend.engine] = SQLiteProvider(
            sqlite_backend.engine.dialect
        )
        test(sqlite_backend)
        # ...and the broken one fails it.
        sqlite_backend.reset()
        with pytest.raises(AssertionError):
            test(_with(sqlite_backend, provider_class))


def test_the_suite_fails_a_provider_that_calls_every_error_transient(
    sqlite_backend: Backend,
) -> None:
    """Run as a whole, the provider suite must fail it somewhere: such a provider retries broken
    statements forever and passes a broken concurrent claim off as a lost race."""
    _with(sqlite_backend, EverythingIsTransient)
    failed = []
    for name in suite.__all__:
        sqlite_backend.reset()
        try:
            getattr(suite, name)(sqlite_backend)
        except AssertionError:
            failed.append(name)
    assert failed, "every suite test passed a provider that calls every error transient"
