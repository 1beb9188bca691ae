"""The dashboard's stop: a running execution is stopped from its page by `dbcluster stop`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from web_helpers import Served

from dbcluster.batch.parameters import as_job_parameters
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.status import BatchStatus
from dbcluster.schema import job_execution
from dbcluster.testing.backends import Backend
from dbcluster.web import create_app
from dbcluster.web.actions import Stopper


def _status(backend: Backend, execution_id: int) -> str:
    with backend.engine.connect() as conn:
        return str(
            conn.execute(
                select(job_execution.c.status).where(
                    job_execution.c.job_execution_id == execution_id
                )
            ).scalar_one()
        )


@pytest.mark.backends("sqlite")
def test_a_running_execution_is_stopped_from_its_page(
    backend: Backend, serve: Callable[[Any], Served]
) -> None:
    repository = JobRepository(backend.engine)
    made = []
    for run, status in (("web-stop", BatchStatus.STARTED), ("web-done", BatchStatus.COMPLETED)):
        params = as_job_parameters({"run": run})
        execution = repository.create_job_execution(
            repository.create_job_instance("ledger", params), params
        )
        execution.status = status
        repository.update_job_execution(execution)
        made.append(execution.id)
    running, completed = made

    app = create_app(
        backend.engine,
        token="s3cret",
        public_read=True,
        restarter=object(),  # type: ignore[arg-type] - restarts are not exercised here
        stopper=Stopper(backend.url),
        watch_interval_s=None,
    )
    site = serve(app)
    assert "Log in</a> to stop" in site.get(f"/jobs/{running}").body
    assert site.post(f"/jobs/{running}/stop").status == 403
    page = site.get(f"/jobs/{running}", Authorization="Bearer s3cret").body
    assert f'action="/jobs/{running}/stop"' in page
    done = site.post(f"/jobs/{running}/stop", Authorization="Bearer s3cret")
    assert done.status == 303, done.body
    assert "STOPPING" in done.headers["location"]
    assert _status(backend, running) == "STOPPING"
    refused = site.post(f"/jobs/{completed}/stop", Authorization="Bearer s3cret")
    assert refused.status == 409 and "already ended COMPLETED" in refused.body
    assert "/stop" not in site.get(f"/jobs/{completed}", Authorization="Bearer s3cret").body
