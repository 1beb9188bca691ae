"""Jobs, steps, restart and fencing on every backend."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, insert, update
from sqlalchemy.exc import OperationalError

from dbcluster.batch import (
    BatchRuntime,
    BatchStatus,
    ChunkContext,
    ChunkStep,
    CsvItemReader,
    CsvItemWriter,
    IntegerRangePartitioner,
    IterableItemReader,
    Job,
    JobExecutionAlreadyRunningError,
    JobInstanceAlreadyCompleteError,
    JobLauncher,
    JobParameters,
    JobRepository,
    ListItemWriter,
    LocalPartitionHandler,
    PartitionStep,
    RepeatStatus,
    SqlItemWriter,
    SqlKeyRangeReader,
    Step,
    StepExecution,
    TaskletStep,
    item_writer,
)
from dbcluster.batch.fence import FencedError


class Boom(Exception):
    """The failure tests inject."""


def _params(run: int = 1) -> JobParameters:
    return JobParameters({"run": run})


def _out_writer(tables: Any, origin: str = "") -> SqlItemWriter:
    return SqlItemWriter(tables.out, lambda item: {"item": item, "origin": origin})


@pytest.mark.parametrize("source", ["iterable", "sql", "csv"])
def test_chunk_step_fails_on_item_n_and_restart_processes_the_rest_once(
    launcher: JobLauncher, repo: JobRepository, tables: Any, source: str, tmp_path: Path
) -> None:
    items = list(range(50))
    fail_on = {"item": 23}

    def make_reader(se: StepExecution) -> Any:
        if source == "iterable":
            return IterableItemReader(items)
        if source == "sql":
            return SqlKeyRangeReader(tables.engine, tables.source, "id", 0, 50, page_size=7)
        path = tmp_path / "in.csv"
        if not path.exists():
            path.write_text("n\n" + "".join(f"{i}\n" for i in items))
        return CsvItemReader(path)

    def to_item(row: Any) -> int:
        return row if source == "iterable" else int(row["id"] if source == "sql" else row["n"])

    def process(row: Any) -> int:
        item = to_item(row)
        if item == fail_on["item"]:
            raise Boom(f"bad item {item}")
        return item

    tables.fill_source(50)
    step = ChunkStep(
        "copy", reader=make_reader, processor=process, writer=_out_writer(tables), chunk_size=5
    )
    job = Job("copy-job", [step])

    first = launcher.run(job, _params())
    assert first.status is BatchStatus.FAILED
    assert tables.out_items() == list(range(20)), "the chunks before item 23 committed"
    failed = repo.get_step_executions(first)[0]
    assert (
        failed.status is BatchStatus.FAILED
        and "Boom: bad item 23" in failed.exit_status.description
    )
    assert (failed.read_count, failed.write_count, failed.commit_count) == (20, 20, 4)
    assert failed.rollback_count == 1

    fail_on["item"] = None
    second = launcher.run(job, _params())
    assert second.status is BatchStatus.COMPLETED
    assert second.job_instance.id == first.job_instance.id and second.id != first.id
    assert tables.out_items() == items and tables.duplicates() == []
    resumed = repo.get_step_executions(second)[0]
    assert (resumed.read_count, resumed.write_count) == (30, 30), "only the remaining items"
    assert resumed.commit_count == 6, "items 20..49 in chunks of 5"


def test_partitioned_step_restarts_only_the_failed_partitions(
    launcher: JobLauncher, repo: JobRepository, tables: Any
) -> None:
    tables.fill_source(800)
    failing = {"range-200-300": 250, "range-700-800": 700}
    runs: list[tuple[str, dict[str, Any]]] = []

    def make_reader(se: StepExecution) -> SqlKeyRangeReader:
        ctx = se.execution_context
        runs.append((se.step_name, {"lo": ctx["lo"], "hi": ctx["hi"]}))
        return SqlKeyRangeReader(
            tables.engine, tables.source, "id", ctx["lo"], ctx["hi"], page_size=40
        )

    def make_processor(row: dict[str, Any]) -> int:
        if row["id"] in failing.values():
            raise Boom(f"row {row['id']}")
        return int(row["id"])

    def make_writer(se: StepExecution) -> SqlItemWriter:
        return _out_writer(tables, se.step_name)

    worker = ChunkStep(
        "sum-worker",
        reader=make_reader,
        processor=make_processor,
        writer=make_writer,
        chunk_size=20,
    )
    step = PartitionStep("sum", worker, IntegerRangePartitioner(0, 800), grid_size=8)
    job = Job("partitioned", [step])

    first = launcher.run(job, _params())
    assert first.status is BatchStatus.FAILED
    names = sorted(name for name, _ in runs)
    assert names == sorted(f"sum-worker:range-{lo}-{lo + 100}" for lo in range(0, 800, 100))
    by_name = {s.step_name: s for s in repo.get_step_executions(first)}
    assert by_name["sum"].status is BatchStatus.FAILED
    assert "2 of 8 partitions" in by_name["sum"].exit_status.description
    failed_names = {n for n, s in by_name.items() if s.status is BatchStatus.FAILED and n != "sum"}
    assert failed_names == {f"sum-worker:{p}" for p in failing}
    # Row 250 failed mid-partition: the chunks before it (200..239) committed.
    assert len(tables.out_items()) == 600 + 40 + 0

    runs.clear()
    failing.clear()
    second = launcher.run(job, _params())
    assert second.status is BatchStatus.COMPLETED
    assert sorted(runs) == sorted(
        [
            ("sum-worker:range-200-300", {"lo": 200, "hi": 300}),
            ("sum-worker:range-700-800", {"lo": 700, "hi": 800}),
        ]
    )
    assert tables.out_items() == list(range(800)) and tables.duplicates() == []
    master = next(s for s in repo.get_step_executions(second) if s.step_name == "sum")
    assert master.status is BatchStatus.COMPLETED
    assert master.write_count == 60 + 100, "the restart resumed 200-300 after its last commit"
    assert len(repo.get_step_executions(second)) == 3


def test_completed_instance_cannot_be_rerun(launcher: JobLauncher, tables: Any) -> None:
    job = Job(
        "once",
        [
            ChunkStep(
                "c", reader=lambda se: IterableItemReader([1, 2, 3]), writer=_out_writer(tables)
            )
        ],
    )
    assert launcher.run(job, _params(1)).status is BatchStatus.COMPLETED
    with pytest.raises(JobInstanceAlreadyCompleteError, match="already completed"):
        launcher.run(job, _params(1))
    assert launcher.run(job, _params(2)).status is BatchStatus.COMPLETED
    assert tables.out_items() == [1, 1, 2, 2, 3, 3]


def test_second_launch_while_running_is_refused(launcher: JobLauncher, repo: JobRepository) -> None:
    job = Job("busy", [TaskletStep("t", lambda ctx: None)])
    running = launcher.create_execution(job, _params())
    with pytest.raises(JobExecutionAlreadyRunningError, match=str(running.id)):
        launcher.run(job, _params())
    running.status = BatchStatus.FAILED
    repo.update_job_execution(running)
    assert launcher.restart(running.id, job).status is BatchStatus.COMPLETED


def test_restart_skips_completed_steps(launcher: JobLauncher, repo: JobRepository) -> None:
    calls: list[str] = []
    broken = {"yes": True}

    def first(ctx: ChunkContext) -> None:
        calls.append("first")

    def second(ctx: ChunkContext) -> None:
        calls.append("second")
        if broken["yes"]:
            raise Boom("second")

    job = Job("two", [TaskletStep("first", first), TaskletStep("second", second)])
    failed = launcher.run(job, _params())
    assert failed.status is BatchStatus.FAILED and calls == ["first", "second"]
    broken["yes"] = False
    assert launcher.restart(failed.id, job).status is BatchStatus.COMPLETED
    assert calls == ["first", "second", "second"]


def test_tasklet_runs_until_finished_one_transaction_per_call(
    launcher: JobLauncher, repo: JobRepository, tables: Any
) -> None:
    def work(ctx: ChunkContext) -> RepeatStatus:
        done = int(ctx.step_context.get("done", 0))
        ctx.connection.execute(insert(tables.out), {"item": done})
        ctx.step_context.put("done", done + 1)
        return RepeatStatus.FINISHED if done == 3 else RepeatStatus.CONTINUABLE

    execution = launcher.run(Job("loop", [TaskletStep("work", work)]), _params())
    assert execution.status is BatchStatus.COMPLETED
    se = repo.get_step_executions(execution)[0]
    assert se.commit_count == 4 and se.execution_context["done"] == 4
    assert tables.out_items() == [0, 1, 2, 3]


def test_skip_and_retry(launcher: JobLauncher, repo: JobRepository, tables: Any) -> None:
    flaky = {"left": 1}

    def process(item: int) -> int | None:
        if item % 7 == 0:
            raise ValueError(f"bad {item}")
        return None if item % 5 == 0 else item

    @item_writer
    def writer(items: Sequence[int], ctx: ChunkContext) -> None:
        if flaky["left"] and 11 in items:
            flaky["left"] -= 1
            raise ConnectionError("transient")
        rows = [{"item": i} for i in items if i != 13]
        if rows:
            ctx.connection.execute(insert(tables.out), rows)
        if 13 in items:
            raise KeyError(13)

    step = ChunkStep(
        "s",
        reader=IterableItemReader(range(1, 21)),
        processor=process,
        writer=writer,
        chunk_size=4,
        skip_limit=5,
        skippable=[ValueError, KeyError],
        retry_limit=2,
        retryable=[ConnectionError],
    )
    execution = launcher.run(Job("skips", [step]), _params())
    assert execution.status is BatchStatus.COMPLETED, execution.exit_status
    se = repo.get_step_executions(execution)[0]
    expected = [i for i in range(1, 21) if i % 7 and i % 5 and i != 13]
    assert tables.out_items() == expected and tables.duplicates() == []
    assert se.read_count == 20
    assert se.process_skip_count == 2 and se.filter_count == 4 and se.write_skip_count == 1
    assert se.write_count == len(expected)
    assert se.rollback_count >= 2


def test_csv_writer_restarts_at_last_commit(
    launcher: JobLauncher, repo: JobRepository, tmp_path: Path
) -> None:
    out = tmp_path / "out.csv"
    fail = {"on": 17}

    def process(item: int) -> dict[str, int]:
        if item == fail["on"]:
            raise Boom(str(item))
        return {"n": item, "square": item * item}

    step = ChunkStep(
        "csv",
        reader=lambda se: IterableItemReader(range(30)),
        processor=process,
        writer=lambda se: CsvItemWriter(out, ["n", "square"]),
        chunk_size=5,
    )
    job = Job("csv-job", [step])
    assert launcher.run(job, _params()).status is BatchStatus.FAILED
    fail["on"] = None
    assert launcher.run(job, _params()).status is BatchStatus.COMPLETED
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["n"]) for r in rows] == list(range(30))


class _TokenFence:
    """A fence on a one-row table: holds while its token is still 1 (a guarded UPDATE)."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def hold(self, conn: Any) -> None:
        held = conn.execute(
            update(self.table).where(self.table.c.token == 1).values(token=1)
        ).rowcount
        if held != 1:
            raise FencedError("the token moved")

    def finish(self, conn: Any, execution: Any) -> None:
        self.hold(conn)


