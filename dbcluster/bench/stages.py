"""Where a launch's latency goes: the time each launch reaches the points on its way from the
launch call to its partition's body, and the median of each stage.

The latency scenario's master (this process) and its worker processes record ``time.time()``
at fault points (:mod:`dbcluster.points`: free unless a handler is installed, as here):

- ``master.after_create_execution`` (the master): the transaction that created the execution
  and placed its partition committed, as the master saw its ``COMMIT`` acknowledged;
- ``node.offered`` (a worker): its listener received the wake-up naming the partition (absent
  where the database has no LISTEN/NOTIFY: the partition is then found by a poll);
- ``node.between_poll_and_claim``: the worker's claim is about to go out;
- ``node.claimed``: the claim committed and its rows came back (the poller's claims; a slot
  that hands itself on claims in its final write, which no idle launch does);
- ``node.placed_run``: a partition the wake-up carried with its execution begins on the idle
  node without a claim (its first transaction claims it: see ``dbcluster/cluster/placed.py``);

and the body writes its own clock (``bench_started``). All on one host, so the processes'
clocks agree. A worker process records when ``DBCLUSTER_BENCH_STAGES`` is set (see
:mod:`dbcluster.bench.app`); its counts file, rewritten every 0.2 s
(:func:`dbcluster.bench.counting.start_dumping`), carries its marks as ``stages``.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from dbcluster import points
from dbcluster.bench import counting

#: The worker's points, in the order a partition passes them.
WORKER_POINTS = ("node.offered", "node.between_poll_and_claim", "node.claimed", "node.placed_run")
#: The master's point.
CREATED = "master.after_create_execution"
#: Where a worker's counts file carries its marks.
SECTION = "stages"
#: The stages reported, each (name, from, to) over the marks of one launch.
STAGES = (
    ("launch_to_created", "launch", CREATED),
    ("launch_to_offered", "launch", "node.offered"),
    ("offered_to_claim_sent", "node.offered", "node.between_poll_and_claim"),
    ("claim", "node.between_poll_and_claim", "node.claimed"),
    ("claimed_to_body", "node.claimed", "body"),
    # A partition run as its wake-up carried it (claimed by its first transaction): no claim.
    ("offered_to_placed_run", "node.offered", "node.placed_run"),
    ("placed_run_to_body", "node.placed_run", "body"),
)


class Marks:
    """The times this process reached the recorded points: ``(point, time, ids, node)`` each,
    ids being the partitions' step execution ids and node the worker's node id (a worker's
    points), or the job execution's id and None (the master's)."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, list[int], str | None]] = []
        #: The handlers installed at the worker's points, by point.
        self.handlers = {point: self._worker_handler(point) for point in WORKER_POINTS}
        #: The marks encoded so far, each in JSON (see :meth:`encoded`).
        self._encoded: list[str] = []
        self._encoding = threading.Lock()

    def _worker_handler(self, point: str) -> Any:
        def handler(node_id: str = "", partitions: Iterable[Any] = (), **_: Any) -> None:
            self.marks.append((point, time.time(), [_id(p) for p in partitions], node_id))

        return handler

    def created(self, job_execution: Any, **_: Any) -> None:
        self.marks.append((CREATED, time.time(), [int(job_execution.id)], None))

    def snapshot(self) -> list[tuple[str, float, list[int], str | None]]:
        return list(self.marks)

    def encoded(self) -> counting.Encoded:
        """The marks as a JSON list, for the counts file: only those new since the last call
        are encoded (a worker dumps every 0.2 s; encoding all of them each time took a third
        of a worker's interpreter time over 3,000 launches)."""
        with self._encoding:  # the dumping thread's and the one at exit
            done, marks = len(self._encoded), self.marks
            self._encoded.extend(json.dumps(mark) for mark in marks[done : len(marks)])
            return counting.Encoded(f"[{', '.join(self._encoded)}]")


def _id(partition: Any) -> int:
    """A step execution id, or a claimed partition's (``node.claimed`` passes those)."""
    inner = getattr(partition, "partition", None)
    return int(inner.step_execution_id if inner is not None else partition)


def record_worker() -> Marks:
    """In a worker process, for its life: record the worker's points, which its counts file
    then carries (see the module doc)."""
    marks = Marks()
    for point, handler in marks.handlers.items():
        points.install(point, handler)
    counting.also_dump(SECTION, marks.encoded)
    return marks


def stop_worker(marks: Marks) -> None:
    """Stop what :func:`record_worker` started."""
    for point, handler in marks.handlers.items():
        points.remove(point, handler)
    counting.also_dump(SECTION, None)


@contextmanager
def recording_master() -> Iterator[Marks]:
    """In the bench process, while launching: record when each creation committed."""
    marks = Marks()
    points.install(CREATED, marks.created)
    try:
        yield marks
    finally:
        points.remove(CREATED, marks.created)


def per_launch(
    launches: Sequence[tuple[float, int, int, float]],
    master: Iterable[Sequence[Any]],
    workers: Iterable[Sequence[Any]],
) -> list[dict[str, float]]:
    """Each launch's marks: ``launches`` holds (launch time, job execution id, the partition's
    step execution id, the body's time) each. The worker's marks are those of the node whose
    claim won the partition (the first ``node.claimed`` naming it): the last claim it sent for
    it before that, and the first wake-up naming it before that claim was sent (a wake-up that
    came after a poll had found the partition started nothing)."""
    created: dict[int, float] = {}
    for _, at, ids, *_node in master:
        for key in ids:
            created[int(key)] = min(float(at), created.get(int(key), float(at)))
    by_point: dict[tuple[str, int], list[tuple[float, str]]] = {}
    for point, at, ids, *node in workers:
        for key in ids:
            by_point.setdefault((point, int(key)), []).append((float(at), node[0] if node else ""))
    found = []
    for launched, job_execution_id, step_execution_id, body in launches:
        marks = {"launch": launched, "body": body}
        if job_execution_id in created:
            marks[CREATED] = created[job_execution_id]
        claims = sorted(by_point.get(("node.claimed", step_execution_id), ()))
        ran = sorted(by_point.get(("node.placed_run", step_execution_id), ()))
        if ran and not claims:
            # Run as its wake-up carried it: no claim; the first wake-up naming it before.
            ran_at, node = ran[0]
            marks["node.placed_run"] = ran_at
            _first_offer(marks, by_point, step_execution_id, node, ran_at)
        elif claims:
            claimed_at, node = claims[0]
            marks["node.claimed"] = claimed_at
            sent = [
                at
                for at, by in by_point.get(("node.between_poll_and_claim", step_execution_id), ())
                if by == node and at <= claimed_at
            ]
            if sent:
                sent_at = marks["node.between_poll_and_claim"] = max(sent)
                _first_offer(marks, by_point, step_execution_id, node, sent_at)
        found.append(marks)
    return found


def _first_offer(
    marks: dict[str, float],
    by_point: Mapping[tuple[str, int], Sequence[tuple[float, str]]],
    step_execution_id: int,
    node: str,
    until: float,
) -> None:
    """The first wake-up naming the partition that reached ``node`` by ``until`` (its claim
    sent, or its placed run begun), as the launch's ``node.offered`` mark, if any."""
    offered = [at for at, by in by_point.get(("node.offered", step_execution_id), ()) if by == node]
    offered = [at for at in offered if at <= until]
    if offered:
        marks["node.offered"] = min(offered)


def stage_medians(marks: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The median of each stage over the launches that reached both of its ends (ms), and how
    many launches each median covers."""
    out: dict[str, Any] = {}
    for name, start, end in STAGES:
        spans = [m[end] - m[start] for m in marks if start in m and end in m]
        if spans:
            out[name] = {"median_ms": round(statistics.median(spans) * 1000, 2), "n": len(spans)}
    return out
