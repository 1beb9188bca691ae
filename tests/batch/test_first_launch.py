"""A first launch creates its instance without reading first where the database can say "unless
it exists" in the creating statement; every other launch reads and checks the instance as before,
and two launchers of one new instance still make one execution."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from dbcluster.batch import (
    Job,
    JobExecutionAlreadyRunningError,
    JobInstanceAlreadyCompleteError,
    JobLauncher,
    JobParameters,
    JobRepository,
    TaskletStep,
)
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import job_execution, job_instance
from dbcluster.testing.waiting import wait_for


def _job(name: str = "first-launch") -> Job:
    return Job(name, [TaskletStep("t", lambda ctx: None)])


def _executions(repo: JobRepository) -> int:
    with repo.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(job_execution)).scalar_one())


def _instances(repo: JobRepository) -> int:
    with repo.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(job_instance)).scalar_one())


def test_a_first_launch_reads_no_instance_where_its_statement_creates_it_unless_present(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    """Where the provider can, the instance is created with its execution in one statement that
    does not read first; elsewhere the launch reads the instance first, as it always did."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    event.listen(repo.engine, "before_cursor_execute", record)
    try:
        execution = launcher.create_execution(_job(), JobParameters({"run": 1}))
    finally:
        event.remove(repo.engine, "before_cursor_execute", record)
    assert execution.status is BatchStatus.STARTED
    reads_instance = [
        s for s in sent if s.lstrip().upper().startswith("SELECT") and "batch_job_instance" in s
    ]
    if repo.creates_instance_if_absent:
        # One statement: the instance, the execution, its context and parameters, its first
        # step's execution and that step's context.
        assert len(sent) == 1, sent
        assert "ON CONFLICT" in sent[0] and "batch_job_instance" in sent[0], sent
    else:
        assert reads_instance, sent
    assert _instances(repo) == 1 and _executions(repo) == 1
    # The first step's execution, made with the job's, as creating it on its own makes it.
    made = execution.prepared_steps["t"]
    stored = repo.get_step_execution(made.id)
    assert stored is not None and stored.step_name == "t" == made.step_name
    assert stored.job_execution.id == execution.id == made.job_execution.id
    assert (stored.status, made.status) == (BatchStatus.STARTED, BatchStatus.STARTED)
    assert stored.start_time == made.start_time and made.start_recorded
    assert stored.execution_context.to_dict() == {} and not made.execution_context.dirty
    assert (stored.version, stored.commit_count, stored.read_count) == (0, 0, 0)
    assert [s.id for s in repo.get_step_executions(execution)] == [made.id]


def test_a_launch_of_an_existing_instance_is_checked_and_writes_nothing_when_refused(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    """The creating statement wrote nothing for an instance that exists: the launch reads it,
    refuses it (COMPLETED), and leaves no execution or instance behind."""
    job = _job()
    assert launcher.run(job, JobParameters({"run": 2})).status is BatchStatus.COMPLETED
    with pytest.raises(JobInstanceAlreadyCompleteError):
        launcher.run(job, JobParameters({"run": 2}))
    assert _instances(repo) == 1 and _executions(repo) == 1
    # A new instance after the refusal is created as usual.
    assert launcher.run(job, JobParameters({"run": 3})).status is BatchStatus.COMPLETED
    assert _instances(repo) == 2 and _executions(repo) == 2


def _creating_an_instance(repo: JobRepository) -> bool:
    """Whether a session of this database is inside a statement creating an instance (the first
    launcher's has returned, so it is the second's, waiting on the first's row)."""
    if repo.engine.dialect.name == "postgresql":
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%INSERT INTO batch_job_instance%'"
        )
    else:
        query = (
            "SELECT count(*) FROM information_schema.processlist "
            "WHERE info LIKE 'INSERT INTO batch_job_instance%'"
        )
    with repo.engine.connect() as conn:
        return int(conn.execute(text(query)).scalar_one()) > 0


def test_two_launchers_of_one_new_instance_make_one_execution(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    """The first launcher holds its creating transaction open until the second one's statement
    waits on it; the second then finds the instance running and is refused. One instance, one
    execution. (Not on SQLite: its one writer at a time is the whole story there.)"""
    if repo.engine.dialect.name == "sqlite":
        pytest.skip("SQLite: a second writer waits for the first in its driver, not on a row")
    job, params = _job("raced"), JobParameters({"run": 4})
    first_in = threading.Event()
    release = threading.Event()
    second_started = threading.Event()
    outcome: dict[str, Any] = {}

    def hold(_conn: Any, _execution: Any) -> None:
        first_in.set()
        if not release.wait(30):
            raise TimeoutError("the test never released the first launcher")

    def first() -> None:
        try:
            outcome["first"] = launcher.create_execution(job, params, on_created=hold)
        except BaseException as error:  # noqa: BLE001 - asserted below
            outcome["first"] = error

    other = JobLauncher(JobRepository(repo.engine))

    def second() -> None:
        second_started.set()
        try:
            outcome["second"] = other.create_execution(job, params)
        except BaseException as error:  # noqa: BLE001 - asserted below
            outcome["second"] = error

    a = threading.Thread(target=first)
    a.start()
    try:
        assert first_in.wait(30), "the first launcher never reached its hold"
        b = threading.Thread(target=second)
        b.start()
        assert second_started.wait(30)
        wait_for(
            lambda: _creating_an_instance(repo) or "second" in outcome,
            20,
            "the second launch to wait",
        )
        assert "second" not in outcome, outcome

    finally:
        release.set()
        a.join(60)
    b.join(60)
    assert not a.is_alive() and not b.is_alive()
    assert outcome["first"].status is BatchStatus.STARTED, outcome
    assert isinstance(outcome["second"], JobExecutionAlreadyRunningError), outcome
    assert _instances(repo) == 1 and _executions(repo) == 1


def test_a_restart_reads_its_instance_without_trying_to_create_it(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    """A restart knows its instance exists: no statement that would create it is sent."""
    broken = {"yes": True}

    def body(ctx: Any) -> None:
        if broken["yes"]:
            raise RuntimeError("boom")

    job = Job("restarted", [TaskletStep("t", body)])
    failed = launcher.run(job, JobParameters({"run": 5}))
    assert failed.status is BatchStatus.FAILED
    broken["yes"] = False
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    event.listen(repo.engine, "before_cursor_execute", record)
    try:
        again = launcher.restart(failed.id, job)
    finally:
        event.remove(repo.engine, "before_cursor_execute", record)
    assert again.status is BatchStatus.COMPLETED and again.id != failed.id
    assert not [s for s in sent if "INSERT INTO batch_job_instance" in s], sent
    assert _instances(repo) == 1 and _executions(repo) == 2


def test_riders_go_with_creating_statements_of_either_shape_on_one_repository(
    repo: JobRepository,
) -> None:
    """Riders (writes of a caller's that go in the creating statement where the database can)
    with the same key, on one repository, for a job with a first step and one without (a flow
    starting with a decision): each launch gets a creating statement of its own shape, its first
    step made right and the rider written once."""
    from sqlalchemy import bindparam

    from dbcluster.batch.repository import Riders
    from dbcluster.dialects import get_provider
    from dbcluster.schema import job_masters

    provider = get_provider(repo.engine)
    if not repo.creates_instance_if_absent:
        pytest.skip("this database reads the instance first: no creating statement to ride on")

    def build(execution_id: Any, _first_step: Any, source: Any) -> tuple[Any, Any]:
        history = provider.insert_master(execution_id, 1, bindparam("b_node"), "r", source=source)
        return [history], None

    made = []
    for run, first_step in enumerate((None, "s1", None, "s1")):
        riders = Riders("a caller's history row", build, {"b_node": "n1"})
        with repo.engine.begin() as conn:
            execution = repo.create_instance_if_absent(
                "riders",
                JobParameters({"run": run}),
                None,
                conn,
                started=True,
                first_step=first_step,
                riders=riders,
            )
            assert execution is not None
            if riders.rows is None:  # it did not ride: the caller writes it
                conn.execute(provider.insert_master(execution.id, 1, "n1", "r"))
        made.append((execution, first_step, riders.rows))
    rides = provider.supports_writable_cte
    for execution, first_step, rows in made:
        assert (rows == []) if rides else rows is None
        steps = repo.get_step_executions(execution)
        if first_step is None:
            assert steps == [] and execution.prepared_steps == {}
        else:
            prepared = execution.prepared_steps[first_step]
            assert [(s.id, s.step_name) for s in steps] == [(prepared.id, first_step)]
        with repo.engine.connect() as conn:
            history = conn.execute(
                select(job_masters.c.master_node).where(
                    job_masters.c.job_execution_id == execution.id
                )
            ).all()
        assert [tuple(h) for h in history] == [("n1",)]