def test_a_broken_fence_rolls_back_the_chunk_user_writes(
    repo: JobRepository, tables: Any, backend: Any
) -> None:
    md = MetaData()
    token = Table("t_batch_fence", md, Column("token", Integer, nullable=False))
    md.drop_all(backend.engine)
    md.create_all(backend.engine)
    try:
        with backend.engine.begin() as conn:
            conn.execute(insert(token), {"token": 1})

        def process(item: int) -> int:
            if item == 12:  # another node takes the partition over while this one runs
                with backend.engine.begin() as conn:
                    conn.execute(update(token).values(token=2))
            return item

        step = ChunkStep(
            "fenced",
            reader=IterableItemReader(range(30)),
            processor=process,
            writer=_out_writer(tables),
            chunk_size=5,
        )
        params = _params()
        je = repo.create_job_execution(repo.create_job_instance("fence", params), params)
        se = repo.create_step_execution(je, "fenced")
        se.fence = _TokenFence(token)
        runtime = BatchRuntime(repo, LocalPartitionHandler())
        with pytest.raises(FencedError, match="token moved"):
            step.execute(se, runtime)
        assert tables.out_items() == list(range(10)), "the fenced chunk's writes rolled back"
        stored = repo.get_step_execution(se.id)
        assert stored is not None
        assert stored.status is BatchStatus.STARTED, "a fenced writer changes nothing"
        assert stored.write_count == 10 and stored.commit_count == 2
    finally:
        md.drop_all(backend.engine)


