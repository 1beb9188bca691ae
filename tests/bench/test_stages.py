"""The latency scenario's stages (dbcluster/bench/stages.py): a launch's worker marks are those of
the node whose claim won its partition, in the order that claim passed them, and each stage's
median covers the launches that reached both of its ends."""

from __future__ import annotations

from pathlib import Path

from dbcluster import points
from dbcluster.bench import counting, stages


def test_a_launch_takes_the_marks_of_the_node_whose_claim_won_it() -> None:
    launches = [(100.0, 7, 70, 100.010), (200.0, 8, 80, 200.020), (300.0, 9, 90, 300.020)]
    master = [(stages.CREATED, 100.002, [7], None), (stages.CREATED, 200.004, [8], None)]
    workers = [
        ("node.offered", 100.003, [70], "a"),
        ("node.offered", 100.009, [70], "a"),  # a second wake-up naming it: the first counts
        ("node.between_poll_and_claim", 100.0035, [70, 99], "b"),  # another node's claim lost
        ("node.between_poll_and_claim", 100.004, [70, 99], "a"),
        ("node.claimed", 100.006, [70], "a"),
        # Launch 8: a poll found it; the wake-up that came after started nothing.
        ("node.between_poll_and_claim", 200.010, [80], "a"),
        ("node.offered", 200.011, [80], "a"),
        ("node.claimed", 200.012, [80], "a"),
        # Launch 9: no claim recorded (its final-write hand-on, say): no worker marks.
        ("node.offered", 300.005, [90], "a"),
    ]
    marks = stages.per_launch(launches, master, workers)
    assert marks[0]["node.offered"] == 100.003
    assert marks[0]["node.between_poll_and_claim"] == 100.004
    assert "node.offered" not in marks[1]
    assert set(marks[2]) == {"launch", "body"}
    medians = stages.stage_medians(marks)
    assert medians["launch_to_created"] == {"median_ms": 3.0, "n": 2}
    assert medians["launch_to_offered"] == {"median_ms": 3.0, "n": 1}
    assert medians["offered_to_claim_sent"] == {"median_ms": 1.0, "n": 1}
    assert medians["claim"] == {"median_ms": 2.0, "n": 2}
    assert medians["claimed_to_body"] == {"median_ms": 6.0, "n": 2}


def test_the_master_records_its_commits_only_while_recording() -> None:
    class Execution:
        id = 5

    with stages.recording_master() as marks:
        points.reach(stages.CREATED, job_execution=Execution())
    points.reach(stages.CREATED, job_execution=Execution())
    assert [(point, ids) for point, _, ids, _ in marks.marks] == [(stages.CREATED, [5])]
    assert not points._handlers  # nothing left armed


def test_a_worker_records_claimed_partitions_by_their_ids(tmp_path: Path) -> None:
    """Its counts file carries its marks (the claimed partitions by their ids), and no more once
    it stops recording."""

    class Pending:
        step_execution_id = 42

    class Claimed:
        partition = Pending()

    path = tmp_path / "worker-0.json"
    marks = stages.record_worker()
    try:
        counting.dump(path)
        assert counting.read_file(path)[stages.SECTION] == []
        points.reach("node.offered", node_id="n", partitions=[42])
        counting.dump(path)  # each dump encodes only the marks new since the one before
        points.reach("node.claimed", node_id="n", partitions=[Claimed()])
        counting.dump(path)
        counting.dump(path)
    finally:
        stages.stop_worker(marks)
    assert not points._handlers
    written = counting.read_file(path)
    assert "statements" in written and "at" in written
    found = written[stages.SECTION]
    assert [(point, ids, node) for point, _, ids, node in found] == [
        ("node.offered", [42], "n"),
        ("node.claimed", [42], "n"),
    ]
    counting.dump(path)
    assert stages.SECTION not in counting.read_file(path)
