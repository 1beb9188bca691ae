"""PostgreSQL with a streaming standby, reached through a libpq multi-host URL
(``?host=a&host=b&target_session_attrs=read-write``): the cluster tests, the conformance suite,
and chaos with the database's own faults (issue 34)."""

from __future__ import annotations

from typing import Any

import pytest
from ha_topology import (
    CLASSIC,
    CLUSTER_TESTS,
    OUTLAST_PG,
    failed_executions,
    ha_command,
    inner_env,
    passed_count,
    run_pytest,
    scratch_database,
    violated,
)

from dbcluster.testing.chaos import run_chaos
from dbcluster.testing.dbfaults import DbControl

pytestmark = pytest.mark.ha


def test_the_cluster_tests_pass_through_the_multi_host_url(pg_pair: dict[str, str]) -> None:
    env = inner_env(DBCLUSTER_TEST_POSTGRESQL_URL=pg_pair["HA_PG_PAIR_URL"])
    code, out = run_pytest([*CLUSTER_TESTS, "-k", "postgresql"], env, timeout=1800)
    assert code == 0, out[-6000:]
    assert passed_count(out) > 0, out[-2000:]


def test_the_conformance_suite_passes_through_the_multi_host_url(pg_pair: dict[str, str]) -> None:
    url = pg_pair["HA_PG_PAIR_URL"]
    code, out = run_pytest(
        ["--pyargs", "dbcluster.testing.suite", "--dbcluster-url", url], inner_env(), 1200
    )
    assert code == 0, out[-6000:]
    assert passed_count(out) > 0, out[-2000:]


def _chaos(
    url: str, seed: int, kinds: tuple[str, ...], faults: int, tmp: Any, env: dict | None = None
) -> dict:
    control = DbControl(
        restart=ha_command("pg", "restart", "3"),
        crash=ha_command("pg", "crash", "3"),
        switchover=ha_command("pg", "switchover", "--rebuild"),
    )
    return run_chaos(
        url,
        nodes=3,
        jobs=4,
        faults=faults,
        seed=seed,
        kinds=kinds,
        db_control=control,
        workdir=tmp,
        settle_timeout=240,
        env=env,
    )


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


@pytest.mark.xfail(
    strict=True,
    reason="issue 34: an outage logs ERROR lines with tracebacks (service sweep/poll/stranded/"
    "restarter failed) where one WARNING is due, and a launch that meets it fails (exit 2 or 1) "
    "and must be repeated (observed in every restart, crash and switchover run)",
)
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
