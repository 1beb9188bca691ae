"""Sweeps per second with N in-process nodes, before and after leased maintenance (issue 35).

Starts ``--nodes`` idle nodes (``Cluster(work=False)``: they take jobs over, run no partitions)
on one database with the default intervals, waits for them to settle, then counts for
``--seconds``: the store calls each maintenance path makes (``sweep``, ``stranded_jobs``,
``leases``, ``renew_lease``, ``take_lease``, ``heartbeat``, ...), every statement SQLAlchemy
executes and every transaction it begins (the driver's own ``BEGIN``/``COMMIT`` are not
statements here: ``dbcluster.bench.wire`` counts those on the wire), per second and per node.

Run it on this tree, then on the code before (``git archive main dbcluster | tar -x -C DIR``,
``PYTHONPATH=DIR``): the same script counts both (a method the old code lacks counts 0)::

    python benchmarks/lease_sweeps.py --url sqlite:////tmp/l.db --nodes 50 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

import dbcluster
from dbcluster import migrations
from dbcluster.cluster import Cluster, ClusterSettings
from dbcluster.cluster.launches import LaunchStore
from dbcluster.cluster.store import CoordinationStore
from dbcluster.dialects import get_provider, make_engine
from dbcluster.testing.app import build_registry

#: Store calls counted (those the old code lacks count 0).
CALLS = (
    "sweep",
    "stranded_jobs",
    "unfinished_recoveries",
    "leases",
    "renew_leases",
    "take_lease",
    "release_lease",
    "heartbeat",
)


class Counts:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.on = False

    def add(self, name: str) -> None:
        if self.on:
            with self.lock:
                self.calls[name] += 1


def instrument(counts: Counts) -> None:
    def wrap(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            counts.add(label)
            return original(self, *args, **kwargs)

        setattr(owner, name, counted)

    for name in CALLS:
        wrap(CoordinationStore, name, name)
    wrap(LaunchStore, "release_lost", "release_lost_launches")

    @event.listens_for(Engine, "before_cursor_execute")
    def statement(*_: Any) -> None:
        counts.add("statements")

    @event.listens_for(Engine, "begin")
    def begin(*_: Any) -> None:
        counts.add("transactions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=12.0, help="seconds before counting")
    args = parser.parse_args()
    engine = make_engine(args.url)
    get_provider(engine).create_schema(engine)  # as `dbcluster init`
    migrations.record_if_unrecorded(engine)
    counts = Counts()
    instrument(counts)
    settings = ClusterSettings(node_id_prefix="lease-bench")
    registry = build_registry()
    clusters = []
    try:
        for _ in range(args.nodes):
            clusters.append(Cluster(args.url, registry, settings, work=False).start())
        time.sleep(args.settle)  # every node past its first turns (random phases)
        counts.on = True
        began = time.monotonic()
        time.sleep(args.seconds)
        counts.on = False
        elapsed = time.monotonic() - began
    finally:
        for cluster in clusters:
            cluster.stop(drain_timeout_ms=1000)
        engine.dispose()
    per_s = {k: round(v / elapsed, 2) for k, v in sorted(counts.calls.items())}
    print(
        json.dumps(
            {
                "code": dbcluster.__file__,
                "url": args.url.split("@")[-1],
                "nodes": args.nodes,
                "seconds": round(elapsed, 1),
                "settings_ms": {
                    "sweep_interval": settings.sweep_interval,
                    "heartbeat_interval": settings.heartbeat_interval,
                    "stranded_master_scan_interval": settings.stranded_master_scan_interval,
                },
                "per_second": per_s,
                "statements_per_node_per_second": round(
                    counts.calls["statements"] / elapsed / args.nodes, 3
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
