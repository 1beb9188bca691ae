"""A per-second schedule on four accepting nodes for a minute (issue 14): one node SIGKILLed,
another SIGSTOPped and resumed; every tick must fire once and its job run once.

    python benchmarks/scheduler_ticks.py URL [--seconds 60] [--kill-at 15] [--pause-at 30]
        [--pause-for 5] [--submit]

With --submit, a partitioned job (``ledger``, 8 partitions of 20 s) is submitted first and the
node killed is the one that accepted it (its master): the report's ``submitted`` says it
completed under takeover, in one execution, each partition's effect once.

URL is a database initialised with ``dbcluster init`` (its dbcluster tables are emptied first).
Prints the report as JSON; exit status 0 when every tick fired once and completed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict

from dbcluster.dialects import get_provider, make_engine
from dbcluster.schema import ALL_TABLES
from dbcluster.testing.app import ledger_metadata
from dbcluster.testing.scheduled import run_ticks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--kill-at", type=float, default=15)
    parser.add_argument("--pause-at", type=float, default=30)
    parser.add_argument("--pause-for", type=float, default=5)
    parser.add_argument("--submit", action="store_true")
    args = parser.parse_args()
    engine = make_engine(args.url)
    get_provider(engine).create_tables(engine)
    ledger_metadata.drop_all(engine)
    with engine.begin() as conn:
        for table in reversed(ALL_TABLES):
            conn.execute(table.delete())
    engine.dispose()
    with tempfile.TemporaryDirectory() as workdir:
        report = run_ticks(
            args.url,
            workdir,
            args.seconds,
            kill_at=args.kill_at,
            pause_at=args.pause_at,
            pause_for=args.pause_for,
            submit=(
                ("ledger", ["run=minute", "delay_ms(int)=20000", "tick_ms(int)=200"])
                if args.submit
                else None
            ),
        )
    print(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
