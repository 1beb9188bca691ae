"""Every statement a query provider can build, rendered by its own dialect without a server.

The provider contract is enumerated by introspection: every public method of a provider class is
either named in :data:`CALLS` (how to call it, with each variant the product uses) or in
:data:`NOT_SQL` (it builds no SQL, and why). A method in neither is reported by
:func:`unlisted`, so a method is covered the day it is written. :func:`render_all` calls each
method of :data:`CALLS` and compiles what it returns; a method whose statement the dialect
cannot compile is named in the :class:`StatementError` it raises.

Used by the suite (``test_statements``: the provider under test, on its own dialect) and by
dbcluster's own tests (every built-in provider on every server version it supports).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Insert,
    bindparam,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.elements import ClauseElement, ColumnElement

from dbcluster import schema
from dbcluster.dialects.base import PLACED_COLUMNS, QueryProvider, SessionLimits
from dbcluster.schema import nodes, partitions

#: Public methods of the provider contract that build no SQL a database receives, with why.
NOT_SQL: dict[str, str] = {
    "autocommit_engine_options": "create_engine arguments",
    "call_timeout_ms": "a driver setting (milliseconds)",
    "clip_text": "text clipping",
    "column_type": "a column type (compiled with the DDL: ddl_statements)",
    "configure_engine": "engine events",
    "read_then_write": "joins two statements of CALLS (select_claimable or poll_and_leases, "
    "heartbeat or heartbeat_renewing) into one request",
    "configure_session": "runs session_statements (rendered) or sets a driver attribute",
    "connect": "a driver connection (the dialect's own connect by default)",
    "connect_error_hint": "an error message",
    "create_scratch_database": "runs create_database_sql",
    "create_schema": "runs the CREATE statements of ddl_statements",
    "create_tables": "runs the CREATE statements of ddl_statements",
    "driver_install_hint": "an error message",
    "drop_scratch_database": "runs drop_database_sql",
    "engine_options": "create_engine arguments",
    "fit_dialect": "mends a dialect's compiler (Db2)",
    "heartbeat_values": "a SET clause's values (rendered inside heartbeat)",
    "in_transaction": "reads a driver attribute",
    "is_read_only": "classifies an error",
    "is_transient": "classifies an error",
    "needs_session_hook": "a flag",
    "notify_parameter": "a bound parameter (rendered inside notify)",
    "offline_dialect": "a dialect",
    "open_listener": "a listening connection (LISTEN on a channel of wake_channel)",
    "private_to_engine": "a flag",
    "quote": "an identifier",
    "refusal": "an expression (rendered inside fold_guard)",
    "read_url_options": "reads dbcluster's own URL options (dbcluster_pooler)",
    "refusal_of": "reads an error",
    "session_of": "reads a driver attribute",
    "script_line": "ends a statement as a script for the database's tools does",
    "session_engine_options": "create_engine arguments",
    "skip_locked": "a flag",
    "standalone_read_options": "execution options",
    "text_type": "a column type (compiled with the DDL: ddl_statements)",
    "wake_channel": "a channel name",
}

#: A one-row source standing in for a statement's new row (what riders take values from).
NEW_ROW = select(literal_column("1").label("id")).subquery("dbc_new")
_IDS = bindparam("b_ids", expanding=True)
_LIMITS = SessionLimits(lock_timeout_ms=2500, idle_in_transaction_ms=9000)
_DAY_MS = 86_400_000
#: Ages the product asks "older than" for: a heartbeat's, a month (``prune --older-than 30d``),
#: ten years (the int overflow of a millisecond count is at ~24.8 days).
AGES_MS = (250, 30 * _DAY_MS, 3653 * _DAY_MS)

_se, _sc = schema.step_execution, schema.step_execution_context
_je, _ji = schema.job_execution, schema.job_instance
#: A step's versioned write and its context's, as a job repository writes them per chunk (their
#: bind parameters shared: ``b_id`` names the step execution in both).
STEP_UPDATE = (
    update(_se)
    .where(_se.c.step_execution_id == bindparam("b_id"), _se.c.version == bindparam("b_version"))
    .values(status=bindparam("b_status"), version=_se.c.version + 1)
)
CONTEXT_VALUES = {"short_context": bindparam("b_short"), "serialized_context": bindparam("b_long")}
CONTEXT_UPDATE = (
    update(_sc).where(_sc.c.step_execution_id == bindparam("b_id")).values(**CONTEXT_VALUES)
)


def _guard(p: QueryProvider) -> Any:
    return p.finish_partition(
        bindparam("b_id"), bindparam("b_node"), bindparam("b_attempt"), "COMPLETED"
    )


def _select_of(where: Iterable[ColumnElement[bool]]) -> Any:
    return select(_je.c.job_execution_id).where(*where)


class _Captured:
    """A connection that compiles what it is given (for methods that run their statements)."""

    rowcount = 0

    def __init__(self) -> None:
        self.executed: list[Any] = []

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> _Captured:
        self.executed.append(statement)
        return self

    def begin_nested(self) -> Any:
        from contextlib import nullcontext

        return nullcontext()


def _register(p: QueryProvider, node: str) -> list[Any]:
    conn = _Captured()
    p.register_node(conn, node, "host", 4)  # type: ignore[arg-type]
    return conn.executed


def _skipping(p: QueryProvider, build: Callable[[], Any]) -> list[Any]:
    return [build()] if p.skip_locked() else []


def _wakes(p: QueryProvider, build: Callable[[], Any]) -> list[Any]:
    return [build()] if p.supports_listen_notify else []


def _placement(p: QueryProvider) -> Any:
    arrays = p.insert_partitions_from_arrays()
    return p.insert_partitions() if arrays is None else arrays


def _wake_or_master(p: QueryProvider) -> Any:
    if p.supports_listen_notify:
        return p.notify(p.notify_parameter("b_channels"))
    return p.insert_master(bindparam("b_job"), 1, bindparam("b_node"), "launched")


def _pk(p: QueryProvider) -> list[Any]:
    if p.alter_type_keeps_indexes:
        return []  # asked only where retyping drops the keys over a column
    return [*p.drop_primary_key_sql("batch_nodes", "pk_x"), *p.drop_primary_key_sql("t", None)]


def _retype(p: QueryProvider) -> list[Any]:
    try:
        return [
            *p.alter_column_type_sql("batch_nodes", "host", "VARCHAR(50)", "VARCHAR(100)", False),
            *p.alter_column_type_sql(
                "batch_partitions", "transferable", "BOOLEAN", "SMALLINT", True
            ),
        ]
    except NotImplementedError:
        return []  # a database whose types are affinities (SQLite) is never asked


#: For each method that builds SQL: the statements it gives for each variant the product uses.
CALLS: dict[str, Callable[[QueryProvider], list[Any]]] = {
    # the clock
    "now": lambda p: [select(p.now())],
    "select_now": lambda p: [p.select_now()],
    "older_than": lambda p: [
        select(nodes.c.node_id).where(p.older_than(nodes.c.last_heartbeat, ms)) for ms in AGES_MS
    ],
    # node registry
    "register_node": lambda p: _register(p, "n"),
    "select_pending_of": lambda p: [p.select_pending_of("UNREACHABLE")],
    "heartbeat": lambda p: [
        p.heartbeat("n", 1),
        p.heartbeat(bindparam("b_node"), bindparam("b_load")),  # type: ignore[arg-type]
    ],
    "set_node_capacity": lambda p: [p.set_node_capacity("n", 4)],
    "touch_node": lambda p: [p.touch_node("n", 1)],
    "mark_unreachable": lambda p: [p.mark_unreachable(10_000)],
    "mark_removing": lambda p: [p.mark_removing(30_000)],
    "lock_removing": lambda p: [p.lock_removing()],
    "lock_node": lambda p: [p.lock_node("n"), p.lock_node(bindparam("b_node"))],
    "locked": lambda p: [
        p.locked(select(nodes.c.node_id).where(nodes.c.node_id == "n")),
        *_skipping(p, lambda: p.locked(select(partitions.c.step_execution_id), skip_locked=True)),
    ],
    "fence_partitions_of_removing": lambda p: [p.fence_partitions_of_removing()],
    "fence_claims_of": lambda p: [p.fence_claims_of("n")],
    "delete_removing": lambda p: [p.delete_removing()],
    "deregister_node": lambda p: [p.deregister_node("n")],
    "select_nodes": lambda p: [p.select_nodes(), p.select_nodes(None)],
    "select_nodes_with_age": lambda p: [p.select_nodes_with_age()],
    "select_stale_node": lambda p: [p.select_stale_node(10_000, 30_000)],
    "count_live_nodes": lambda p: [p.count_live_nodes(60_000)],
    # partitions
    "insert_partitions": lambda p: [p.insert_partitions()],
    "insert_partition_from": lambda p: [p.insert_partition_from(NEW_ROW, NEW_ROW.c.id)],
    "insert_partitions_from_arrays": lambda p: [p.insert_partitions_from_arrays()],
    "claim_partition": lambda p: [p.claim_partition(1, "n", 1)],
    "hold_partition": lambda p: [
        p.hold_partition(1, "n", 1),
        p.hold_partition(bindparam("b_id"), bindparam("b_node"), bindparam("b_attempt")),  # type: ignore[arg-type]
        # A partition run before it was claimed (cluster/placed.py).
        p.hold_partition(1, "n", 1, placed=True),
    ],
    "finish_partition": lambda p: [
        p.finish_partition(1, "n", 1, "COMPLETED"),
        p.finish_partition(1, "n", 1, "FAILED"),
        p.finish_partition(1, "n", 1, "COMPLETED", placed=True),
    ],
    "release_partition": lambda p: [
        p.release_partition(1, "n", 1),
        p.release_partition(1, "n", 1, placed=True),
    ],
    "release_pending_for_node": lambda p: [p.release_pending_for_node("n")],
    "reassign_partition": lambda p: [
        p.reassign_partition(1, "n", 1, "m"),
        p.reassign_partition(1, None, 1, "m"),
    ],
    "fail_orphaned_partition": lambda p: [
        p.fail_orphaned_partition(1, "n", 1),
        p.fail_orphaned_partition(1, None, 1),
    ],
    "select_claimable": lambda p: [
        p.select_claimable(bindparam("b_node"), 4, None, 10_000),
        p.select_claimable(bindparam("b_node"), 4, 5000, 10_000),
    ],
    "heartbeat_and_poll": lambda p: [
        p.heartbeat_and_poll(bindparam("b_node"), bindparam("b_load"), 4, None, 10_000),
        p.heartbeat_and_poll(bindparam("b_node"), bindparam("b_load"), 4, 5000, 10_000),
    ],
    "lock_claimable": lambda p: [
        p.lock_claimable(_IDS),
        p.lock_claimable([bindparam("n_id")], partitions.alias("p")),
    ],
    "claim_partitions": lambda p: [p.claim_partitions(bindparam("b_node"), _IDS)],
    "start_claimed": lambda p: [
        p.start_claimed(bindparam("b_node"), _IDS, bindparam("b_started_at"))
    ],
    "claim_and_start": lambda p: [
        p.claim_and_start(bindparam("b_node"), _IDS, bindparam("b_started_at"), bindparam("b_load"))
    ],
    "claim_and_start_reading_jobs": lambda p: [
        p.claim_and_start_reading_jobs(
            bindparam("b_node"), _IDS, bindparam("b_started_at"), bindparam("b_load")
        )
    ],
    "select_claimed": lambda p: [p.select_claimed(bindparam("b_node"), _IDS)],
    "select_pending_for_node": lambda p: [p.select_pending_for_node("n", 10)],
    "select_orphaned_partitions": lambda p: [p.select_orphaned_partitions(1)],
    "retry_partition": lambda p: [
        p.retry_partition(1, "n", 1),
        p.retry_partition(1, "n", 1, placed=True),
    ],
    "select_stalled": lambda p: [p.select_stalled(1, 60_000)],
    "time_out_partition": lambda p: [
        p.time_out_partition(1, "n", 1, 60_000, retry=True),
        p.time_out_partition(1, "n", 1, 60_000, retry=False),
    ],
    "select_partition_counts": lambda p: [p.select_partition_counts(1)],
    "select_in_flight_count": lambda p: [p.select_in_flight_count(1)],
    "select_partitions": lambda p: [p.select_partitions(1)],
    "select_pending_partition_ids": lambda p: [p.select_pending_partition_ids(1)],
    "select_partition_ids_in": lambda p: [p.select_partition_ids_in([1, 2], "PENDING")],
    "stop_pending_partitions": lambda p: [p.stop_pending_partitions([1, 2])],
    "bounded": lambda p: [
        *p.bounded(p.hold_partition(1, "n", 1)),
        *p.bounded(p.fail_job_partitions(1)),
    ],
    # a step's writes folded with its fence, where the database can
    "update_step_and_context": lambda p: [
        p.update_step_and_context(STEP_UPDATE, CONTEXT_UPDATE, CONTEXT_VALUES)
    ],
    "finish_partitions": lambda p: [
        p.finish_partitions("n", [(1, 1)], "COMPLETED"),
        p.finish_partitions(bindparam("g_node"), [(1, 1), (2, 3)], "COMPLETED"),
    ],
    "end_session": lambda p: [p.end_session((1, 2))],
    "session_alive": lambda p: [p.session_alive((1, 2))],
    "fold_guard": lambda p: [
        p.fold_guard(_guard(p), STEP_UPDATE),
        p.fold_guard(_guard(p), STEP_UPDATE, CONTEXT_UPDATE),
        p.fold_guard(_guard(p), STEP_UPDATE, CONTEXT_UPDATE, claim_next=True),
    ],
    "insert_unless_present": lambda p: [p.insert_unless_present(_ji, ["job_name", "job_key"])],
    "insert_child_row": lambda p: [
        p.insert_child_row(
            insert(_se).values(step_name=bindparam("b_name")),
            _se.c.step_execution_id,
            _sc,
            ["step_execution_id", "short_context", "serialized_context"],
        )
    ],
    "insert_with_children": lambda p: [
        p.insert_with_children(
            insert(_je).values(status=bindparam("b_status")),
            _je.c.job_execution_id,
            [
                (schema.job_execution_context, ["job_execution_id", "short_context"], ()),
                (schema.job_execution_params, ["job_execution_id"], schema.PARAMETER_COLUMNS),
            ],
        )
    ],
    "insert_from_arrays": lambda p: [
        p.insert_from_arrays(partitions, ["step_execution_id", "partition_name"])
    ],
    "update_from_arrays": lambda p: [
        p.update_from_arrays(
            _se,
            ["step_execution_id", "version"],
            ["status", "end_time"],
            {"version": _se.c.version + 1},
        )
    ],
    "aggregate_parameters": lambda p: [
        None if found is None else select(*found).select_from(params)
        for params in [schema.job_execution_params.alias("jp")]
        for found in [p.aggregate_parameters(params, params.c.parameter_name)]
    ],
    # wake-ups (only where the database has them)
    "notify": lambda p: (
        _wakes(
            p,
            lambda: p.notify(p.notify_parameter("b_channels"), p.notify_parameter("b_payloads")),
        )
        + _wakes(p, lambda: p.notify(p.notify_parameter("b_channels")))
    ),
    "notify_from": lambda p: [p.notify_from(NEW_ROW, bindparam("b_channel"), NEW_ROW.c.id)],
    "together": lambda p: [p.together(_placement(p), _wake_or_master(p))],
    # job coordination
    "insert_master": lambda p: [
        p.insert_master(1, 1, "n", "launched"),
        p.insert_master(NEW_ROW.c.id, 1, bindparam("b_node"), "launched", source=NEW_ROW),
    ],
    "insert_coordination": lambda p: [
        p.insert_coordination(1, "n"),
        p.insert_coordination(NEW_ROW.c.id, bindparam("b_node"), source=NEW_ROW),
        p.insert_coordination(
            NEW_ROW.c.id, bindparam("b_node"), "STARTED", NEW_ROW.c.id, "w", source=NEW_ROW
        ),
    ],
    "hold_mastership": lambda p: [p.hold_mastership(1, "n", 1)],
    "place_coordination": lambda p: [p.place_coordination(1, "n", 1, 2, "w")],
    "finish_mastership": lambda p: [p.finish_mastership(1, "n", 1, "COMPLETED")],
    "set_coordination_status": lambda p: [
        p.set_coordination_status(1, "n", 2, ["STARTED"], "COMPLETED")
    ],
    "fail_job_partitions": lambda p: [p.fail_job_partitions(1), p.fail_job_partitions(1, [2, 3])],
    "select_in_flight_partition_ids": lambda p: [p.select_in_flight_partition_ids(1)],
    "select_stranded_masters": lambda p: [p.select_stranded_masters()],
    "select_recovering_owned_by": lambda p: [p.select_recovering_owned_by("n")],
    "claim_stranded_master": lambda p: [p.claim_stranded_master(1, "n", 1, "STARTED", "m")],
    # stopping a job
    "request_stop": lambda p: [p.request_stop(1, datetime(2026, 1, 1))],
    "select_stopping": lambda p: [p.select_stopping()],
    # launch requests and schedules
    "insert_launch_request": lambda p: [p.insert_launch_request()],
    "select_pending_launches": lambda p: [
        p.select_pending_launches(bindparam("b_jobs", expanding=True), 10)
    ],
    "lock_pending_launches": lambda p: [p.lock_pending_launches(_IDS)],
    "claim_launches": lambda p: [p.claim_launches(bindparam("b_node"), _IDS)],
    "select_claimed_launches": lambda p: [p.select_claimed_launches(bindparam("b_node"), _IDS)],
    "end_launch": lambda p: [
        p.end_launch(bindparam("b_id"), bindparam("b_node"), "LAUNCHED"),
        p.end_launch(bindparam("b_id"), bindparam("b_node"), "FAILED"),
    ],
    "release_lost_launches": lambda p: [p.release_lost_launches()],
    "select_lost_launch": lambda p: [p.select_lost_launch()],
    "select_launch_request": lambda p: [p.select_launch_request(bindparam("b_id"))],
    "insert_schedule_fire": lambda p: [p.insert_schedule_fire()],
    "select_last_fire": lambda p: [p.select_last_fire(bindparam("b_name"))],
    # pruning
    "prunable_where": lambda p: [
        _select_of(p.prunable_where(["COMPLETED", "FAILED"], ms, "COMPLETED")) for ms in AGES_MS
    ],
    "select_prunable": lambda p: [
        p.select_prunable(["COMPLETED"], 30 * _DAY_MS, "COMPLETED", 0),
        p.select_prunable(["COMPLETED"], 30 * _DAY_MS, "COMPLETED", 3),
    ],
    "select_prunable_recheck": lambda p: [
        p.select_prunable_recheck(["COMPLETED"], 30 * _DAY_MS, "COMPLETED")
    ],
    "select_steps_of": lambda p: [p.select_steps_of()],
    "delete_step_rows": lambda p: p.delete_step_rows(),
    "delete_job_rows": lambda p: p.delete_job_rows(),
    "select_instances_of": lambda p: [p.select_instances_of()],
    "delete_empty_instances": lambda p: [p.delete_empty_instances()],
    "count_prunable": lambda p: list(
        p.count_prunable(p.select_prunable(["COMPLETED"], 30 * _DAY_MS, "COMPLETED", 3)).values()
    ),
    # leases
    "insert_lease": lambda p: [p.insert_lease("prune", "n")],
    "release_lease": lambda p: [p.release_lease("prune", "n")],
    "select_leases": lambda p: [p.select_leases(10_000)],
    "poll_and_leases": lambda p: [
        p.poll_and_leases(bindparam("b_node"), None, None, 10_000, 10_000),
        p.poll_and_leases(bindparam("b_node"), 4, 5000, 10_000, 10_000),
    ],
    "heartbeat_and_read": lambda p: [
        p.heartbeat_and_read(
            bindparam("b_node"),
            bindparam("b_load"),
            p.poll_and_leases(bindparam("b_node"), limit, 5000, 10_000, 10_000),
        )
        for limit in (None, 4)
    ],
    "heartbeat_renewing": lambda p: [
        p.heartbeat_renewing(
            bindparam("b_node"), bindparam("b_load"), [bindparam("b_lease_0")], 10_000
        ),
        p.heartbeat_renewing("n", 0, ["sweep", "prune"], 10_000),
    ],
    "heartbeat_renewing_and_read": lambda p: [
        p.heartbeat_renewing_and_read(
            bindparam("b_node"), bindparam("b_load"), [bindparam("b_lease_0")], 10_000, read
        )
        for read in (
            None,
            p.select_claimable(bindparam("b_node"), 4, 5000, 10_000),
            p.poll_and_leases(bindparam("b_node"), 4, 5000, 10_000, 10_000),
        )
    ],
    "renew_leases": lambda p: [
        p.renew_leases(["sweep", "prune"], "n", 10_000),
        p.renew_leases(bindparam("b_names", expanding=True), bindparam("b_holder"), 10_000),
    ],
    "take_lapsed_lease": lambda p: [
        p.take_lapsed_lease("sweep", "n", 10_000),
        p.take_lapsed_lease(bindparam("b_name"), bindparam("b_holder"), 10_000),
    ],
    # DDL, migrations and sessions (SQL text)
    "ddl_statements": lambda p: p.ddl_statements(),
    "ddl_script": lambda p: [p.ddl_script()],
    "record_schema_version": lambda p: [p.record_schema_version("0002")],
    "literal_sql": lambda p: [p.literal_sql(p.record_schema_version("0002"))],
    "add_column_sql": lambda p: p.add_column_sql("batch_nodes", "epoch INTEGER"),
    "alter_column_type_sql": _retype,
    "after_alter_sql": lambda p: p.after_alter_sql("batch_nodes"),
    "rename_column_sql": lambda p: p.rename_column_sql(
        "batch_job_instance", '"version"', p.quote("version")
    ),
    "unless_present": lambda p: [
        *p.unless_present("table", "batch_leases", None, ["CREATE TABLE batch_leases (x INT)"]),
        *p.unless_present(
            "index", "batch_leases", "ix_x", ["CREATE INDEX ix_x ON batch_leases (x)"]
        ),
        *p.unless_present("column", "batch_leases", "y", p.add_column_sql("batch_leases", "y INT")),
    ],
    "drop_primary_key_sql": _pk,
    "create_database_sql": lambda p: [p.create_database_sql("dbc_scratch")],
    "drop_database_sql": lambda p: [p.drop_database_sql("dbc_scratch")],
    "session_statements": lambda p: p.session_statements(_LIMITS),
}


class StatementError(AssertionError):
    """A provider method whose statement its dialect cannot compile."""


@dataclass(frozen=True)
class Rendered:
    """What one provider method gave: its statements as SQL text (empty: not on this
    database, which answers None where it has no such statement)."""

    method: str
    sql: tuple[str, ...]


def provider_methods(
    provider_class: type[QueryProvider], *, contract_only: bool = False
) -> set[str]:
    """The public methods of ``provider_class`` (with ``contract_only``, those the
    :class:`QueryProvider` contract defines: a third party's own helpers are left out)."""
    owner = QueryProvider if contract_only else provider_class
    return {
        name
        for name, value in inspect.getmembers(owner)
        if not name.startswith("_") and callable(value) and not isinstance(value, type)
    }


def unlisted(provider_class: type[QueryProvider], *, contract_only: bool = False) -> list[str]:
    """Public methods named neither in :data:`CALLS` nor in :data:`NOT_SQL`."""
    methods = provider_methods(provider_class, contract_only=contract_only)
    return sorted(methods - set(CALLS) - set(NOT_SQL))


def compile_sql(provider: QueryProvider, statement: Any) -> str:
    """``statement`` as its dialect renders it (SQL text is already rendered)."""
    if isinstance(statement, str):
        return statement
    if isinstance(statement, ClauseElement):
        # An executemany INSERT gets its values per row: compile it for the columns a row has.
        rows = isinstance(statement, Insert) and statement.select is None
        keys = list(PLACED_COLUMNS) if rows and statement.table is partitions else None
        return str(statement.compile(dialect=provider.dialect, column_keys=keys))
    raise TypeError(f"not a statement: {statement!r}")


def render(provider: QueryProvider, method: str) -> Rendered:
    """Call ``method`` as :data:`CALLS` says and compile each statement it gives."""
    try:
        built = CALLS[method](provider)
        sql = tuple(compile_sql(provider, s) for s in built if s is not None)
    except Exception as exc:  # noqa: BLE001 - reported with the method's name
        raise StatementError(
            f"{provider.name}: {method}() does not compile on {provider.dialect.name} "
            f"{_version(provider)}: {type(exc).__name__}: {exc}"
        ) from exc
    return Rendered(method, sql)


def render_all(provider: QueryProvider, *, contract_only: bool = False) -> dict[str, Rendered]:
    """Every statement of every SQL-building method of ``provider``; raises
    :class:`StatementError` naming the methods that do not compile, or that neither table
    lists."""
    missing = unlisted(type(provider), contract_only=contract_only)
    if missing:
        raise StatementError(
            f"{type(provider).__name__} has methods that neither CALLS nor NOT_SQL (in "
            f"{__name__}) lists: {', '.join(missing)}; say how to call each one"
        )
    methods = provider_methods(type(provider), contract_only=contract_only)
    failures: list[str] = []
    found: dict[str, Rendered] = {}
    for method in sorted(methods & set(CALLS)):
        try:
            found[method] = render(provider, method)
        except StatementError as exc:
            failures.append(str(exc))
    if failures:
        raise StatementError("\n".join(failures))
    return found


def _version(provider: QueryProvider) -> str:
    version = getattr(provider.dialect, "server_version_info", None) or ()
    return ".".join(str(part) for part in version)
