"""OpenTelemetry spans for the jobs, steps, partitions and chunks a node runs (the ``otel`` extra).

``Tracing(node).start()`` (or ``dbcluster worker|launch|restart --otel``) makes, on the node:

- ``job <name>``: a job execution its master runs, from its start to its final write;
- ``step <name>``: each step the master runs itself (a partitioned step too: it spans the
  placing and the monitoring of its partitions);
- ``partition <worker step>``: a partition, on the node that runs it, from its start to its
  final write;
- ``chunk <step>``: each committed chunk or tasklet call, from the step's previous commit.

Attributes: ``dbcluster.node.id``, ``dbcluster.partition.attempt`` and ``dbcluster.master.epoch``
(with job, step and execution ids and names, and each chunk's counts). The master writes the
context of its partitioned step's span (its W3C ``traceparent``) into each partition row it
places (``batch_partitions.trace_context``); the node that runs a partition reads it back, so
its spans join the job's trace, whichever process or machine it runs on. A master that takes a
job over continues the trace it finds on the job's partition rows (a job taken over before it
placed any starts a new trace).

Spans go to the tracer provider given, else OpenTelemetry's global one (which the application,
or ``configure_otlp()``, sets up).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as missing:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "dbcluster tracing needs OpenTelemetry: pip install 'dbcluster[otel]'"
    ) from missing

from sqlalchemy import select

from dbcluster.batch.observe import BatchObserver, ChunkClock, observers
from dbcluster.batch.status import BatchStatus
from dbcluster.cluster.fencing import PartitionFence
from dbcluster.cluster.mastership import Mastership
from dbcluster.cluster.observing import step_name_of
from dbcluster.schema import job_coordination, partitions

if TYPE_CHECKING:
    from dbcluster.batch.domain import JobExecution, StepExecution
    from dbcluster.cluster.node import Node

log = logging.getLogger("dbcluster.tracing")

_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass
class _Open:
    span: Span
    token: object
    thread: int
    attributes: dict[str, Any]


def _carrier(span: Span) -> str | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _parent(traceparent: str | None) -> otel_context.Context | None:
    if not traceparent:
        return None
    return _PROPAGATOR.extract({"traceparent": traceparent})


class Tracing(BatchObserver):
    """Spans of one node's executions (see the module's docstring)."""

    def __init__(self, node: Node, tracer_provider: Any = None) -> None:
        from importlib.metadata import version

        self.node = node
        self.tracer = trace.get_tracer(
            "dbcluster", version("dbcluster"), tracer_provider=tracer_provider
        )
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], _Open] = {}
        self._clock = ChunkClock()

    def start(self) -> Tracing:
        observers.subscribe(self)
        return self

    def stop(self) -> None:
        observers.unsubscribe(self)

    # --- whose execution --------------------------------------------------------------------

    def _owner(self, fence: Any) -> dict[str, Any] | None:
        """The attributes of this node's fence, or None when another node (or no cluster)
        runs the execution."""
        if isinstance(fence, Mastership) and fence.node_id in self.node.ids:
            return {"dbcluster.node.id": fence.node_id, "dbcluster.master.epoch": fence.epoch}
        if isinstance(fence, PartitionFence) and fence.node_id in self.node.ids:
            return {
                "dbcluster.node.id": fence.node_id,
                "dbcluster.partition.attempt": fence.attempt,
            }
        return None

    def _read_row(self, *where: Any) -> Any:
        stmt = (
            select(partitions.c.trace_context, job_coordination.c.master_epoch)
            .outerjoin(
                job_coordination,
                job_coordination.c.job_execution_id == partitions.c.job_execution_id,
            )
            .where(*where)
            .order_by(partitions.c.step_execution_id.desc())
            .limit(1)
        )
        try:
            with self.node.store.engine.connect() as conn:
                return conn.execute(stmt).first()
        except Exception as exc:  # noqa: BLE001 - a span without its parent beats a failed step
            log.warning("cannot read a partition's trace context: %s", exc)
            return None

    # --- spans ------------------------------------------------------------------------------

    def _begin(
        self,
        key: tuple[str, int],
        name: str,
        attributes: dict[str, Any],
        parent: otel_context.Context | None,
    ) -> None:
        span = self.tracer.start_span(name, context=parent, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        with self._lock:
            self._open[key] = _Open(span, token, threading.get_ident(), attributes)

    def _end(self, key: tuple[str, int], status: BatchStatus, exit_code: str, error: Any) -> None:
        with self._lock:
            found = self._open.pop(key, None)
        if found is None:
            return
        span = found.span
        span.set_attribute("dbcluster.status", status.value)
        span.set_attribute("dbcluster.exit_code", exit_code)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
        elif status is not BatchStatus.COMPLETED:
            span.set_status(Status(StatusCode.ERROR, f"ended {status.value}"))
        span.end()
        if found.thread == threading.get_ident():
            otel_context.detach(found.token)

    def job_started(self, job_execution: JobExecution) -> None:
        je = job_execution
        owner = self._owner(je.fence)
        if owner is None:
            return
        parent = None
        if owner["dbcluster.master.epoch"] > 1:
            # Taken over: continue the trace its first master left on the partition rows.
            row = self._read_row(
                partitions.c.job_execution_id == je.id, partitions.c.trace_context.is_not(None)
            )
            parent = _parent(None if row is None else row.trace_context)
        attributes = {
            **owner,
            "dbcluster.job.name": je.job_name,
            "dbcluster.job_execution.id": je.id,
        }
        self._begin(("job", je.id), f"job {je.job_name}", attributes, parent)

    def job_ended(self, job_execution: JobExecution, error: BaseException | None) -> None:
        je = job_execution
        if self._owner(je.fence) is not None:
            self._end(("job", je.id), je.status, je.exit_status.code, error)

    def step_started(self, step_execution: StepExecution) -> None:
        se = step_execution
        owner = self._owner(se.fence)
        if owner is None:
            return
        attributes = {
            **owner,
            "dbcluster.job.name": se.job_execution.job_name,
            "dbcluster.job_execution.id": se.job_execution.id,
            "dbcluster.step.name": step_name_of(se),
            "dbcluster.step_execution.id": se.id,
        }
        if isinstance(se.fence, PartitionFence):
            row = self._read_row(partitions.c.step_execution_id == se.id)
            if row is not None and row.master_epoch is not None:
                attributes["dbcluster.master.epoch"] = int(row.master_epoch)
            attributes["dbcluster.partition.name"] = se.step_name.split(":", 1)[-1]
            parent = _parent(None if row is None else row.trace_context)
            name = f"partition {step_name_of(se)}"
        else:
            parent = None  # the current context: the job's span, on the master's thread
            name = f"step {se.step_name}"
        self._begin(("step", se.id), name, attributes, parent)
        self._clock.started(se)

    def chunk_committed(self, step_execution: StepExecution) -> None:
        se = step_execution
        if self._owner(se.fence) is None:
            return  # the same execution, resumed by a node that took its job over
        with self._lock:
            found = self._open.get(("step", se.id))
        chunk = None if found is None else self._clock.chunk(se)
        if found is None or chunk is None:
            return
        attributes = {
            **found.attributes,
            "dbcluster.chunk.read": chunk.read,
            "dbcluster.chunk.written": chunk.written,
            "dbcluster.chunk.skipped": chunk.skipped,
        }
        span = self.tracer.start_span(
            f"chunk {step_name_of(se)}",
            context=trace.set_span_in_context(found.span),
            attributes=attributes,
            start_time=chunk.began_ns,
        )
        span.end(end_time=chunk.ended_ns)

    def step_ended(self, step_execution: StepExecution, error: BaseException | None) -> None:
        se = step_execution
        if self._owner(se.fence) is not None:
            self._clock.ended(se)
            self._end(("step", se.id), se.status, se.exit_status.code, error)

    def trace_context(self, step_execution: StepExecution) -> str | None:
        with self._lock:
            found = self._open.get(("step", step_execution.id))
        return None if found is None else _carrier(found.span)


def configure_otlp() -> Any:
    """Set OpenTelemetry's global tracer provider to one that exports over OTLP/HTTP, configured
    by the standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``OTEL_SERVICE_NAME``, default ``dbcluster``, ...). Returns it (``shutdown()`` flushes)."""
    import os

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as missing:
        raise ImportError(
            "--otel exports over OTLP/HTTP: pip install 'dbcluster[otel]'"
        ) from missing
    os.environ.setdefault("OTEL_SERVICE_NAME", "dbcluster")
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider
