"""Wake-ups that carry their partitions' executions (``dbcluster/cluster/offers.py``): what the
master writes is what the node reads back; a payload it cannot read names at most ids."""

from __future__ import annotations

import json
from datetime import date, datetime

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, JobInstance
from dbcluster.batch.parameters import JobParameter, JobParameters
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import offers
from dbcluster.cluster.store import offer_payload


def _job() -> JobExecution:
    return JobExecution(
        id=41,
        job_instance=JobInstance(7, "nightly", "k" * 64, 2),
        parameters=JobParameters(
            {
                "run.date": date(2026, 12, 5),
                "at": datetime(2026, 12, 5, 1, 2, 3, 456789),
                "count": 3,
                "ratio": 0.25,
                "dry": False,
                "note": "a, b = c (d)",
                "a=b (int)": 7,
                "-lead": "x",
                "tail ": "t",
                "attempt": JobParameter(2, identifying=False),
            }
        ),
        status=BatchStatus.STARTED,
        start_time=datetime(2026, 12, 5, 1, 2, 4),
        version=3,
        execution_context=ExecutionContext({"seen": [1, 2], "name": "x"}),
    )


def _part(sid: int | None, name: str = "p-1") -> list:
    return offers.partition_part(
        sid,
        master_step_execution_id=40,
        partition_name=name,
        transferable=False,
        max_attempts=1,
        worker_step_name="nightly.worker",
        step_name=f"nightly.worker:{name}",
        context=ExecutionContext({"lo": 0, "hi": 100, "ünï": "cödé"}),
    )


def test_what_the_master_writes_the_node_reads_back() -> None:
    job = _job()
    text = offers.offer_text(offers.job_part(job), [_part(42), _part(43, "p-2")])
    offer = offers.read_offer(text)
    assert offer.ids == [42, 43]
    first = offer.placed[0]
    p, se = first.partition, first.step_execution
    assert (p.step_execution_id, p.job_execution_id, p.master_step_execution_id) == (42, 41, 40)
    assert (p.partition_name, p.attempt, p.transferable, p.max_attempts) == ("p-1", 1, False, 1)
    assert p.worker_step_name == "nightly.worker"
    assert (se.id, se.step_name, se.version) == (42, "nightly.worker:p-1", 0)
    assert se.execution_context.get("ünï") == "cödé" and not se.execution_context.dirty
    read = se.job_execution
    assert read.parameters == job.parameters
    assert read.parameters.identifying() == job.parameters.identifying()
    assert (read.id, read.version, read.status) == (41, 3, BatchStatus.STARTED)
    assert read.job_instance == job.job_instance
    assert read.start_time == job.start_time
    assert read.execution_context.get("seen") == [1, 2]
    assert offer.placed[1].step_execution.job_execution is read  # one job per payload


def test_a_lone_partition_s_payload_is_built_around_its_id() -> None:
    head, tail = offers.split_around_id(offers.job_part(_job()), _part(None))
    offer = offers.read_offer(f"{head}9007199254740993{tail}")
    assert offer.ids == [9007199254740993]
    assert offer.placed[0].partition.step_execution_id == 9007199254740993


def test_ids_alone_are_read_as_before() -> None:
    offer = offers.read_offer(offer_payload([5, 6, 7], 7900))
    assert offer.ids == [5, 6, 7] and offer.placed == []


def test_a_payload_of_another_format_names_at_most_its_ids() -> None:
    text = offers.offer_text(offers.job_part(_job()), [_part(42)])
    other = json.loads(text)
    other["v"] = 99
    assert offers.read_offer(json.dumps(other)) == offers.Offer([42], [])
    broken = json.loads(text)
    broken["job"]["parameters"] = ["not a parameter"]
    assert offers.read_offer(json.dumps(broken)) == offers.Offer([42], [])
    assert offers.read_offer("{not json") == offers.Offer([], [])


def test_fits_counts_bytes_not_characters() -> None:
    assert offers.fits("é" * 10, 20) and not offers.fits("é" * 11, 21)
