"""The dashboard's restart, for real: a FAILED job is restarted from the page, by a background
`dbcluster restart` process, and completes."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from web_helpers import Served

from dbcluster.batch.status import BatchStatus
from dbcluster.cluster import Cluster
from dbcluster.demo import APP, demo_metadata, load_receipts, registry, results
from dbcluster.schema import job_execution, job_masters
from dbcluster.testing.app import FAST_SETTINGS
from dbcluster.testing.backends import Backend
from dbcluster.testing.harness import wait_until
from dbcluster.web import create_app
from dbcluster.web.actions import Restarter


class RecordingRestarter(Restarter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pids: list[int] = []

    def restart(self, execution_id: int) -> tuple[int, Path]:
        pid, log = super().restart(execution_id)
        self.pids.append(pid)
        return pid, log


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.backends("sqlite")
def test_a_failed_job_restarted_from_the_dashboard_completes(
    backend: Backend,
    serve: Callable[[Any], Served],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The restart process runs with this node's thresholds (it inherits the environment).
    for name, value in asdict(FAST_SETTINGS).items():
        if value is not None:
            monkeypatch.setenv(f"DBCLUSTER_{name.upper()}", str(value))
    monkeypatch.setenv("DBCLUSTER_URL", backend.url)  # where the demo's resource reads
    engine = backend.engine
    demo_metadata.drop_all(engine)
    demo_metadata.tables["dbc_demo_receipts"].create(engine)
    load_receipts(engine, 3000)
    restarter = RecordingRestarter(backend.url, APP, tmp_path)
    # One node in this process runs the partitions; the restart's master is a process of its own.
    node = Cluster(backend.url, registry, FAST_SETTINGS).start()
    try:
        # No results table yet: every partition fails at its final insert.
        failed = node.launch("reconcile-receipts", {"run": 1})
        assert failed.status is BatchStatus.FAILED
        results.create(engine)

        site = serve(create_app(engine, token="t0ken", restarter=restarter))
        page = site.get(f"/jobs/{failed.id}", Authorization="Bearer t0ken")
        assert f'action="/jobs/{failed.id}/restart"' in page.body
        answer = site.post(f"/jobs/{failed.id}/restart", Authorization="Bearer t0ken")
        assert answer.status == 303, answer.body

        def second() -> Any:
            with engine.connect() as conn:
                rows = conn.execute(
                    select(job_execution).order_by(job_execution.c.job_execution_id)
                ).all()
            return rows[1] if len(rows) == 2 and rows[1].status == "COMPLETED" else None

        done = wait_until(second, 60, "the restarted execution to complete")
        assert done.job_instance_id == failed.job_instance.id
        (pid,) = restarter.pids
        wait_until(lambda: not alive(pid), 30, "the restart process to exit")
        with engine.connect() as conn:
            masters = conn.execute(
                select(job_masters).where(job_masters.c.job_execution_id == done.job_execution_id)
            ).all()
        assert [m.reason for m in masters] == ["launched"]  # its own master saw it through
        page = site.get(f"/jobs/{done.job_execution_id}", Authorization="Bearer t0ken").body
        assert "COMPLETED" in page and "/restart" not in page
    finally:
        node.stop(drain_timeout_ms=2000)
        for pid in restarter.pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        demo_metadata.drop_all(engine)