class _Unreachable:
    """A fence whose final write cannot land: the execution lost it (``fenced``), or the
    database is away and the node, fenced meanwhile, gives up repeating it (``away``)."""

    def __init__(self, final: str) -> None:
        self.final = final

    def hold(self, conn: Any) -> None:
        """The step's start lands."""

    def finish(self, conn: Any, execution: Any) -> None:
        if self.final == "fenced":
            raise FencedError("the node is fenced")
        raise OperationalError("UPDATE ...", {}, ConnectionError("Lost connection"))


class _LostOnTheWay(Step):
    """A step whose work learns that its execution lost its fence (a master's wait for its
    partitions once its node is fenced: MastershipLostError)."""

    def do_execute(self, step_execution: StepExecution, runtime: BatchRuntime) -> None:
        raise FencedError("node n1 is no longer the master of job execution 1 (epoch 1)")


@pytest.mark.parametrize("final", ["fenced", "away"])
def test_a_step_that_lost_its_fence_neither_fails_nor_tells_its_listeners(
    repo: JobRepository, final: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Galera bounce of the launcher's node (longer than unreachable_threshold): the launcher
    # fenced itself while the database was away; its master step met MastershipLostError, logged
    # 'step ... failed', told after_step the step FAILED, then its final write gave up on the
    # connection error, and the job logged 'job ... failed: OperationalError' (and told
    # after_job FAILED) though another node took the job over and completed it.
    told: list[BatchStatus] = []
    listener = type("L", (), {"after_step": staticmethod(lambda se: told.append(se.status))})()
    step = _LostOnTheWay("master", listeners=[listener])
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("lost", params), params)
    se = repo.create_step_execution(je, "master")
    se.fence = _Unreachable(final)
    runtime = BatchRuntime(repo, LocalPartitionHandler())
    with caplog.at_level("WARNING"), pytest.raises(FencedError, match="no longer the master"):
        step.execute(se, runtime)
    assert told == [], "its new owner ends the step and tells the listeners"
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    stored = repo.get_step_execution(se.id)
    assert stored is not None and stored.status is BatchStatus.STARTED


