"""``dbcluster chaos``: the fault plan puts every fault where it was asked to (``--target``,
``--kinds``), and the database's own faults (issue 34) are planned, run and reported as said."""

from __future__ import annotations

import time

import pytest

from dbcluster.testing.chaos import (
    KINDS,
    LEADER_KINDS,
    MASTER_KINDS,
    TARGETS,
    WORKER_KINDS,
    plan_faults,
)
from dbcluster.testing.dbfaults import (
    DbControl,
    DbFaultRunner,
    command_line,
    first_execution_check,
    scan_logs,
)


def _plan(on: str, seed: int = 3, faults: int = 14) -> list:
    return plan_faults(seed, faults, 4, 5, window=16.8, cleanup_ms=2500, unreachable_ms=1000, on=on)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_master_faults_fall_on_masters_and_use_every_kind_a_master_can_take(seed: int) -> None:
    plan = _plan("masters", seed)
    assert {f.target[0] for f in plan} == {"m"}
    assert {f.kind for f in plan} == set(KINDS) - set(WORKER_KINDS) - set(LEADER_KINDS)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_worker_faults_fall_on_workers_only(seed: int) -> None:
    plan = _plan("workers", seed)
    assert {f.target[0] for f in plan} == {"w"}
    assert {f.kind for f in plan} == set(KINDS) - set(MASTER_KINDS) - set(LEADER_KINDS)


def test_the_mixed_plan_hits_both_and_is_a_pure_function_of_its_arguments() -> None:
    plan = _plan("any")
    assert {f.target[0] for f in plan} == {"m", "w", "l"}
    # The leader faults fall on whichever process holds the sweep lease then.
    assert {f.target for f in plan if f.kind in LEADER_KINDS} == {"leader"}
    assert {f.kind for f in plan} == set(KINDS)
    assert plan == _plan("any")
    assert [f.at for f in plan] == sorted(f.at for f in plan)


def test_an_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match="masters"):
        _plan("everyone")


# --- the database's own faults (issue 34) ------------------------------------------------------


def _db_plan(kinds: tuple[str, ...], seed: int = 3, faults: int = 3, db_nodes: int = 1, **kw):
    window = kw.pop("window", 40.0)
    return plan_faults(
        seed,
        faults,
        4,
        5,
        window=window,
        cleanup_ms=2500,
        unreachable_ms=1000,
        kinds=kinds,
        db_nodes=db_nodes,
        **kw,
    )


def test_the_default_kinds_are_the_node_kinds() -> None:
    for seed in (1, 2, 3):
        assert _plan("any", seed) == plan_faults(
            seed, 14, 4, 5, window=16.8, cleanup_ms=2500, unreachable_ms=1000, kinds=KINDS
        )


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_database_faults_fall_on_the_database_one_slot_apart(seed: int) -> None:
    plan = _db_plan(("dbrestart", "dbcrash", "switchover"), seed)
    assert {f.kind for f in plan} == {"dbrestart", "dbcrash", "switchover"}
    assert {f.target for f in plan} == {"db"}
    starts = [f.at for f in plan]
    assert all(b - a >= 40.0 / 3 * 0.6 for a, b in zip(starts, starts[1:], strict=False))
    assert plan == _db_plan(("dbrestart", "dbcrash", "switchover"), seed)


@pytest.mark.parametrize("on", TARGETS)
def test_database_faults_ignore_the_process_target(on: str) -> None:
    plan = _db_plan(("dbrestart", "kill"), faults=6, on=on)
    assert {f.target for f in plan if f.kind == "dbrestart"} == {"db"}
    assert {f.target[0] for f in plan if f.kind == "kill"} <= {"m", "w"}


@pytest.mark.parametrize("seed", range(1, 9))
def test_a_galera_kill_never_hits_the_first_url_and_lasts_a_few_seconds(seed: int) -> None:
    plan = _db_plan(("galera-kill",), seed, faults=4, db_nodes=3)
    assert {f.target for f in plan} <= {"db2", "db3"}
    assert all(2.0 <= f.duration <= 6.0 for f in plan)


def test_a_galera_kill_needs_two_urls_and_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="two database URLs"):
        _db_plan(("galera-kill",), db_nodes=1)
    with pytest.raises(ValueError, match="known: kill"):
        _db_plan(("meteor",))


