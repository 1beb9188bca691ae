"""The SQL job repository on every backend."""

from __future__ import annotations

from typing import Any

import pytest

from dbcluster.batch import (
    BatchStatus,
    ExecutionContext,
    JobParameters,
    JobRepository,
    OptimisticLockingFailureError,
)
from dbcluster.dialects import get_provider


def _params() -> JobParameters:
    return JobParameters.parse(["run.date(date)=2024-01-01", "-attempt(int)=1"])


def test_create_and_find_executions(repo: JobRepository) -> None:
    params = _params()
    instance = repo.create_job_instance("job", params)
    assert repo.get_job_instance("job", params) == instance
    assert repo.get_job_instance("job", JobParameters.parse(["run.date(date)=2024-01-02"])) is None
    je = repo.create_job_execution(instance, params, ExecutionContext({"k": "v"}))
    loaded = repo.get_job_execution(je.id)
    assert loaded is not None
    assert loaded.parameters == params and loaded.status is BatchStatus.STARTING
    assert loaded.execution_context == {"k": "v"}
    assert repo.find_running_job_executions(instance)[0].id == je.id

    first = repo.create_step_execution(je, "a", ExecutionContext({"x": 1}))
    parts = repo.create_step_executions(
        je, [(f"w:p{i}", ExecutionContext({"i": i})) for i in range(7)]
    )
    assert len({p.id for p in parts}) == 7
    listed = repo.get_step_executions(je)
    assert [s.step_name for s in listed] == ["a", *[f"w:p{i}" for i in range(7)]]
    assert [s.execution_context["i"] for s in listed[1:]] == list(range(7))
    one = repo.get_step_execution(parts[3].id)
    assert one is not None and one.step_name == "w:p3"
    assert one.job_execution.id == je.id and one.job_execution.parameters == params
    assert repo.get_last_step_execution(instance, "a").id == first.id  # type: ignore[union-attr]

    je.status = BatchStatus.FAILED
    repo.update_job_execution(je)
    je2 = repo.create_job_execution(instance, params)
    assert repo.get_last_job_execution("job", params).id == je2.id  # type: ignore[union-attr]
    second = repo.create_step_execution(je2, "a")
    assert repo.get_last_step_execution(instance, "a").id == second.id  # type: ignore[union-attr]
    assert repo.count_step_executions(instance, "a") == 2
    assert [e.id for e in repo.get_job_executions(instance)] == [je2.id, je.id]


def test_optimistic_locking_rejects_a_stale_update(repo: JobRepository) -> None:
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("job", params), params)
    se = repo.create_step_execution(je, "step")
    mine = repo.get_step_execution(se.id)
    theirs = repo.get_step_execution(se.id)
    assert mine is not None and theirs is not None
    theirs.read_count = 5
    repo.update_step_execution(theirs)
    mine.read_count = 99
    with pytest.raises(OptimisticLockingFailureError, match=rf"step execution {se.id}"):
        repo.update_step_execution(mine)
    stored = repo.get_step_execution(se.id)
    assert stored is not None and stored.read_count == 5 and stored.version == 1

    stale_job = repo.get_job_execution(je.id)
    assert stale_job is not None
    je.status = BatchStatus.STARTED
    repo.update_job_execution(je)
    stale_job.status = BatchStatus.FAILED
    with pytest.raises(OptimisticLockingFailureError, match=rf"job execution {je.id}"):
        repo.update_job_execution(stale_job)
    assert repo.get_job_execution(je.id).status is BatchStatus.STARTED  # type: ignore[union-attr]


def test_write_methods_join_a_given_transaction(repo: JobRepository, backend: Any) -> None:
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("job", params), params)
    se = repo.create_step_execution(je, "step")
    with pytest.raises(RuntimeError), backend.engine.begin() as conn:
        se.write_count = 7
        repo.update_step_execution(se, conn)
        repo.create_step_executions(je, [("w:a", None), ("w:b", None)], conn)
        raise RuntimeError("roll back")
    stored = repo.get_step_execution(se.id)
    assert stored is not None and stored.write_count == 0 and stored.version == 0
    assert [s.step_name for s in repo.get_step_executions(je)] == ["step"]


