"""The job page's timeline: one lane per node, a bar per partition for each stretch of time it
was on that node, a connector where it moved, and a line at each master takeover.

Laid out here (positions in SVG units), drawn by the template. A partition's bars come from the
dashboard's samples (:mod:`dbcluster.web.history`) where it has them; otherwise from its step
execution's start and end, on its current node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dbcluster.monitor import JobDetail, PartitionRow
from dbcluster.states import MASTER_LAUNCHED, PARTITION_IN_FLIGHT
from dbcluster.views import short_node
from dbcluster.web.history import Segment

WIDTH = 1000.0
GUTTER = 150.0
AXIS = 22.0
ROW = 13.0
LANE_GAP = 8.0
IN_FLIGHT = PARTITION_IN_FLIGHT


@dataclass
class Bar:
    x: float
    w: float
    y: float
    status: str
    partition: str
    attempt: int
    node: str
    #: The partition left this node (it moved on, under a later attempt).
    moved_away: bool = False
    title: str = ""


@dataclass
class Lane:
    node: str
    label: str
    #: The node is no longer in the registry (removed after it died, or it left).
    gone: bool = False
    y: float = 0.0
    height: float = ROW
    rows: list[float] = field(default_factory=list)


@dataclass
class Mark:
    x: float
    label: str
    kind: str


@dataclass
class Move:
    x: float
    y1: float
    y2: float
    title: str


@dataclass
class Timeline:
    width: float
    height: float
    lanes: list[Lane]
    bars: list[Bar]
    marks: list[Mark]
    moves: list[Move]
    ticks: list[Mark]

    @property
    def empty(self) -> bool:
        return not self.bars


@dataclass
class _Stretch:
    node: str
    attempt: int
    start: datetime
    end: datetime
    status: str
    moved_away: bool


def _stretches(p: PartitionRow, seen: list[Segment], now: datetime) -> list[_Stretch]:
    ended = p.status not in IN_FLIGHT
    last_end = (p.end_time or p.last_updated or now) if ended else now
    if not seen:
        if p.start_time is None:
            return []
        return [
            _Stretch(p.node or "(unplaced)", p.attempt, p.start_time, last_end, p.status, False)
        ]
    out: list[_Stretch] = []
    for i, s in enumerate(seen):
        start = s.since
        if i == 0 and p.start_time is not None and p.start_time < start:
            start = p.start_time  # it ran there before the dashboard first saw it
        last = i == len(seen) - 1
        end = max(s.until, last_end) if last else s.until
        status = p.status if last else "MOVED"
        out.append(_Stretch(s.node, s.attempt, start, end, status, not last))
    if ended and p.node and p.node != out[-1].node:
        # It moved after the last sample and ended there.
        out[-1].moved_away = True
        out[-1].status = "MOVED"
        out.append(_Stretch(p.node, p.attempt, out[-1].end, last_end, p.status, False))
    return out


def _elapsed(seconds: float) -> str:
    if seconds < 10:
        return f"+{seconds:.1f}s"
    if seconds < 120:
        return f"+{seconds:.0f}s"
    if seconds < 7200:
        return f"+{seconds / 60:.0f}m"
    return f"+{seconds / 3600:.1f}h"


def layout(
    detail: JobDetail, seen: dict[int, list[Segment]], registered: set[str] | None = None
) -> Timeline:
    """The timeline of ``detail``'s partitions; ``registered``: the node ids in the registry
    now (the lanes of the others are marked gone)."""
    now = detail.db_now or detail.end_time or detail.start_time
    per_partition = (
        [(p, _stretches(p, seen.get(p.step_execution_id, []), now)) for p in detail.partitions]
        if now is not None
        else []
    )
    stretches = [s for _, found in per_partition for s in found]
    starts = [s.start for s in stretches] + [t for t in (detail.start_time,) if t]
    if not stretches or not starts:
        return Timeline(WIDTH, AXIS, [], [], [], [], [])
    t0 = min(starts)
    t1 = max([s.end for s in stretches] + [detail.end_time or t0])
    span = max((t1 - t0).total_seconds(), 1.0)

    def x(t: datetime) -> float:
        return GUTTER + (t - t0).total_seconds() / span * (WIDTH - GUTTER - 4)

    lanes: dict[str, Lane] = {}
    for s in sorted(stretches, key=lambda s: s.start):
        gone = registered is not None and s.node not in registered and s.node != "(unplaced)"
        lanes.setdefault(
            s.node, Lane(s.node, short_node(s.node) + (" (gone)" if gone else ""), gone)
        )
    # Each stretch takes the first row of its lane that is free at its start.
    placed: list[tuple[PartitionRow, _Stretch, int]] = []
    for p, found in per_partition:
        for s in found:
            lane = lanes[s.node]
            row = next((i for i, end in enumerate(lane.rows) if end <= x(s.start)), None)
            if row is None:
                row = len(lane.rows)
                lane.rows.append(0.0)
            lane.rows[row] = x(s.end) + 1
            placed.append((p, s, row))
    y = AXIS
    for lane in lanes.values():
        lane.y = y
        lane.height = max(1, len(lane.rows)) * ROW
        y += lane.height + LANE_GAP
    bars: list[Bar] = []
    moves: list[Move] = []
    previous: dict[int, Bar] = {}
    for p, s, row in placed:
        lane = lanes[s.node]
        bar = Bar(
            x=x(s.start),
            w=max(2.0, x(s.end) - x(s.start)),
            y=lane.y + row * ROW + 1,
            status=s.status,
            partition=p.name,
            attempt=s.attempt,
            node=s.node,
            moved_away=s.moved_away,
            title=f"{p.name} on {short_node(s.node)}, attempt {s.attempt}: {s.status.lower()}",
        )
        before = previous.get(p.step_execution_id)
        if before is not None and before.node != bar.node:
            moves.append(
                Move(
                    bar.x,
                    before.y + ROW / 2,
                    bar.y + ROW / 2,
                    f"{p.name} moved from {short_node(before.node)} to "
                    f"{short_node(bar.node)} (attempt {bar.attempt})",
                )
            )
        previous[p.step_execution_id] = bar
        bars.append(bar)
    marks = [
        Mark(
            x(m.since),
            f"epoch {m.epoch}: {short_node(m.node)} "
            + (MASTER_LAUNCHED if m.reason == MASTER_LAUNCHED else f"{m.reason}"),
            "launched" if m.reason == MASTER_LAUNCHED else "takeover",
        )
        for m in detail.masters
        if m.since is not None and t0 <= m.since <= t1
    ]
    ticks = [
        Mark(GUTTER + i / 4 * (WIDTH - GUTTER - 4), _elapsed(span * i / 4), "tick")
        for i in range(4)
    ]
    return Timeline(WIDTH, y, list(lanes.values()), bars, marks, moves, ticks)