def test_the_commands_say_which_database_kinds_they_allow() -> None:
    control = DbControl(restart="r", kill="k")
    assert control.available() == ("dbrestart",)  # galera-kill needs its rejoin command too
    assert control.missing(("dbrestart", "kill", "dbcrash", "galera-kill")) == [
        "fault kind dbcrash needs --db-crash COMMAND",
        "fault kind galera-kill needs --db-rejoin COMMAND too",
    ]
    assert DbControl(kill="k", rejoin="j").available() == ("galera-kill",)
    assert command_line("ci/ha.sh galera kill {node}", 2) == ["ci/ha.sh", "galera", "kill", "2"]
    assert command_line("env A='b c' x") == ["env", "A=b c", "x"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kinds", "dbrestart"], "needs --db-restart COMMAND"),
        (["--kinds", "kill,meteor"], "unknown kind(s) meteor"),
        (["--kinds", "galera-kill", "--db-kill", "k", "--db-rejoin", "j"], "--url once per"),
        (["--node-env", "NOVALUE"], "is not NAME=VALUE"),
    ],
)
def test_chaos_refuses_a_wrong_database_option_with_one_line(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from dbcluster.cli import cli

    result = CliRunner().invoke(cli, ["chaos", "--url", "sqlite:///unused.db", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_the_database_faults_run_one_after_another_and_are_recorded() -> None:
    said: list[str] = []
    control = DbControl(restart="sleep 0.3", crash="false", kill="true", rejoin="true")
    runner = DbFaultRunner(control, time.monotonic, said.append)
    records = [{"index": i} for i in range(3)]
    runner.submit(records[0], "dbrestart", 0.0, None)
    runner.submit(records[1], "dbcrash", 0.0, None)
    runner.submit(records[2], "galera-kill", 0.1, 2)
    assert runner.busy()
    runner.close(timeout=30)
    assert not runner.busy()
    assert [r["ok"] for r in records] == [True, False, True]
    assert records[0]["ended_s"] <= records[1]["started_s"] <= records[2]["started_s"]
    assert [c["command"] for c in records[2]["commands"]] == ["true", "true"]
    assert records[1]["commands"][0]["exit_code"] == 1


def test_the_log_scan_counts_errors_and_each_traceback_once(tmp_path) -> None:
    log = tmp_path / "w0i1.log"
    log.write_text(
        "2026-12-03 08:56:43,912 ERROR dbcluster.service: service sweep failed\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "OSError: refused\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        "sqlalchemy.exc.OperationalError: refused\n"
        "2026-12-03 08:56:44,012 WARNING dbcluster.node: node w0 cannot heartbeat (1081 ms)\n"
        "2026-12-03 08:56:45,140 ERROR dbcluster.service: service sweep failed\n"
    )
    (tmp_path / "quiet.log").write_text("2026-12-03 08:56:43,912 INFO dbcluster.node: joined\n")
    found = scan_logs(sorted(tmp_path.glob("*.log")))
    assert (found["errors"], found["tracebacks"], found["warnings"]) == (2, 1, 1)
    assert found["top_errors"] == [
        {"message": "dbcluster.service: service sweep failed", "count": 2}
    ]
    assert list(found["per_file"]) == ["w0i1.log"]


def test_the_log_scan_reads_the_time_format_of_the_commands(tmp_path) -> None:
    """``dbcluster worker``/``launch`` write one ISO token for the time (dbcluster.logs): its
    ERROR and WARNING lines count too (the scan once saw none of them)."""
    log = tmp_path / "w0i1.log"
    log.write_text(
        "2026-12-03T12:00:29.253Z ERROR dbcluster.node: node w0 takes no partitions\n"
        "2026-12-03T12:00:29.274Z WARNING dbcluster.service: service sweep: database "
        "unavailable; retrying (OperationalError: refused)\n"
        "2026-12-03T12:00:31.000Z INFO dbcluster.service: service sweep: database available\n"
    )
    found = scan_logs([log])
    assert (found["errors"], found["tracebacks"], found["warnings"]) == (1, 0, 1)
    assert found["top_errors"] == [
        {"message": "dbcluster.node: node wN takes no partitions", "count": 1}
    ]


def test_first_execution_names_failed_executions_and_repeated_launches() -> None:
    assert first_execution_check({"a": {"executions": ["COMPLETED"], "relaunches": 0}}) == []
    found = first_execution_check(
        {
            "a": {"executions": ["FAILED", "COMPLETED"], "relaunches": 0},
            "b": {"executions": ["COMPLETED"], "relaunches": 2},
            "c": {"executions": [], "relaunches": 0},
        }
    )
    assert found == [
        "a: executions FAILED -> COMPLETED",
        "b: its launch was repeated 2 time(s) before its execution existed (the launch "
        "command failed)",
        "c: no execution",
    ]


def test_node_processes_are_spread_over_the_urls(tmp_path) -> None:
    from dbcluster.testing.harness import Harness

    urls = [f"sqlite:///{tmp_path}/n{i}.db" for i in (1, 2, 3)]
    harness = Harness(urls[0], tmp_path, node_urls=urls)
    assert [harness.url_for(f"w{i}") for i in range(4)] == [*urls, urls[0]]
    assert harness.url_for("m2") == urls[2]
    assert Harness(urls[0], tmp_path).url_for("w5") == urls[0]