def test_counters_and_contexts_survive_a_new_engine(repo: JobRepository, backend: Any) -> None:
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("job", params), params)
    se = repo.create_step_execution(je, "step")
    big = "x" * 5000  # longer than short_context: stored in serialized_context
    se.execution_context.put("reader.last_key", 41)
    se.execution_context.put("big", big)
    se.execution_context.put("nested", {"a": [1, 2.5, None, True]})
    se.read_count, se.write_count, se.filter_count, se.commit_count = 10, 8, 2, 3
    se.rollback_count, se.read_skip_count, se.process_skip_count, se.write_skip_count = 1, 1, 2, 3
    se.status = BatchStatus.FAILED
    repo.update_step_execution_context(se)
    repo.update_step_execution(se)
    je.execution_context.put("job.key", "value")
    repo.update_job_execution_context(je)

    engine = backend.new_engine()
    try:
        fresh = JobRepository(engine).get_step_execution(se.id)
        assert fresh is not None
        assert fresh.counters() == se.counters()
        assert fresh.status is BatchStatus.FAILED and fresh.version == se.version
        assert fresh.execution_context["reader.last_key"] == 41
        assert fresh.execution_context["big"] == big
        assert fresh.execution_context["nested"] == {"a": [1, 2.5, None, True]}
        assert fresh.job_execution.execution_context == {"job.key": "value"}
        assert fresh.job_execution.parameters == params
    finally:
        engine.dispose()


def test_a_step_and_its_context_are_written_together_or_not_at_all(
    repo: JobRepository, backend: Any
) -> None:
    """``update_step_execution(context=True)``: one statement on PostgreSQL (a writable CTE),
    MySQL and MariaDB (a two-table UPDATE), two elsewhere; either way both land, and a stale
    version lets neither land."""
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("job", params), params)
    se = repo.create_step_execution(je, "step")
    provider = get_provider(backend.engine)
    assert (repo.combined.update_step_and_context is not None) == (
        provider.supports_writable_cte or provider.supports_multi_table_update
    )
    se.execution_context.put("reader.last_key", 7)
    se.read_count = 3
    repo.update_step_execution(se, context=True)
    assert not se.execution_context.dirty and se.version == 1
    stored = repo.get_step_execution(se.id)
    assert stored is not None and stored.read_count == 3 and stored.version == 1
    assert stored.execution_context["reader.last_key"] == 7

    stale = repo.get_step_execution(se.id)
    assert stale is not None
    repo.update_step_execution(se)  # someone else moves the version on
    stale.execution_context.put("reader.last_key", 99)
    stale.read_count = 99
    with pytest.raises(OptimisticLockingFailureError, match=rf"step execution {se.id}"):
        with backend.engine.begin() as conn:
            repo.update_step_execution(stale, conn, context=True)
    assert stale.execution_context.dirty and stale.version == 1
    stored = repo.get_step_execution(se.id)
    assert stored is not None and stored.read_count == 3 and stored.version == 2
    assert stored.execution_context["reader.last_key"] == 7


def test_an_unchanged_context_is_written_whatever_the_driver_counts(backend: Any) -> None:
    """A chunk whose context is dirty but serializes the same is written, not refused as a
    stale update: on every database, and on MySQL and MariaDB also when the connection counts
    changed rows, not matched ones (no ``CLIENT_FOUND_ROWS``: a user's own ``client_flag``)."""
    from sqlalchemy import create_engine

    url = backend.engine.url.render_as_string(hide_password=False)
    counts_changed_rows = get_provider(backend.engine).supports_multi_table_update
    engine = (
        create_engine(url, connect_args={"client_flag": 0})
        if counts_changed_rows
        else backend.new_engine()
    )
    try:
        repo = JobRepository(engine)
        params = _params()
        je = repo.create_job_execution(repo.create_job_instance("job", params), params)
        se = repo.create_step_execution(je, "step")
        se.execution_context.put("k", 1)
        repo.update_step_execution(se, context=True)
        se.execution_context.dirty = True  # marked dirty, same JSON
        se.read_count = 2
        repo.update_step_execution(se, context=True)
        stored = repo.get_step_execution(se.id)
        assert stored is not None and stored.version == 2 and stored.read_count == 2
    finally:
        engine.dispose()


def test_ids_without_returning(
    repo: JobRepository, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MySQL has no RETURNING: ids come from the cursor (single rows) or are read back (bulk)."""
    if backend.engine.dialect.name not in ("sqlite", "mysql", "mariadb"):
        pytest.skip("only drivers with a cursor lastrowid can go without RETURNING")
    dialect = backend.engine.dialect
    monkeypatch.setattr(dialect, "insert_returning", False)
    monkeypatch.setattr(dialect, "insert_executemany_returning", False)
    monkeypatch.setattr(dialect, "insert_executemany_returning_sort_by_parameter_order", False)
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("job", params), params)
    single = repo.create_step_execution(je, "single", ExecutionContext({"n": -1}))
    parts = repo.create_step_executions(
        je, [(f"w:p{i}", ExecutionContext({"n": i})) for i in range(5)]
    )
    for se in [single, *parts]:
        stored = repo.get_step_execution(se.id)
        assert stored is not None and stored.step_name == se.step_name
        assert stored.execution_context["n"] == se.execution_context["n"]


def test_a_step_created_alone_with_its_context_reads_back_as_made(
    repo: JobRepository, backend: Any
) -> None:
    """One step execution and its context (on PostgreSQL one statement, insert_child_row): the
    row and the context, short and long, are what a step created among many gets."""
    params = _params()
    je = repo.create_job_execution(repo.create_job_instance("job", params), params)
    for name, context in (
        ("short", ExecutionContext({"k": 1})),
        ("long", ExecutionContext({"big": "y" * 5000})),
        ("none", None),
    ):
        (alone,) = repo.create_step_executions(je, [(name, context)], started=True)
        made = repo.get_step_execution(alone.id)
        assert made is not None and made.step_name == name and made.version == 0
        assert made.status is BatchStatus.STARTED and made.start_time is not None
        assert dict(made.execution_context) == dict(context or {})
        assert not made.execution_context.dirty
    names = [s.step_name for s in repo.get_step_executions(je)]
    assert sorted(names) == ["long", "none", "short"]


@pytest.mark.parametrize("count", [1, 3])
def test_partitions_are_created_with_their_masters_context(
    repo: JobRepository, backend: Any, count: int
) -> None:
    """A partitioned step's own context (naming its partitions) is written with them: in the
    statement that creates them where the database can (then ``count`` partitions cost the
    statements they cost without it); a context that no longer exists is refused and nothing is
    created."""
    from sqlalchemy import delete, event, func, select

    from dbcluster.schema import step_execution, step_execution_context

    instance = repo.create_job_instance("ctx-of", _params())
    execution = repo.create_job_execution(instance, _params())
    master = repo.create_step_execution(execution, "m")
    names = [f"w:p{i}" for i in range(count)]
    master.execution_context.put("names", names)
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    event.listen(repo.engine, "before_cursor_execute", record)
    try:
        made = repo.create_step_executions(execution, [(n, None) for n in names], context_of=master)
    finally:
        event.remove(repo.engine, "before_cursor_execute", record)
    assert [s.step_name for s in made] == names
    assert not master.execution_context.dirty
    stored = repo.get_step_execution(master.id)
    assert stored is not None and stored.execution_context.get("names") == names
    updates = [s for s in sent if s.lstrip().upper().startswith("UPDATE")]
    if get_provider(backend.engine).supports_writable_cte:
        assert not updates and len(sent) == (1 if count == 1 else 2), sent
    else:
        assert len(updates) == 1, sent

    with backend.engine.begin() as conn:
        conn.execute(
            delete(step_execution_context).where(
                step_execution_context.c.step_execution_id == master.id
            )
        )
    master.execution_context.put("names", ["again"])
    with pytest.raises(OptimisticLockingFailureError, match="no longer exists"):
        repo.create_step_executions(execution, [("w:again", None)], context_of=master)
    with backend.engine.connect() as conn:
        again = select(func.count()).where(step_execution.c.step_name == "w:again")
        assert conn.execute(again).scalar_one() == 0


def test_what_a_partitioned_step_aggregates_reads_as_its_partitions_would(
    repo: JobRepository,
) -> None:
    """The outcome the cluster's handler reads of a step's partitions (sums, and the ones that
    did not complete) is what aggregating the partitions' step executions gives, across more
    than one IN list; the step aggregates it to the same master and the same failure."""
    from dbcluster.batch import (
        IntegerRangePartitioner,
        PartitionFailedError,
        PartitionStep,
        TaskletStep,
    )
    from dbcluster.batch.domain import PartitionsEnded
    from dbcluster.batch.status import EXIT_NODE_LOST, ExitStatus
    from dbcluster.inlists import IN_LIST_MAX

    instance = repo.create_job_instance("ended", _params())
    execution = repo.create_job_execution(instance, _params())
    count = IN_LIST_MAX + 7
    made = repo.create_step_executions(execution, [(f"w:p{i:04d}", None) for i in range(count)])
    outcomes = {
        3: (BatchStatus.FAILED, ExitStatus("FAILED")),
        IN_LIST_MAX + 2: (BatchStatus.FAILED, ExitStatus(EXIT_NODE_LOST)),
        IN_LIST_MAX + 5: (BatchStatus.STARTED, ExitStatus("EXECUTING")),
        11: (BatchStatus.STOPPED, ExitStatus("STOPPED")),
    }
    for i, se in enumerate(made):
        se.status, se.exit_status = outcomes.get(i, (BatchStatus.COMPLETED, ExitStatus.COMPLETED))
        se.read_count, se.write_count, se.commit_count = i, 2 * i, 1
        se.filter_count = i % 3
        repo.update_step_execution(se)
    ids = [se.id for se in made]

    # An exit code stored as NULL (Oracle stores '' so) reads as UNKNOWN, as a step reads it.
    from sqlalchemy import update

    from dbcluster.schema import step_execution

    with repo.engine.begin() as conn:
        conn.execute(
            update(step_execution)
            .where(step_execution.c.step_execution_id == made[11].id)
            .values(exit_code=None)
        )
    read = repo.partitions_ended(ids)
    expected = PartitionsEnded.of(repo.get_step_executions_by_ids(execution, ids))
    assert ("w:p0011", BatchStatus.STOPPED, "UNKNOWN") in read.unfinished
    assert read == expected
    # Not one run of consecutive ids (read per IN list): the same as the step executions give.
    some = [i for n, i in enumerate(ids) if n % 5 != 1]
    assert repo.partitions_ended(some) == PartitionsEnded.of(
        repo.get_step_executions_by_ids(execution, some)
    )
    assert read.count == count and read.counters["write_count"] == count * (count - 1)
    assert [name for name, *_ in read.unfinished] == [f"w:p{i:04d}" for i in sorted(outcomes)]
    assert repo.partitions_ended([]) == PartitionsEnded(0, read.counters.fromkeys(read.counters, 0))

    step = PartitionStep("m", TaskletStep("w", lambda ctx: None), IntegerRangePartitioner(0, 1))
    masters = [repo.create_step_execution(execution, f"m{i}") for i in range(2)]
    errors = []
    given_both = (read, repo.get_step_executions_by_ids(execution, ids))
    for master, given in zip(masters, given_both, strict=True):
        with pytest.raises(PartitionFailedError) as raised:
            step.aggregate(master, given)
        errors.append((str(raised.value), raised.value.exit_code, master.counters()))
    assert errors[0] == errors[1]
    assert f"4 of {count} partitions" in errors[0][0]

    for se in made:
        if se.status is not BatchStatus.COMPLETED:
            se.status, se.exit_status = BatchStatus.COMPLETED, ExitStatus.COMPLETED
            repo.update_step_execution(se)
    done = repo.partitions_ended(ids)
    assert done.unfinished == () and done.counters == read.counters
    step.aggregate(masters[0], done)
    assert masters[0].status is not BatchStatus.FAILED
    assert masters[0].read_count == sum(range(count))
