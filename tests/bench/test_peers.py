"""``benchmarks/peers.py`` (outside the package) stops with one clear line without pgqueuer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"

#: Runs the script with ``pgqueuer`` unimportable, whether or not it is installed here.
WITHOUT_PGQUEUER = (
    "import runpy, sys; sys.modules['pgqueuer'] = None; "
    f"sys.argv = [{str(PEERS)!r}, '--url', 'postgresql+psycopg://u@127.0.0.1:1/db']; "
    f"runpy.run_path({str(PEERS)!r}, run_name='__main__')"
)


def test_peers_without_pgqueuer_says_how_to_install_it() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PGQUEUER], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "peers.py: pgqueuer is not installed; run `pip install pgqueuer asyncpg` first"
    ]


def test_the_package_does_not_import_pgqueuer() -> None:
    package = Path(__file__).resolve().parents[2] / "dbcluster"
    importing = re.compile(r"^\s*(?:import|from)\s+pgqueuer\b", re.MULTILINE)
    assert not [p for p in package.rglob("*.py") if importing.search(p.read_text())]
