"""Where a launch's latency goes: the time each launch reaches the points on its way from the
launch call to its partition's body, and the median of each stage.

The latency scenario's master (this process) and its worker processes record ``time.time()``
at fault points (:mod:`dbcluster.points`: free unless a handler is installed, as here):

- ``master.after_create_execution`` (the master): the transaction that created the execution
  and placed its partition committed, as the master saw its ``COMMIT`` acknowledged;
- ``node.offered`` (a worker): its listener received the wake-up naming the partition (absent
  where the database has no LISTEN/NOTIFY: the partition is then found by a poll);
- ``node.between_poll_and_claim``: the worker's claim is about to go out;
- ``node.claimed``: the claim committed and its rows came back;

and the body writes its own clock (``bench_started``). All on one host, so the processes'
clocks agree. A worker process records when ``DBCLUSTER_BENCH_STAGES`` is set (see
:mod:`dbcluster.bench.app`), into a file beside its counts that it rewrites every 0.2 s.
"""

from __future__ import annotations

import atexit
import json
import statistics
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dbcluster import points

#: The worker's points, in the order a partition passes them.
WORKER_POINTS = ("node.offered", "node.between_poll_and_claim", "node.claimed")
#: The master's point.
CREATED = "master.after_create_execution"
#: A worker process's stage file: its counts file's path plus this.
SUFFIX = ".stages"
#: The stages reported, each (name, from, to) over the marks of one launch.
STAGES = (
    ("launch_to_created", "launch", CREATED),
    ("launch_to_offered", "launch", "node.offered"),
    ("offered_to_claim_sent", "node.offered", "node.between_poll_and_claim"),
    ("claim", "node.between_poll_and_claim", "node.claimed"),
    ("claimed_to_body", "node.claimed", "body"),
)


class Marks:
    """The times this process reached the recorded points: ``(point, time, ids)`` each, ids
    being the partitions' step execution ids (a worker's points) or the job execution's id (the
    master's)."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, list[int]]] = []

    def worker_handler(self, point: str) -> Any:
        def handler(partitions: Iterable[Any] = (), **_: Any) -> None:
            self.marks.append((point, time.time(), [_id(p) for p in partitions]))

        return handler

    def created(self, job_execution: Any, **_: Any) -> None:
        self.marks.append((CREATED, time.time(), [int(job_execution.id)]))


def _id(partition: Any) -> int:
    """A step execution id, or a claimed partition's (``node.claimed`` passes those)."""
    inner = getattr(partition, "partition", None)
    return int(inner.step_execution_id if inner is not None else partition)


class WorkerRecording:
    """A worker process's recording (:func:`record_worker`): its marks, and a stop path."""

    def __init__(self, path: str, interval_s: float) -> None:
        self.path = path
        self.marks = Marks()
        self.handlers = [(point, self.marks.worker_handler(point)) for point in WORKER_POINTS]
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(interval_s,), name="dbcluster-bench-stages", daemon=True
        )

    def dump(self) -> None:
        tmp = Path(self.path + ".tmp")
        tmp.write_text(json.dumps({"at": time.time(), "marks": list(self.marks.marks)}))
        tmp.replace(self.path)

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.dump()

    def start(self) -> WorkerRecording:
        for point, handler in self.handlers:
            points.install(point, handler)
        self.dump()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop recording: the handlers removed, the file written a last time."""
        for point, handler in self.handlers:
            points.remove(point, handler)
        self._stop.set()
        self._thread.join(5)
        self.dump()


def record_worker(path: str, interval_s: float = 0.2) -> WorkerRecording:
    """In a worker process: record the worker's points, rewriting ``path`` every
    ``interval_s`` with what was recorded so far and when (``{"at": ..., "marks": [...]}``),
    until the process exits."""
    recording = WorkerRecording(path, interval_s).start()
    atexit.register(recording.stop)
    return recording


@contextmanager
def recording_master() -> Iterator[Marks]:
    """In the bench process, while launching: record when each creation committed."""
    marks = Marks()
    points.install(CREATED, marks.created)
    try:
        yield marks
    finally:
        points.remove(CREATED, marks.created)


def read_workers(folder: Path, after: float, timeout: float = 10) -> list[tuple[str, float, Any]]:
    """Every worker's marks in ``folder``, once each file was rewritten after ``after``."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        fresh = True
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {}
            fresh = fresh and data.get("at", 0) > after
            found.extend(tuple(m) for m in data.get("marks", ()))
        if fresh or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def per_launch(
    launches: Sequence[tuple[float, int, int, float]],
    master: Iterable[tuple[str, float, Any]],
    workers: Iterable[tuple[str, float, Any]],
) -> list[dict[str, float]]:
    """Each launch's marks: ``launches`` holds (launch time, job execution id, the partition's
    step execution id, the body's time) each; a point's first mark naming the launch's id
    counts."""
    by_id: dict[tuple[str, int], float] = {}
    for point, at, ids in (*master, *workers):
        for key in ids:
            by_id.setdefault((point, int(key)), float(at))
    found = []
    for launched, job_execution_id, step_execution_id, body in launches:
        marks = {"launch": launched, "body": body}
        if (CREATED, job_execution_id) in by_id:
            marks[CREATED] = by_id[(CREATED, job_execution_id)]
        for point in WORKER_POINTS:
            if (point, step_execution_id) in by_id:
                marks[point] = by_id[(point, step_execution_id)]
        found.append(marks)
    return found


def stage_medians(marks: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The median of each stage over the launches that reached both of its ends (ms), and how
    many launches each median covers."""
    out: dict[str, Any] = {}
    for name, start, end in STAGES:
        spans = [m[end] - m[start] for m in marks if start in m and end in m]
        if spans:
            out[name] = {"median_ms": round(statistics.median(spans) * 1000, 2), "n": len(spans)}
    return out
