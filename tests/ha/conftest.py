"""The HA topologies of ``ci/ha.sh`` as session fixtures (issue 34).

Every test module here is marked ``ha`` (``pytestmark``) and is left out of the default run
(``addopts`` deselects the marker): it starts real servers (a PostgreSQL primary with a
streaming standby, three MariaDB Galera nodes) and needs root. Run them alone with
``python -m pytest -m ha tests/ha``.

The topologies get a name and ports of their own (``HA_NAME=dbchat``, ports 100 above the
script's defaults), so a developer's own ``ci/ha.sh`` topology is never touched, and they are
torn down at the end of the session. A machine without the servers' packages skips with the
reason; one that has them and fails to start them fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from ha_topology import ha, parse_urls


def _missing_tools(*tools: str) -> list[str]:
    return [t for t in tools if shutil.which(t) is None and not Path(t).exists()]


def _require(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the HA topologies start servers as postgres and mysql: run as root")
    missing = _missing_tools(*tools)
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)}")


@pytest.fixture(scope="session")
def pg_pair() -> Iterator[dict[str, str]]:
    """A PostgreSQL 15 primary with an asynchronous streaming standby; its URLs."""
    _require("pg_createcluster", "pg_basebackup", "/usr/lib/postgresql/15/bin/postgres")
    urls = parse_urls(ha("pg", "up", "--async"))
    yield urls
    ha("pg", "down")


@pytest.fixture(scope="session")
def galera() -> Iterator[dict[str, str]]:
    """Three MariaDB Galera nodes; their URLs (``HA_GALERA_URL_1`` .. ``_3``)."""
    # ci/ha.sh installs galera-4 and rsync where they are missing.
    _require("mariadbd", "mariadb-install-db")
    urls = parse_urls(ha("galera", "up"))
    yield urls
    ha("galera", "down")


@pytest.fixture(scope="session")
def pgbouncer(pg_pair: dict[str, str]) -> Iterator[dict[str, str]]:
    """PgBouncer 1.18 in transaction mode in front of the pair's primary; its URL."""
    _require()  # ci/ha.sh installs Debian's pgbouncer where it is missing
    urls = parse_urls(ha("pgbouncer", "up"))
    yield urls
    ha("pgbouncer", "down")
