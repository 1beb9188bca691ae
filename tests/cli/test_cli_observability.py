"""`dbcluster worker --metrics-port/--health-port/--otel` and `launch --otel`, as processes."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import APP, cli, cli_env, run_cli, wait_for
from sqlalchemy import Engine

from dbcluster.testing.backends import Backend

prometheus = pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

SERVING = re.compile(r"serving (?P<routes>[/\w, ]+) on http://[\d.]+:(?P<port>\d+)")


def start_node(
    processes: list[subprocess.Popen[Any]],
    log: Path,
    args: list[str],
    env: dict[str, str],
) -> subprocess.Popen[Any]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cli(*args), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    processes.append(proc)
    return proc


def endpoint_port(proc: subprocess.Popen[Any], log: Path) -> int:
    def served() -> int | None:
        if proc.poll() is not None:
            pytest.fail(f"the worker exited {proc.returncode}: {log.read_text()[-2000:]}")
        found = SERVING.search(log.read_text(errors="replace"))
        return int(found["port"]) if found else None

    return int(wait_for(served, 30, "the worker's endpoints"))


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def samples(text: str) -> dict[str, float]:
    """Sample name (with its labels) -> value."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


@pytest.mark.backends("sqlite", "postgresql", "mariadb")
def test_a_workers_metrics_move_while_it_runs_a_job(
    backend: Backend,
    demo_engine: Engine,
    processes: list[subprocess.Popen[Any]],
    tmp_path: Path,
) -> None:
    from dbcluster.demo import results

    results.create(demo_engine)
    log = tmp_path / "worker.log"
    args = ["worker", "--app", APP, "--node-prefix", "mw", "--endpoints-host", "127.0.0.1"]
    worker = start_node(
        processes,
        log,
        [*args, "--metrics-port", "0", "--health-port", "0"],
        cli_env(DBCLUSTER_URL=backend.url),
    )
    port = endpoint_port(worker, log)
    # Served from before the node joins (503 "not joined"), 200 once it heartbeats.
    wait_for(lambda: fetch(port, "/healthz")[0] == 200, 10, "the worker to be healthy")
    # Ready once its poller runs too (a moment after its first heartbeat on a loaded machine).
    wait_for(lambda: fetch(port, "/readyz")[0] == 200, 10, "the worker to be ready")
    status, ready = fetch(port, "/readyz")
    assert status == 200 and json.loads(ready)["node_id"].startswith("mw-")
    launch = subprocess.Popen(
        cli("launch", "--app", APP, "reconcile-receipts", "run=1", "pace_ms(int)=150")
        + ["--no-work", "--json", "-q"],
        env=cli_env(DBCLUSTER_URL=backend.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(launch)
    read = "dbcluster_items_read_total{step=reconcile-slice}"
    during: list[dict[str, float]] = []
    while launch.poll() is None:
        status, text = fetch(port, "/metrics")
        assert status == 200
        during.append(samples(text))
        try:
            launch.wait(timeout=0.1)  # the scrape interval, cut short when the job ends
        except subprocess.TimeoutExpired:
            pass
    out, err = launch.communicate()
    assert launch.returncode == 0, err[-2000:]
    final = samples(fetch(port, "/metrics")[1])
    # The counters moved while the job ran: several different values of items read, climbing.
    values = [s.get(read, 0.0) for s in during]
    assert values == sorted(values) and len({v for v in values if 0 < v < final[read]}) >= 2
    assert final[read] == 6000 and final["dbcluster_items_written_total{step=reconcile-slice}"]
    assert any(s["dbcluster_partitions_claimed_total"] > 0 for s in during)
    assert final["dbcluster_partitions_claimed_total"] == 4
    assert final["dbcluster_partitions_completed_total"] == 4
    assert final["dbcluster_partition_duration_seconds_count{outcome=completed}"] == 4
    assert final["dbcluster_chunk_duration_seconds_count{step=reconcile-slice}"] >= 12
    assert final["dbcluster_heartbeat_round_trip_seconds_count"] > 0
    assert final["dbcluster_heartbeat_age_seconds"] < 2
    assert final["dbcluster_partitions_running"] == 0
    assert "dbcluster_coordination_errors_total{kind=connection}" in final
    assert not [name for name in final if "execution" in name or "partition=" in name]


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: keeps each request's spans."""

    received: list[tuple[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = next(
                a.value.string_value
                for a in resource_spans.resource.attributes
                if a.key == "service.name"
            )
            for scope in resource_spans.scope_spans:
                self.received.extend((service, span) for span in scope.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="no otel extra")
    received: list[tuple[str, Any]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


@pytest.mark.backends("sqlite")
def test_one_trace_spans_the_launcher_and_the_worker_process(
    backend: Backend,
    demo_engine: Engine,
    processes: list[subprocess.Popen[Any]],
    tmp_path: Path,
    collector: tuple[str, list[tuple[str, Any]]],
) -> None:
    from dbcluster.demo import results

    results.create(demo_engine)
    endpoint, received = collector
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    log = tmp_path / "worker.log"
    worker = start_node(
        processes,
        log,
        ["worker", "--app", APP, "--node-prefix", "ow", "--otel"],
        cli_env(DBCLUSTER_URL=backend.url, OTEL_SERVICE_NAME="worker", **otel),
    )
    wait_for(lambda: "running" in log.read_text() or worker.poll() is not None, 30, "the worker")
    launched = run_cli(
        "launch", "--app", APP, "reconcile-receipts", "run=1", "--no-work", "--otel", "-q",
        DBCLUSTER_URL=backend.url, OTEL_SERVICE_NAME="launcher", **otel,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-2000:]

    def spans_of(service: str, prefix: str) -> list[Any]:
        return [s for who, s in list(received) if who == service and s.name.startswith(prefix)]

    (job,) = wait_for(lambda: spans_of("launcher", "job "), 10, "the job's span")
    (step,) = spans_of("launcher", "step reconcile")
    parts = wait_for(lambda: len(spans_of("worker", "partition ")) == 4 and spans_of(
        "worker", "partition "), 10, "the worker's 4 partition spans")  # fmt: skip
    assert {p.trace_id for p in parts} == {job.trace_id}
    assert {p.parent_span_id for p in parts} == {step.span_id}
    assert step.parent_span_id == job.span_id
    assert spans_of("worker", "chunk ") and not spans_of("launcher", "partition ")


def test_endpoint_and_dashboard_mistakes_are_one_line_exit_2(tmp_path: Path) -> None:
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_cli("init", "--url", url).returncode == 0
    try:
        taken = run_cli(
            "worker", "--url", url, "--app", APP, "--metrics-port", str(port),
            "--endpoints-host", "127.0.0.1",
        )  # fmt: skip
        assert taken.returncode == 2, taken.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr
        web = run_cli("web", "--url", url, "--host", "127.0.0.1", "--port", str(port))
        assert web.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in web.stderr
    finally:
        busy.close()
    too_often = run_cli("web", "--url", url, "--refresh", "100ms")
    assert too_often.returncode == 2 and "must be at least 0.5s" in too_often.stderr
    for result in (taken, web, too_often):
        assert "Traceback" not in result.stderr
