"""Flows on every backend: transitions on exit status, deciders, splits, job steps, and the
persisted path that a restart and a takeover resume on."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from dbcluster.batch import (
    BatchStatus,
    ChunkContext,
    ExitStatus,
    Flow,
    Job,
    JobLauncher,
    JobParameters,
    JobRepository,
    JobStep,
    Split,
    TaskletStep,
    decider,
)
from dbcluster.batch.flow import PATH_KEY, FlowConfigurationError
from dbcluster.testing import points


class Crash(BaseException):
    """A master that dies where it stands (nothing after it runs or commits)."""


class Steps:
    """Tasklet steps that count their runs and fail (or end with an exit code) on demand."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.failing: set[str] = set()
        self.codes: dict[str, str] = {}
        self.barrier: threading.Barrier | None = None

    def step(self, name: str, *, meet: bool = False) -> TaskletStep:
        def body(ctx: ChunkContext) -> None:
            self.runs[name] += 1
            if meet and self.barrier is not None:
                self.barrier.wait()  # both branches inside at once: they run in parallel
            if name in self.failing:
                raise RuntimeError(f"{name} failed")

        def after_step(se: Any) -> ExitStatus | None:
            code = self.codes.get(name)
            return ExitStatus(code) if code and se.status is BatchStatus.COMPLETED else None

        listener = type("L", (), {"after_step": staticmethod(after_step)})()
        return TaskletStep(name, body, listeners=[listener])


def _params(**values: Any) -> JobParameters:
    return JobParameters(values)


def _ran(repo: JobRepository, execution: Any) -> list[tuple[str, str]]:
    return [(se.step_name, se.status.value) for se in repo.get_step_executions(execution)]


def test_a_failed_conditional_flow_restarts_on_the_branch_it_took(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    s = Steps()
    load, repair, publish, notify = (s.step(n) for n in ("load", "repair", "publish", "notify"))
    flow = (
        Flow("cond")
        .start(load)
        .on("FAILED").to(repair).next(publish)
        .from_(load).on("*").to(notify)
    )  # fmt: skip
    job = Job("cond", flow)
    s.failing = {"load", "publish"}
    first = launcher.run(job, {"run": 1})
    assert first.status is BatchStatus.FAILED
    assert _ran(repo, first) == [("load", "FAILED"), ("repair", "COMPLETED"), ("publish", "FAILED")]
    s.failing = set()  # load would now succeed: the restart must not take the other branch
    second = launcher.run(job, {"run": 1})
    assert second.status is BatchStatus.COMPLETED, second.exit_status
    assert _ran(repo, second) == [("publish", "COMPLETED")]
    assert s.runs == Counter(load=1, repair=1, publish=2)
    path = second.execution_context[PATH_KEY]["cond"]["states"]
    assert [e[0] for e in path] == ["load", "repair", "publish"]


def test_a_decision_is_kept_on_restart_and_end_fail_stop_and_restart(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    s = Steps()
    answers = iter(["WEEKEND", "WEEKEND"])  # one answer per new instance, none on restarts
    seen: list[str] = []

    @decider
    def which_day(job_execution: Any, last: Any) -> str:
        seen.append(last.step_name if last is not None else "")
        return next(answers)

    prepare, weekend, weekday, audit, late = (
        s.step(n) for n in ("prepare", "weekend", "weekday", "audit", "late")
    )
    flow = (
        Flow("days")
        .start(prepare)
        .next(which_day)
        .on("WEEKEND").to(weekend)
        .on("FAILED").fail()
        .on("COMPLETED").end()
        .on("*").stop_and_restart(late)
        .from_(which_day).on("WEEKDAY").to(weekday).next(audit)
    )  # fmt: skip
    job = Job("days", flow)
    s.failing = {"weekend"}
    first = launcher.run(job, {"run": 1})
    assert (first.status, first.exit_status.code) == (BatchStatus.FAILED, "FAILED")
    s.failing = set()
    second = launcher.run(job, {"run": 1})
    assert second.status is BatchStatus.COMPLETED
    assert _ran(repo, second) == [("weekend", "COMPLETED")], "the decider was not asked again"
    assert seen == ["prepare"]
    # weekend ended with a custom code: no transition but "*": stop, and restart at "late".
    s.codes["weekend"] = "ODD"
    third = launcher.run(job, {"run": 2})
    assert (third.status, third.exit_status.code) == (BatchStatus.STOPPED, "STOPPED")
    fourth = launcher.run(job, {"run": 2})
    assert fourth.status is BatchStatus.COMPLETED and _ran(repo, fourth) == [("late", "COMPLETED")]
    # end() completes the job whatever the step's status was.
    ended = Job("ends", Flow("ends").start(s.step("bad")).on("FAILED").end("TOLERATED"))
    s.failing = {"bad"}
    execution = launcher.run(ended, {"run": 1})
    assert (execution.status, execution.exit_status.code) == (BatchStatus.COMPLETED, "TOLERATED")


def test_a_split_runs_its_branches_in_parallel_and_restarts_only_the_failed_one(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    s = Steps()
    s.barrier = threading.Barrier(2, timeout=10)
    left = Flow("left").start(s.step("l1", meet=True)).next(s.step("l2"))
    split = Split("both", [left, s.step("r1", meet=True)])
    job = Job("split", Flow("split").start(s.step("before")).next(split).next(s.step("after")))
    s.failing = {"r1"}
    first = launcher.run(job, {"run": 1})
    assert first.status is BatchStatus.FAILED
    assert sorted(_ran(repo, first)) == [
        ("before", "COMPLETED"),
        ("l1", "COMPLETED"),
        ("l2", "COMPLETED"),
        ("r1", "FAILED"),
    ]
    s.failing, s.barrier = set(), None
    second = launcher.run(job, {"run": 1})
    assert second.status is BatchStatus.COMPLETED, second.exit_status
    assert _ran(repo, second) == [("r1", "COMPLETED"), ("after", "COMPLETED")]
    assert s.runs == Counter(before=1, l1=1, l2=1, r1=2, after=1)


def test_a_resumed_execution_replays_its_path_and_goes_on_where_it_was(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    """What a master that takes a job over does: ``execute(..., resume=True)`` in the same
    execution. The decider is not asked again; the step that ended just before the crash
    (before the path recorded it) is not run again."""
    s = Steps()
    answers = iter(["B", "C"])

    @decider
    def choose(job_execution: Any, last: Any) -> str:
        return next(answers)

    a, b, c, final = (s.step(n) for n in ("a", "b", "c", "final"))
    flow = (
        Flow("resume")
        .start(a)
        .next(choose)
        .on("B").to(b).next(final)
        .from_(choose).on("C").to(c).next(final)
    )  # fmt: skip
    job = Job("resume", flow)

    def crash(**details: Any) -> None:
        if details["next_step"] == "final":
            raise Crash

    points.install("master.between_steps", crash)
    try:
        execution = launcher.create_execution(job, _params(run=7))
        with pytest.raises(Crash):
            job.execute(execution, launcher.runtime)
    finally:
        points.remove("master.between_steps", crash)
    stored = repo.get_job_execution(execution.id)
    assert stored is not None and stored.status is BatchStatus.STARTED
    job.execute(stored, launcher.runtime, resume=True)
    assert stored.status is BatchStatus.COMPLETED, stored.exit_status
    assert s.runs == Counter(a=1, b=1, final=1)
    assert [n for n, _ in _ran(repo, stored)] == ["a", "b", "final"]


def test_a_job_step_runs_another_job_and_restarts_it(
    launcher: JobLauncher, repo: JobRepository
) -> None:
    s = Steps()
    child = Job("child", [s.step("c1"), s.step("c2")])
    parent = Job(
        "parent",
        [s.step("p1"), JobStep("run-child", child, parameters=lambda se: {"day": 3})],
    )
    s.failing = {"c2"}
    first = launcher.run(parent, {"run": 1})
    assert first.status is BatchStatus.FAILED
    child_runs = repo.get_job_executions(repo.get_job_instance("child", _params(day=3)))
    assert [e.status for e in child_runs] == [BatchStatus.FAILED]
    s.failing = set()
    second = launcher.run(parent, {"run": 1})
    assert second.status is BatchStatus.COMPLETED, second.exit_status
    child_runs = repo.get_job_executions(repo.get_job_instance("child", _params(day=3)))
    assert [e.status for e in child_runs] == [BatchStatus.COMPLETED, BatchStatus.FAILED]
    assert s.runs == Counter(p1=1, c1=1, c2=2)
    step = repo.get_step_executions(second)[0]
    assert step.execution_context["dbcluster.job_step.execution"] == child_runs[0].id


def test_flow_definitions_that_cannot_run_are_refused() -> None:
    s = Steps()
    a = s.step("a")
    with pytest.raises(FlowConfigurationError, match="start"):
        Flow("f").on("*")
    with pytest.raises(FlowConfigurationError, match="not in the flow"):
        Flow("f").start(a).from_(s.step("b"))
    with pytest.raises(FlowConfigurationError, match="two transitions"):
        Flow("f").start(a).on("X").end().on("X").fail()
    with pytest.raises(FlowConfigurationError, match="two different flow states"):
        Job("j", Flow("f").start(a).next(Split("s", [s.step("a")])))