def test_a_step_and_a_job_failed_by_a_database_error_say_so_in_one_line(
    launcher: JobLauncher, caplog: pytest.LogCaptureFixture
) -> None:
    # A Galera bounce: a partition's chunk gave up on a lost connection and its worker logged
    # 'step ... failed: (pymysql.err.OperationalError) (2003, ...)' and SQLAlchemy's
    # '(Background on this error at: ...)' on a second line.
    def lost(ctx: ChunkContext) -> RepeatStatus:
        raise OperationalError("INSERT INTO ledger ...", {}, ConnectionError("Lost connection"))

    with caplog.at_level("WARNING"):
        execution = launcher.run(Job("lost", [TaskletStep("t", lost)]), _params())
    assert execution.status is BatchStatus.FAILED
    said = [r.getMessage() for r in caplog.records if ") failed: " in r.getMessage()]
    assert said and all("\n" not in line for line in said), said
    assert all("ConnectionError: Lost connection" in line for line in said), said


def test_terminate_only_stops_at_a_chunk_boundary_and_restart_resumes(
    launcher: JobLauncher, repo: JobRepository, tables: Any
) -> None:
    stop: dict[str, int | None] = {"at": 7}
    seen: list[StepExecution] = []

    def reader(se: StepExecution) -> IterableItemReader:
        seen.append(se)
        return IterableItemReader(range(20))

    def process(item: int) -> int:
        if item == stop["at"]:
            seen[-1].terminate_only = True
        return item

    step = ChunkStep(
        "stoppable", reader=reader, processor=process, writer=_out_writer(tables), chunk_size=5
    )
    job = Job("stoppable", [step])
    first = launcher.run(job, _params())
    assert first.status is BatchStatus.STOPPED
    assert repo.get_step_executions(first)[0].status is BatchStatus.STOPPED
    assert tables.out_items() == list(range(10)), "the chunk in flight still commits"
    stop["at"] = None
    assert launcher.run(job, _params()).status is BatchStatus.COMPLETED
    assert tables.out_items() == list(range(20)) and tables.duplicates() == []


def test_split_in_a_given_transaction_commits_nothing_itself(
    repo: JobRepository, backend: Any
) -> None:
    worker = ChunkStep("w", reader=IterableItemReader([]), writer=ListItemWriter())
    step = PartitionStep("p", worker, IntegerRangePartitioner(0, 40))
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("split", params), params)
    master = repo.create_step_execution(je, "p")
    runtime = BatchRuntime(repo, LocalPartitionHandler())
    with pytest.raises(RuntimeError), backend.engine.begin() as conn:
        works = step.split(master, 4, runtime, conn)
        assert [w.name for w in works] == [
            "range-0-10",
            "range-10-20",
            "range-20-30",
            "range-30-40",
        ]
        raise RuntimeError("the caller rolls back")
    assert [s.step_name for s in repo.get_step_executions(je)] == ["p"]
    master = repo.get_step_execution(master.id)  # the context update rolled back too
    assert master is not None and "dbcluster.partition.names" not in master.execution_context
    works = step.split(master, 2, runtime)
    assert [w.step_execution.step_name for w in works] == ["w:range-0-20", "w:range-20-40"]
    assert all(w.transferable for w in works)
    assert works[1].step_execution.execution_context == {"lo": 20, "hi": 40}
