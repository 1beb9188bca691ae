"""Fences: what an execution's every transaction must still own when it commits.

A cluster runs a partition on a worker node and a job (and the steps it runs itself) on its
master. Either may lose what it works for while a transaction is open: a partition is moved to
another node, a job is taken over or abandoned. A guard that is only *read* (an ``EXISTS`` in a
``WHERE``) protects nothing under READ COMMITTED, because the owner row can change between that
read and the ``COMMIT``. A fence therefore *writes* its owner row: :meth:`Fence.hold` runs a
guarded ``UPDATE`` of that row inside the transaction and requires it to change exactly one row.
The row stays locked until ``COMMIT``, so a transfer of ownership either waits for this commit or
has already committed, and then the ``UPDATE`` changes nothing and the whole transaction (user
writes included) rolls back.

The batch model only calls fences; the cluster builds them (a partition's row, a job's
coordination row). Without a cluster an execution has no fence and nothing extra is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection

from dbcluster.batch.exceptions import OptimisticLockingFailureError


class FencedError(OptimisticLockingFailureError):
    """The execution no longer owns what it writes for (its partition moved, its node was
    removed, or its job's mastership passed to another node): nothing of this transaction
    commits, and nothing more may be written for it from here."""


class Fence(Protocol):
    """The ownership an execution's transactions hold at commit time."""

    def hold(self, conn: Connection) -> None:
        """Inside a transaction that writes for the execution, after its own work and before
        its bookkeeping: take the owner row with a guarded ``UPDATE``; raise
        :class:`FencedError` unless it changed exactly one row."""
        ...

    def finish(self, conn: Connection, execution: Any) -> None:
        """In the execution's final transaction, instead of :meth:`hold`: record its end on the
        owner row under the same guard (a partition becomes COMPLETED or FAILED with its step),
        or raise :class:`FencedError`. ``execution`` is the step or job execution whose final
        state this transaction writes."""
        ...


@dataclass(frozen=True)
class FoldedGuard:
    """A fence's final guarded ``UPDATE`` handed to the step's final write, to run in the same
    statement where the database can (see ``QueryProvider.fold_guard``): the owner row is still
    written first and held to ``COMMIT``; only the round trip goes. A fence offers one from
    ``finish_guard(execution)`` (an optional method; a fence without it is finished on its
    own)."""

    #: The guarded UPDATE (built once, bound parameters).
    statement: Any
    #: Its parameters (``b_id`` is the step execution's id, as in the step's own write).
    params: dict[str, Any]
    #: The error to raise when the guard changed no row.
    refused: Callable[[], FencedError]
    #: Called once the transaction that wrote the owner row and the step's committed (also
    #: when its unclear commit was found to have landed; never after a try that failed).
    done: Callable[[], None]
    #: The parameters of what the owner asks to write next in the same statement, once the
    #: step's write changed its rows (a cluster node claims its next partition there: see
    #: ``QueryProvider.fold_guard``); None: nothing.
    then_params: dict[str, Any] | None = None
    #: Given the statement's row when ``then_params`` was written (before ``COMMIT``, or with
    #: it where the statement was sent with it: the transaction may still roll back or be tried
    #: again; a row lost with an unclear commit that landed is never given).
    took: Callable[[Any], None] | None = None


def hold(fence: Fence | None, conn: Connection) -> None:
    """:meth:`Fence.hold` when there is a fence."""
    if fence is not None:
        fence.hold(conn)


def met_outage(fence: Fence | None, error: BaseException) -> bool:
    """Whether ``error``, what failed a step, is the database's passing trouble that the owner
    of the step's ``fence`` reports as an outage of its own (one WARNING per outage, however many
    steps it failed; a cluster node's partitions): a fence may offer ``met_outage(error)`` (an
    optional method). Without it, or without a fence, False: the step's failure is its own
    WARNING."""
    offer = getattr(fence, "met_outage", None)
    return offer is not None and bool(offer(error))
