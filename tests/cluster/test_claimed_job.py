"""A claim reads back the job execution of each partition it won, with its parameters, where the
database can aggregate them into the partition's row (PostgreSQL): a worker's first partition of
a job then starts without a read of its job. What it reads back is what the job's read gives."""

from __future__ import annotations

from typing import Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, utcnow
from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.repository import JobRepository
from dbcluster.dialects.base import CLAIMED_JOB_PREFIX
from dbcluster.testing.app import FAST_SETTINGS
from dbcluster.testing.backends import Backend
from dbcluster.testing.suite.provider_helpers import _register, _store

NODE = "claimed-job-node"


def _placed(engine: Any, store: Any, params: JobParameters, context: dict[str, Any]) -> int:
    """A job execution with ``params`` and a job context, and two partitions placed on NODE."""
    repository, provider = JobRepository(engine), store.provider
    execution = repository.create_instance_and_execution(
        "claimed-job", params, ExecutionContext(context)
    )
    master = repository.create_step_execution(execution, "claimed.master")
    workers = [
        repository.create_step_execution(execution, f"claimed.worker:p{i}") for i in range(2)
    ]
    with engine.begin() as conn:
        conn.execute(
            provider.insert_coordination(execution.id, NODE, "STARTED", master.id, "claimed.worker")
        )
        conn.execute(
            provider.insert_partitions(),
            [
                {
                    "step_execution_id": w.id,
                    "job_execution_id": execution.id,
                    "master_step_execution_id": master.id,
                    "partition_name": f"p{i}",
                    "assigned_node": NODE,
                    "transferable": True,
                }
                for i, w in enumerate(workers)
            ],
        )
    return [w.id for w in workers]  # type: ignore[return-value]


def _same(built: JobExecution, read: JobExecution) -> None:
    assert built.id == read.id
    assert built.job_instance == read.job_instance
    assert built.parameters == read.parameters
    assert list(built.parameters.parameters()) == list(read.parameters.parameters())
    assert {n: (p.value, p.identifying) for n, p in built.parameters.parameters().items()} == {
        n: (p.value, p.identifying) for n, p in read.parameters.parameters().items()
    }
    assert (built.status, built.exit_status, built.version) == (
        read.status,
        read.exit_status,
        read.version,
    )
    assert (built.create_time, built.start_time, built.end_time, built.last_updated) == (
        read.create_time,
        read.start_time,
        read.end_time,
        read.last_updated,
    )
    assert built.execution_context.to_dict() == read.execution_context.to_dict()


def test_a_claim_reads_back_the_job_as_its_read_gives_it(backend: Backend) -> None:
    """Parameters of every type (one not identifying, names out of order), a job context; and a
    job of no parameters. Where the claim cannot read the job back, the row says nothing."""
    engine = backend.engine
    store = _store(engine, backend.provider)
    _register(engine, backend.provider, NODE)
    repository = JobRepository(engine)
    cases = [
        (
            JobParameters.parse(
                [
                    "zeta=last",
                    "run.date(date)=2024-02-29",
                    "at(datetime)=2024-02-29T13:14:15",
                    "count(int)=5",
                    "ratio(float)=0.25",
                    "flag(bool)=true",
                    "-attempt(int)=2",
                ]
            ),
            {"shared": {"a": [1, 2]}, "name": "x"},
        ),
        (JobParameters({}), {}),
    ]
    for params, context in cases:
        ids = _placed(engine, store, params, context)
        won = store.claim(NODE, 0, ids, utcnow(), with_jobs=True)
        assert sorted(w.partition.step_execution_id for w in won) == sorted(ids)
        read = repository.get_job_execution(won[0].partition.job_execution_id)
        assert read is not None
        for claimed in won:
            built = repository.job_execution_from_row(claimed.row, CLAIMED_JOB_PREFIX)
            if backend.name != "postgresql":
                assert built is None
                continue
            assert built is not None, "the claim did not read the job back"
            _same(built, read)


def _job_reads_of_one_run(backend: Backend, make_cluster: Any, run: int, *, polled: bool) -> None:
    """Launch ``ledger`` once on a master and one worker (``polled``: the worker's wake-ups
    only wake its poller, so a poll finds every partition): on PostgreSQL the worker reads no
    job execution while the job runs; elsewhere it reads the job once."""
    master = make_cluster(work=False, settings=FAST_SETTINGS)
    worker = make_cluster(settings=FAST_SETTINGS)
    if polled:
        poller = worker.node.worker
        assert poller is not None
        poller.offer = lambda node_id, ids: poller.wake()  # type: ignore[method-assign]
    repository = worker.node.repository
    reads: list[int] = []
    read = repository.get_job_execution

    def reading(job_execution_id: int, *args: Any, **kwargs: Any) -> Any:
        reads.append(job_execution_id)
        return read(job_execution_id, *args, **kwargs)

    repository.get_job_execution = reading  # type: ignore[method-assign]
    execution = master.launch("ledger", {"run": run})
    assert execution.status.value == "COMPLETED", execution.exit_status
    if backend.name == "postgresql":
        assert reads == [], reads
    else:
        assert len(reads) == 1, reads


def test_a_workers_first_partition_of_a_job_reads_no_job(
    backend: Backend, make_cluster: Any
) -> None:
    """On PostgreSQL the worker builds the job from its claim: no read of the job execution
    happens on its node while the job runs; elsewhere it reads the job once."""
    _job_reads_of_one_run(backend, make_cluster, 7, polled=False)


def test_a_first_partition_found_by_a_poll_reads_no_job_either(
    backend: Backend, make_cluster: Any
) -> None:
    """The same where the worker's poll finds the partitions before a wake-up names them (a
    poll that ran before the notification arrived, under load; or a node that only polls):
    the poll reads each partition's job too, and the claim reads back the jobs the node does
    not know yet."""
    _job_reads_of_one_run(backend, make_cluster, 8, polled=True)


def test_only_a_claim_asked_for_jobs_reads_them_and_the_usual_one_stays_short(
    backend: Backend,
) -> None:
    """A poll's claim (partitions of jobs the node mostly knows) reads no job and stays under
    psycopg's 4,096-character parse cache, as a slot's final write does; only a wake-up's
    offers are claimed with their jobs."""
    from sqlalchemy import bindparam

    from dbcluster.prebuilt import Prebuilt

    engine, provider = backend.engine, backend.provider
    store = _store(engine, provider)
    _register(engine, provider, NODE)
    ids = _placed(engine, store, JobParameters({"run": 1}), {})
    won = store.claim(NODE, 0, ids, utcnow())
    assert len(won) == 2
    assert all(JobRepository.job_execution_from_row(w.row, CLAIMED_JOB_PREFIX) is None for w in won)
    claim = provider.claim_and_start(
        bindparam("b_node"),
        bindparam("b_ids", expanding=True),
        bindparam("b_started_at"),
        bindparam("b_load"),
    )
    if claim is None:
        return  # a claim of five statements
    for count in (1, 4):
        built = Prebuilt.build(claim, engine.dialect, {"b_ids": count})
        sql = built.sql if built is not None else str(claim.compile(dialect=engine.dialect))
        assert CLAIMED_JOB_PREFIX + "job_name" not in sql
        assert len(sql) <= 4096, f"{len(sql)} characters"
