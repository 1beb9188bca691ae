"""Wake-ups that carry their partitions' executions: what an idle node needs to run a partition
of a transactional step without reading it first.

A placement's wake-up names the partitions it placed on a node (``"12,13,14"``: the node claims
them, then runs what it won). Where every partition placed on the node is of a tasklet step
declared ``transactional`` (every effect of a call in the call's transaction: see
:func:`~dbcluster.batch.grouped.groupable`) and all of it fits in the payload, the wake-up
carries, as JSON, the job execution and each partition's step execution as its creating
transaction wrote them. An idle node then runs such a partition at once, and its claim rides in
the partition's first transaction (see ``docs/CONTRACTS.md``, "A partition placed with its
execution"); any other node, or the same node when busy, claims the ids as usual.

The JSON names its format (``"v"``); a payload this code cannot read names no partitions with
executions, only the ids it can find (the node claims those).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, JobInstance, StepExecution, utcnow
from dbcluster.batch.parameters import JobParameter, JobParameters, parse_value
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.cluster.store import PendingPartition, offered_ids

#: The payload format this code writes and reads (2: parameters as [name, type, text,
#: identifying], which read back as they were; 1 carried ``to_strings()``, which ``parse``
#: does not read back for every name).
FORMAT = 2
#: A placed partition's attempt (a new partition row's: see ``_placed_values``).
FIRST_ATTEMPT = 1


@dataclass(frozen=True)
class PlacedPartition:
    """A partition a wake-up carried with its execution: the node may run it before it is
    claimed (the claim then rides in its first transaction)."""

    partition: PendingPartition
    step_execution: StepExecution


@dataclass(frozen=True)
class Offer:
    """What one wake-up names: the ids placed on the node, and of those the ones it carried
    with their executions (empty: ids only)."""

    ids: list[int]
    placed: list[PlacedPartition]


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _read_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def job_part(job: JobExecution) -> dict[str, Any]:
    """The job execution as a wake-up carries it (what a worker step reads of its job)."""
    instance = job.job_instance
    return {
        "id": job.id,
        "instance": [instance.id, instance.job_name, instance.job_key, instance.version],
        "parameters": [
            [name, p.type_name, p.text, p.identifying]
            for name, p in job.parameters.parameters().items()
        ],
        "status": job.status.value,
        "exit": [job.exit_status.code, job.exit_status.description],
        "created": _time(job.create_time),
        "started": _time(job.start_time),
        "version": job.version,
        "context": job.execution_context.to_json(),
    }


def partition_part(
    step_execution_id: int | None,
    *,
    master_step_execution_id: int,
    partition_name: str,
    transferable: bool,
    max_attempts: int,
    worker_step_name: str,
    step_name: str,
    context: ExecutionContext,
) -> list[Any]:
    """One partition as a wake-up carries it (``step_execution_id`` None: a placeholder the
    database fills in, see :func:`split_around_id`)."""
    return [
        step_execution_id,
        master_step_execution_id,
        partition_name,
        FIRST_ATTEMPT,
        transferable,
        max_attempts,
        worker_step_name,
        step_name,
        context.to_json(),
    ]


def offer_text(job: dict[str, Any], partitions: Sequence[list[Any]]) -> str:
    """The payload of a wake-up carrying these partitions of ``job`` (see :func:`job_part`)."""
    return json.dumps(
        {"v": FORMAT, "job": job, "partitions": list(partitions)},
        separators=(",", ":"),
        ensure_ascii=True,
    )


#: Where a payload's partitions begin: a key of the top-level object, which no data inside a
#: JSON string can spell (its quotes would be escaped there).
_PARTITIONS = ',"partitions":[['


def split_around_id(job: dict[str, Any], partition: list[Any]) -> tuple[str, str]:
    """The payload of a wake-up carrying one partition whose step execution id only the
    statement that creates it knows: the text before and after that id (the statement puts
    the id between them; it comes first in the partition's list)."""
    head = json.dumps({"v": FORMAT, "job": job}, separators=(",", ":"), ensure_ascii=True)
    rest = json.dumps(list(partition[1:]), separators=(",", ":"), ensure_ascii=True)
    return head[:-1] + _PARTITIONS, "," + rest[1:] + "]}"


def fits(text: str, limit: int) -> bool:
    """Whether a payload fits in ``limit`` bytes."""
    return len(text.encode("utf-8")) <= limit


def read_offer(payload: str) -> Offer:
    """What a wake-up's payload names (ids only, for a payload of ids or one this code cannot
    read as executions)."""
    if not payload.startswith("{"):
        return Offer(offered_ids(payload), [])
    try:
        data = json.loads(payload)
        if data.get("v") != FORMAT:
            raise ValueError(f"format {data.get('v')!r}")
        job = _job(data["job"])
        placed = [_placed(job, entry) for entry in data["partitions"]]
    except Exception:  # noqa: BLE001 - a payload of another release: the ids it names, if any
        try:
            return Offer([int(entry[0]) for entry in json.loads(payload).get("partitions", ())], [])
        except Exception:  # noqa: BLE001 - nothing to take from it: the node polls
            return Offer([], [])
    return Offer([p.partition.step_execution_id for p in placed], placed)


def _job(part: dict[str, Any]) -> JobExecution:
    instance_id, job_name, job_key, instance_version = part["instance"]
    code, description = part["exit"]
    return JobExecution(
        id=int(part["id"]),
        job_instance=JobInstance(int(instance_id), job_name, job_key, int(instance_version)),
        parameters=JobParameters(
            {
                str(name): JobParameter(parse_value(str(kind), str(text)), bool(identifying))
                for name, kind, text, identifying in part["parameters"]
            }
        ),
        status=BatchStatus(part["status"]),
        exit_status=ExitStatus(code, description),
        create_time=_read_time(part["created"]) or utcnow(),
        start_time=_read_time(part["started"]),
        version=int(part["version"]),
        execution_context=ExecutionContext.from_json(part["context"]),
    )


def _placed(job: JobExecution, entry: list[Any]) -> PlacedPartition:
    (sid, master_id, name, attempt, transferable, max_attempts, worker_step, step_name, ctx) = entry
    partition = PendingPartition(
        step_execution_id=int(sid),
        job_execution_id=job.id,
        master_step_execution_id=int(master_id),
        partition_name=str(name),
        attempt=int(attempt),
        transferable=bool(transferable),
        worker_step_name=str(worker_step),
        max_attempts=int(max_attempts),
    )
    # As its creating transaction wrote it (STARTING, version 0); its start is recorded with
    # its first transaction (see Executor.run_placed).
    step_execution = StepExecution(
        id=int(sid),
        step_name=str(step_name),
        job_execution=job,
        version=0,
        execution_context=ExecutionContext.from_json(ctx),
    )
    return PlacedPartition(partition, step_execution)
