"""PostgreSQL with a streaming standby, reached through a libpq multi-host URL
(``?host=a&host=b&target_session_attrs=read-write``): the cluster tests, the conformance suite,
and chaos with the database's own faults (issue 34)."""

from __future__ import annotations

from typing import Any

import pytest
from ha_topology import (
    CLASSIC,
    OUTLAST_PG,
    assert_cluster_tests_pass,
    assert_suite_passes,
    chaos_run,
    failed_executions,
    ha_command,
    scratch_database,
    violated,
)

from dbcluster.testing.dbfaults import DbControl

pytestmark = pytest.mark.ha


def test_the_cluster_tests_pass_through_the_multi_host_url(pg_pair: dict[str, str]) -> None:
    assert_cluster_tests_pass("postgresql", pg_pair["HA_PG_PAIR_URL"])


def test_the_conformance_suite_passes_through_the_multi_host_url(pg_pair: dict[str, str]) -> None:
    assert_suite_passes(pg_pair["HA_PG_PAIR_URL"])


def _chaos(
    url: str, seed: int, kinds: tuple[str, ...], faults: int, tmp: Any, env: dict | None = None
) -> dict:
    control = DbControl(
        restart=ha_command("pg", "restart", "3"),
        crash=ha_command("pg", "crash", "3"),
        # Promoted 3 s after the stop, as a failover tool deciding would (a bare promotion here
        # takes well under a second, and services then rarely see the outage at all).
        switchover=ha_command("pg", "switchover", "--rebuild", "--down", "3"),
    )
    return chaos_run(url, seed, kinds, faults, tmp, control, env)


@pytest.fixture(scope="module")
def switchover_run(pg_pair: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two switchovers (the old primary rebuilt as a standby each time), nothing else."""
    url = scratch_database(pg_pair["HA_PG_PAIR_URL"], "hachaos")
    tmp = tmp_path_factory.mktemp("switchover")
    return _chaos(url, 1, ("switchover",), 2, tmp, env=OUTLAST_PG)


@pytest.fixture(scope="module")
def mixed_run(pg_pair: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A restart and a crash of the primary, with node kills and stops mixed in."""
    url = scratch_database(pg_pair["HA_PG_PAIR_URL"], "hachaos")
    kinds = ("dbrestart", "dbcrash", "kill", "stop")
    return _chaos(url, 2, kinds, 4, tmp_path_factory.mktemp("mixed"))


def test_a_switchover_keeps_every_invariant(switchover_run: dict) -> None:
    assert switchover_run["faults_by_kind"] == {"switchover": 2}
    assert not switchover_run["db_fault_commands_failed"]
    assert violated(switchover_run, CLASSIC) == {}


def test_no_job_fails_because_of_a_switchover(switchover_run: dict) -> None:
    assert failed_executions(switchover_run) == {}, switchover_run["restart_causes"]


def test_a_switchover_goes_unnoticed(switchover_run: dict) -> None:
    """Every enforced line of the report: the classic invariants, every job COMPLETED in its
    first execution and launched once, and no ERROR line or traceback in any node's log."""
    assert switchover_run["invariants"]["quiet_logs"]["enforced"]
    assert switchover_run["ok"], (
        violated(switchover_run, ["first_execution", "quiet_logs"]),
        switchover_run["logs"]["top_errors"],
    )


def test_database_faults_mixed_with_node_faults_keep_the_usual_invariants(mixed_run: dict) -> None:
    assert set(mixed_run["faults_by_kind"]) >= {"dbrestart", "dbcrash"}
    assert not mixed_run["db_fault_commands_failed"]
    assert violated(mixed_run, CLASSIC) == {}
    # Reported, not enforced, where node faults are mixed in.
    for key in ("first_execution", "quiet_logs"):
        assert mixed_run["invariants"][key]["enforced"] is False
