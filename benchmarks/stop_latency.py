"""How long a cluster-wide stop takes, and what it leaves behind.

A partitioned chunk job (``--partitions`` partitions of ``--items`` items, ``--chunk`` items a
chunk, ``--item-ms`` per item) runs on ``--workers`` in-process worker nodes (``--concurrency``
partitions at once each; the rest wait PENDING) with a master of its own. Once every worker runs
partitions, ``Cluster.stop_execution`` is called from another node; the script reports the time
from the request to the job's STOPPED, the longest time from the request to a running
partition's end, the items written after the request, how many partitions ended without ever
starting, and then restarts the execution and checks that every item was written exactly once.

    python benchmarks/stop_latency.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test

It creates the dbcluster tables and one table of its own (``dbc_stop_bench_items``) in that
database and empties them first: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert, select

from dbcluster.batch import ChunkStep, Job, JobRegistry, PartitionStep
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.items import IterableItemReader, item_writer
from dbcluster.batch.partition import BasePartitioner
from dbcluster.cluster import Cluster, ClusterSettings
from dbcluster.dialects import make_engine
from dbcluster.schema import metadata as dbcluster_metadata
from dbcluster.schema import partitions, step_execution
from dbcluster.testing.waiting import in_thread, wait_for

bench_metadata = MetaData()
items = Table(
    "dbc_stop_bench_items",
    bench_metadata,
    Column("job_execution_id", BigInteger, nullable=False),
    Column("job_key", String(100), nullable=False),
    Column("item", Integer, nullable=False),
)


class Slices(BasePartitioner):
    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def partition(self, grid_size: int) -> dict[str, ExecutionContext]:
        return {
            f"p{i:06d}": ExecutionContext({"lo": i * self.size, "hi": (i + 1) * self.size})
            for i in range(self.count)
        }


def registry(args: argparse.Namespace) -> JobRegistry:
    def write(chunk: list[int], ctx: Any) -> None:
        time.sleep(args.item_ms * len(chunk) / 1000)
        je = ctx.step_execution.job_execution
        ctx.connection.execute(
            insert(items),
            [
                {"job_execution_id": je.id, "job_key": je.job_instance.job_key, "item": i}
                for i in chunk
            ],
        )

    worker = ChunkStep(
        "stop-bench.worker",
        reader=lambda se: IterableItemReader(
            range(int(se.execution_context["lo"]), int(se.execution_context["hi"])), name="items"
        ),
        writer=item_writer(write),
        chunk_size=args.chunk,
    )
    reg = JobRegistry()
    reg.register(
        Job(
            "stop-bench",
            [PartitionStep("stop-bench.master", worker, Slices(args.partitions, args.items))],
        )
    )
    return reg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--items", type=int, default=50)
    parser.add_argument("--chunk", type=int, default=5)
    parser.add_argument("--item-ms", type=float, default=20)
    parser.add_argument("--check-ms", type=int, default=500, help="master_check_interval")
    args = parser.parse_args()

    engine = make_engine(args.url)
    bench_metadata.drop_all(engine)
    dbcluster_metadata.drop_all(engine)
    dbcluster_metadata.create_all(engine)
    bench_metadata.create_all(engine)
    settings = ClusterSettings(
        master_check_interval=args.check_ms, concurrency_limit=args.concurrency, node_id_prefix="sb"
    )
    reg = registry(args)
    master = Cluster(args.url, reg, settings, work=False).start()
    workers = [Cluster(args.url, reg, settings).start() for _ in range(args.workers)]
    other = Cluster(args.url, reg, settings, work=False).start()
    try:
        job = reg.get_job("stop-bench")
        execution = master.create_execution(job, _params())
        run = in_thread(lambda: master.run_execution(job, execution))

        def running() -> bool:
            with engine.connect() as conn:
                rows = conn.execute(
                    select(partitions.c.assigned_node).where(partitions.c.status == "CLAIMED")
                ).all()
            return len({r[0] for r in rows}) == args.workers

        wait_for(running, 120, "every worker to run partitions")
        wait_for(lambda: _count(engine) >= args.workers * args.chunk, 60, "chunks to commit")
        before = _count(engine)
        asked = time.monotonic()
        asked_at = master.node.store.db_now()
        other.stop_execution(execution.id)
        run["thread"].join(600)
        took = time.monotonic() - asked
        ended = run["result"]
        after = _count(engine)
        with engine.connect() as conn:
            steps = conn.execute(
                select(
                    step_execution.c.start_time, step_execution.c.end_time, step_execution.c.status
                ).where(
                    step_execution.c.job_execution_id == execution.id,
                    step_execution.c.step_name.like("stop-bench.worker:%"),
                )
            ).all()
            left = Counter(
                r[0]
                for r in conn.execute(
                    select(partitions.c.status).where(partitions.c.job_execution_id == execution.id)
                )
            )
        ran = [s for s in steps if s.start_time is not None and s.end_time >= asked_at]
        stop_delays = [(s.end_time - asked_at).total_seconds() for s in ran]
        began = time.monotonic()
        restarted = master.restart(execution.id)
        restart_s = time.monotonic() - began
        with engine.connect() as conn:
            written = Counter(
                r[0]
                for r in conn.execute(
                    select(items.c.item).where(items.c.job_key == restarted.job_instance.job_key)
                )
            )
        total = args.partitions * args.items
        report = {
            "partitions": args.partitions,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "chunk_s": args.chunk * args.item_ms / 1000,
            "master_check_interval_ms": args.check_ms,
            "stopped_status": ended.status.value,
            "request_to_job_stopped_s": round(took, 3),
            "partitions_running_at_stop": len(ran),
            "longest_request_to_partition_end_s": round(max(stop_delays, default=0.0), 3),
            "items_written_after_request": after - before,
            "partitions_never_started": sum(s.start_time is None for s in steps),
            "left_in_flight": left.get("PENDING", 0) + left.get("CLAIMED", 0),
            "restart_status": restarted.status.value,
            "restart_s": round(restart_s, 1),
            "items_once": set(written) == set(range(total)) and set(written.values()) == {1},
        }
        print(json.dumps(report, indent=2))
    finally:
        other.stop()
        for worker in workers:
            worker.stop()
        master.stop()


def _params() -> Any:
    from dbcluster.batch.parameters import as_job_parameters

    return as_job_parameters({"run": time.time_ns()})


def _count(engine: Any) -> int:
    from sqlalchemy import func

    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(items)).scalar_one())


if __name__ == "__main__":
    main()
