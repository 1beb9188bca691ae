"""How long the dashboard takes to serve its pages on a large job repository.

    python scripts/jobs_page_load.py                        # a temporary SQLite file
    python scripts/jobs_page_load.py --url postgresql+psycopg://user@host/scratch

Fills the repository up to ``--executions`` job executions (one instance each, five job names,
one in ten FAILED; only the missing ones are added, so a second run reuses them), serves the
dashboard with uvicorn on a loopback port in this process, and times each page over real HTTP
(``--repeat`` requests after one warm-up): the jobs list, filtered by status and by name, a
page 100 pages deep, the cluster page, /metrics. Prints one line per page: median and slowest
time, and the size of the answer. Run it on a scratch database: it creates the dbcluster
tables there and leaves the executions it added; after adding them it refreshes the tables'
statistics (ANALYZE), as a live database does by itself.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import uvicorn
from sqlalchemy import Engine, select

from dbcluster.dialects import get_provider, make_engine, safe_url
from dbcluster.schema import job_execution, job_instance
from dbcluster.testing.executions import count_executions, insert_executions
from dbcluster.web import create_app


def analyze(engine: Engine) -> None:
    """Refresh the planner's statistics, as autovacuum (PostgreSQL) and InnoDB's automatic
    statistics do on a repository that grew over time: right after a bulk load they still
    describe the empty tables, and a plan chosen from them is not what a user would see."""
    tables = [job_instance.name, job_execution.name]
    with engine.begin() as conn:
        if engine.dialect.name in ("mysql", "mariadb"):
            conn.exec_driver_sql(f"ANALYZE TABLE {', '.join(tables)}")
        elif engine.dialect.name in ("postgresql", "sqlite"):
            for table in tables:
                conn.exec_driver_sql(f"ANALYZE {table}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a scratch database (default: a temporary SQLite file)")
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    url = args.url or f"sqlite:///{Path(tempfile.mkdtemp()) / 'load.db'}"
    engine = make_engine(url)
    get_provider(engine).create_schema(engine)
    have = count_executions(engine)
    if have < args.executions:
        began = time.perf_counter()
        insert_executions(engine, args.executions - have, prefix=f"load{have}")
        print(f"added {args.executions - have} executions in {time.perf_counter() - began:.1f} s")
        analyze(engine)
    total = count_executions(engine)
    with engine.connect() as conn:
        ids = conn.execute(
            select(job_execution.c.job_execution_id)
            .order_by(job_execution.c.job_execution_id.desc())
            .offset(5000)
            .limit(1)
        ).scalar()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, watch_interval_s=None), log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    pages = {
        "jobs list (newest 50)": "/jobs",
        "jobs list, status=FAILED": "/jobs?status=FAILED",
        "jobs list, name=export": "/jobs?name=export",
        "jobs list, 100 pages deep": f"/jobs?before={ids}",
        "cluster page": "/",
        "/metrics (cluster gauges)": "/metrics",
    }
    print(f"{safe_url(url)}: {total} job executions; {args.repeat} requests per page")
    try:
        for label, path in pages.items():
            times = []
            size = 0
            for i in range(args.repeat + 1):
                began = time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=60) as response:
                    size = len(response.read())
                if i:  # the first request warms caches up
                    times.append((time.perf_counter() - began) * 1000)
            print(
                f"  {label:28} median {statistics.median(times):7.1f} ms, "
                f"max {max(times):7.1f} ms, {size / 1024:6.1f} KiB"
            )
    finally:
        server.should_exit = True
        thread.join(10)
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
