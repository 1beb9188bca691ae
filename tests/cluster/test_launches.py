"""Launch requests and schedules on a live database (in-process nodes): one claim wins, a lost
claimer's request is launched elsewhere exactly once, a failed launch records its error, and the
missed-tick policies fire what they say."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.schedule import Schedule
from dbcluster.cluster.events import ClusterEvents
from dbcluster.cluster.identity import Identity
from dbcluster.cluster.launches import LaunchClaimLostError, LaunchStore
from dbcluster.cluster.maintenance.scheduler import Scheduler
from dbcluster.cluster.store import CoordinationStore
from dbcluster.schema import job_execution, job_execution_params, launch_requests, schedule_fires
from dbcluster.testing.app import FAST_SETTINGS
from dbcluster.testing.backends import Backend
from dbcluster.testing.scheduled import build_scheduled_registry
from dbcluster.testing.waiting import wait_for

BACKENDS = pytest.mark.backends("sqlite", "postgresql", "mariadb")


def _requests(backend: Backend) -> dict[int, Any]:
    with backend.engine.connect() as conn:
        return {r.request_id: r for r in conn.execute(select(launch_requests))}


def _execution(backend: Backend, job_execution_id: int) -> Any:
    with backend.engine.connect() as conn:
        return conn.execute(
            select(job_execution).where(job_execution.c.job_execution_id == job_execution_id)
        ).first()


@BACKENDS
def test_concurrent_claims_of_one_request_have_exactly_one_winner(backend: Backend) -> None:
    launches = LaunchStore(CoordinationStore(backend.engine))
    request_id = launches.submit("tick", JobParameters({"n": 1}))
    claimers = 6
    barrier = threading.Barrier(claimers)
    won: dict[str, list[int]] = {}

    def claim(node: str) -> None:
        store = LaunchStore(CoordinationStore(backend.engine))
        barrier.wait()
        won[node] = [r.request_id for r in store.claim(node, ["tick"], 4)]

    threads = [threading.Thread(target=claim, args=(f"node-{i}",)) for i in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [node for node, ids in won.items() if ids]
    assert len(won) == claimers
    assert len(winners) == 1 and won[winners[0]] == [request_id]
    row = _requests(backend)[request_id]
    assert (row.status, row.claimed_by) == ("CLAIMED", winners[0])
    # A claimer that read the request PENDING before the winner committed changes nothing.
    with backend.engine.begin() as conn:
        late = launches.provider.claim_launches("late", [request_id])
        assert conn.execute(late).rowcount == 0


@BACKENDS
def test_a_request_claimed_by_a_lost_node_is_launched_once_by_an_accepting_node(
    backend: Backend, make_cluster: Any
) -> None:
    launches = LaunchStore(CoordinationStore(backend.engine))
    request_id = launches.submit("tick", JobParameters({"n": 2}))
    # A claimer that died before creating the execution: its node row is gone.
    assert [r.request_id for r in launches.claim("ghost", ["tick"], 1)] == [request_id]
    # Its late write cannot launch it once the request was put back and taken by another.
    assert launches.release_lost() == 1
    assert [r.request_id for r in launches.claim("other", ["tick"], 1)] == [request_id]
    with backend.engine.begin() as conn, pytest.raises(LaunchClaimLostError):
        launches.mark_launched(conn, request_id, "ghost", 12345)
    assert launches.release_lost() == 1
    cluster = make_cluster(
        registry=build_scheduled_registry(per_second=False), accept_launches=True
    )
    row = wait_for(
        lambda: (r := _requests(backend)[request_id]).status == "LAUNCHED" and r,
        20,
        "the request to be launched",
    )
    assert row.claimed_by == cluster.node.node_id
    wait_for(lambda: _execution(backend, row.job_execution_id).status == "COMPLETED", 20, "the job")
    with backend.engine.connect() as conn:
        assert len(conn.execute(select(job_execution)).all()) == 1


@BACKENDS
def test_submit_next_runs_the_incrementer_on_the_accepting_node_and_failures_are_recorded(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(
        registry=build_scheduled_registry(per_second=False), accept_launches=True
    )
    first = cluster.submit("counter", next_run=True)
    second = cluster.submit("counter", next_run=True)
    # Fails on the accepting node: "tick" has no incrementer.
    bad = cluster.launches.submit("tick", JobParameters(), next_run=True)
    wait_for(
        lambda: all(
            _requests(backend)[i].status in ("LAUNCHED", "FAILED") for i in (first, second, bad)
        ),
        20,
        "the requests to be handled",
    )
    rows = _requests(backend)
    assert rows[bad].status == "FAILED"
    assert "has no incrementer" in rows[bad].error_message
    with backend.engine.connect() as conn:
        run_ids = sorted(
            int(r.parameter_value)
            for r in conn.execute(
                select(job_execution_params).where(
                    job_execution_params.c.parameter_name == "run.id"
                )
            )
        )
    assert run_ids == [1, 2]
    ids = [rows[request_id].job_execution_id for request_id in (first, second)]
    wait_for(lambda: all(_execution(backend, i).status == "COMPLETED" for i in ids), 20, "the jobs")


@BACKENDS
@pytest.mark.parametrize(("misfire", "fired"), [("latest", 1), ("all", 5), ("skip", 0)])
@BACKENDS
def test_ticks_missed_while_no_node_was_up_follow_the_misfire_policy(
    backend: Backend, misfire: str, fired: int
) -> None:
    launches = LaunchStore(CoordinationStore(backend.engine))
    now = launches.db_now()
    # The last tick fired an hour ago, then the whole cluster was down.
    hour_ago = now.replace(second=0, microsecond=0) - timedelta(hours=1)
    assert launches.fire("m", hour_ago, "old-node", "tick", JobParameters(), False) is not None
    # The same tick again, from any node: refused by the key, and no request is left behind.
    assert launches.fire("m", hour_ago, "late-node", "tick", JobParameters(), False) is None
    assert len(_requests(backend)) == 1
    schedule = Schedule(
        "tick", cron="* * * * *", name="m", misfire=misfire, misfire_grace=0, catch_up_limit=5
    )
    scheduler = Scheduler(launches, [schedule], FAST_SETTINGS, ClusterEvents(), lambda: None)
    assert scheduler.fire_due(Identity("n1"), now) == fired
    # A second node looking at the same moment fires nothing more.
    assert scheduler.fire_due(Identity("n2"), now) == 0
    with backend.engine.connect() as conn:
        times = sorted(
            r.fire_time.replace(tzinfo=None)
            for r in conn.execute(select(schedule_fires).where(schedule_fires.c.fired_by == "n1"))
        )
    latest = now.replace(second=0, microsecond=0)
    assert times == [latest - timedelta(minutes=m) for m in range(fired)][::-1]
    assert len(_requests(backend)) == 1 + fired


@BACKENDS
def test_a_node_that_lost_its_claim_creates_no_execution(
    backend: Backend, make_cluster: Any
) -> None:
    cluster = make_cluster(registry=build_scheduled_registry(per_second=False))
    launches = cluster.launches
    request_id = launches.submit("tick", JobParameters({"n": 3}))
    (request,) = launches.claim(cluster.node.node_id, ["tick"], 1)
    # This node was thought dead meanwhile: its claim went back and another node took it.
    with backend.engine.begin() as conn:
        conn.execute(
            launch_requests.update()
            .where(launch_requests.c.request_id == request_id)
            .values(claimed_by="other")
        )
    with pytest.raises(LaunchClaimLostError):
        cluster.background._create_requested(
            cluster.registry.get_job("tick"), request, cluster.node.node_id
        )
    with backend.engine.connect() as conn:
        assert conn.execute(select(job_execution)).all() == []
    # Still "other"'s, or already put back to PENDING by the sweep lease's holder ("other" is
    # no registered node): never this node's.
    assert _requests(backend)[request_id].claimed_by in ("other", None)
