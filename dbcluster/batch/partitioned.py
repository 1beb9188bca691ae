"""A partitioned job made of one function over a range of ids: the shortest way to a cluster job.

::

    registry = JobRegistry()

    @registry.partitioned_job(ids=range(1, 1_000_001), partitions=8)
    def recompute(ids: range, ctx: ChunkContext) -> None:
        ...  # called with consecutive slices of at most chunk_size ids

is the job ``recompute``: one partitioned step whose partitions are contiguous slices of
``ids`` spread over the live worker nodes; each partition calls the function with chunks of its
slice, one transaction per chunk, and commits its position with each chunk, so a partition that
moves to another node (its node died) or runs again (a restart) goes on after its last
committed chunk. It is ordinary :class:`~dbcluster.batch.Job`, :class:`PartitionStep` and
:class:`TaskletStep` underneath, so everything else (stop, restart, retries, timeouts, metrics)
works as for any job.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Required, TypedDict, Unpack, overload

from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import StepExecution
from dbcluster.batch.exceptions import BatchError, StepConfigurationError
from dbcluster.batch.job import AutoRestart, Job
from dbcluster.batch.parameters import JobParameters
from dbcluster.batch.partition import PARTITION_NAMES_KEY, PartitionStep
from dbcluster.batch.partitioners import IntegerRangePartitioner
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.tasklet import RepeatStatus, TaskletStep

#: What the function is called with: a slice of the ids (``range``, step 1) and the chunk's
#: context (its transaction, the partition's context, the job's parameters).
IdsFunction = Callable[[range, ChunkContext], object]
#: ``ids``: a range of ints (step 1), or a function of the job's parameters returning one,
#: asked by the job's master when it splits the job (e.g. to read ``max(id)`` of a table).
Ids = range | Callable[[JobParameters], range]

#: Partition context key: the first id not yet done (committed with each chunk).
NEXT_ID_KEY = "dbcluster.ids.next"


class PartitionedJobOptions(TypedDict, total=False):
    """The options of :func:`partitioned_job` (all but ``ids`` optional)."""

    ids: Required[Ids]
    name: str
    partitions: int
    chunk_size: int
    transferable: bool
    transactional: bool
    max_attempts: int
    retry_on: Sequence[type[BaseException]]
    retry_backoff: float | timedelta
    timeout: float | timedelta | None
    incrementer: Any
    validator: Any
    auto_restart: AutoRestart | None


class IdRangePartitioner(IntegerRangePartitioner):
    """Slices of a range of ids, the range given or made from the job's parameters."""

    def __init__(self, ids: Ids, *, partitions: int | None, transferable: bool) -> None:
        super().__init__(0, 0, partitions=partitions, prefix="ids-", transferable=transferable)
        self.ids = ids

    def for_parameters(
        self, parameters: JobParameters, grid_size: int
    ) -> dict[str, ExecutionContext]:
        ids = self.ids(parameters) if callable(self.ids) else self.ids
        if not isinstance(ids, range) or ids.step != 1:
            raise BatchError(f"ids must be a range of step 1 (range(first, last + 1)), not {ids!r}")
        sliced = IntegerRangePartitioner(
            ids.start,
            ids.stop,
            partitions=self.partitions,
            prefix=self.prefix,
            transferable=self.transferable,
        )
        return sliced.partition(grid_size)

    def partition(self, grid_size: int) -> dict[str, ExecutionContext]:
        if callable(self.ids):
            raise BatchError("ids made from the job's parameters are split by the job's master")
        return self.for_parameters(JobParameters(), grid_size)


class IdRangeStep(PartitionStep):
    """A :class:`PartitionStep` over an :class:`IdRangePartitioner`: its first run splits the ids
    it gets from the job's parameters (a restart re-runs the earlier slices, as any)."""

    partitioner: IdRangePartitioner

    def plan(
        self, master: StepExecution, worker_count: int
    ) -> Mapping[str, ExecutionContext | Mapping[str, Any]] | None:
        if master.execution_context.get(PARTITION_NAMES_KEY) is not None:
            return None
        grid_size = self.grid_size or max(1, worker_count)
        return self.partitioner.for_parameters(master.job_execution.parameters, grid_size)


def _chunks(function: IdsFunction, chunk_size: int) -> Callable[[ChunkContext], RepeatStatus]:
    def tasklet(ctx: ChunkContext) -> RepeatStatus:
        context = ctx.step_context
        stop = int(context["hi"])
        first = int(context.get(NEXT_ID_KEY, context["lo"]))
        last = min(stop, first + chunk_size)
        if first < last:
            function(range(first, last), ctx)
            ctx.step_execution.read_count += last - first
        context.put(NEXT_ID_KEY, last)
        return RepeatStatus.FINISHED if last >= stop else RepeatStatus.CONTINUABLE

    return tasklet


def _check_function(function: Any, where: str) -> None:
    if not callable(function):
        raise StepConfigurationError(f"{where} needs a function, not {function!r}")
    try:
        inspect.signature(function).bind(range(0), None)
    except TypeError:
        raise StepConfigurationError(
            f"{where}: {getattr(function, '__name__', function)!r} must take two arguments, "
            "(ids, ctx)"
        ) from None
    except ValueError:  # no signature to read (a builtin): let the call say
        pass


def _build(
    function: IdsFunction,
    *,
    ids: Ids,
    name: str | None = None,
    partitions: int | None = None,
    chunk_size: int = 1000,
    transferable: bool = True,
    transactional: bool = False,
    max_attempts: int = 3,
    retry_on: Sequence[type[BaseException]] = (),
    retry_backoff: float | timedelta = 1.0,
    timeout: float | timedelta | None = None,
    incrementer: Any = None,
    validator: Any = None,
    auto_restart: AutoRestart | None = None,
) -> Job:
    _check_function(function, "partitioned_job")
    job_name = name or getattr(function, "__name__", None)
    if not job_name:
        raise StepConfigurationError("partitioned_job needs a name= for a function without one")
    if not (isinstance(ids, range) or callable(ids)):
        raise StepConfigurationError(
            f"partitioned_job {job_name!r}: ids must be a range or a function of the job's "
            f"parameters returning one, not {type(ids).__name__}"
        )
    if isinstance(ids, range) and ids.step != 1:
        raise StepConfigurationError(
            f"partitioned_job {job_name!r}: ids must be a range of step 1, not {ids!r}"
        )
    if partitions is not None and partitions < 1:
        raise StepConfigurationError(
            f"partitioned_job {job_name!r}: partitions must be at least 1, not {partitions}"
        )
    if chunk_size < 1:
        raise StepConfigurationError(
            f"partitioned_job {job_name!r}: chunk_size must be at least 1, not {chunk_size}"
        )
    worker = TaskletStep(
        f"{job_name}-slice", _chunks(function, chunk_size), transactional=transactional
    )
    step = IdRangeStep(
        job_name,
        worker,
        IdRangePartitioner(ids, partitions=partitions, transferable=transferable),
        max_attempts=max_attempts,
        retry_on=retry_on,
        retry_backoff=retry_backoff,
        timeout=timeout,
    )
    return Job(
        job_name,
        [step],
        incrementer=incrementer,
        validator=validator,
        auto_restart=auto_restart,
    )


@overload
def partitioned_job(function: IdsFunction, /, **options: Unpack[PartitionedJobOptions]) -> Job: ...


@overload
def partitioned_job(
    **options: Unpack[PartitionedJobOptions],
) -> Callable[[IdsFunction], Job]: ...


def partitioned_job(
    function: IdsFunction | None = None, /, **options: Unpack[PartitionedJobOptions]
) -> Any:
    """Make a partitioned :class:`~dbcluster.batch.Job` of ``function(ids, ctx)``.

    ``partitioned_job(fn, ids=range(1, 1001))`` returns the job; ``@partitioned_job(ids=...)``
    decorates ``fn`` (which then names the job); ``@registry.partitioned_job(...)`` also
    registers it. Options:

    - ``ids``: a ``range`` (step 1), or a function ``ids(parameters) -> range`` that the job's
      master calls when it splits a first run (``lambda p: range(1, p["count"] + 1)``).
    - ``name``: the job's name (default: the function's). Its partitioned step has the same name;
      the step each partition runs is ``<name>-slice``, its partitions ``ids-<first>-<stop>``.
    - ``partitions``: how many slices (default: one per live worker node when the job starts).
    - ``chunk_size`` (default 1000): at most this many ids per call; each call is one
      transaction that also commits the partition's position and its ``read_count``.
    - ``transferable`` (default True): a partition whose node died runs again elsewhere, from its
      last committed chunk. Say False when a chunk's effect outside the step's transaction must
      never happen twice: such a partition fails with its node instead.
    - ``transactional`` (default False): say True when ``function`` writes only through
      ``ctx.connection`` (nothing outside the chunk's transaction): a node may then run several
      small partitions (one chunk each) in one transaction (grouped commits, see
      :class:`~dbcluster.batch.TaskletStep` and docs/cluster.md).
    - ``max_attempts``, ``retry_on``, ``retry_backoff``, ``timeout``: as
      :class:`~dbcluster.batch.PartitionStep`; ``incrementer``, ``validator``, ``auto_restart``:
      as :class:`~dbcluster.batch.Job`.

    ``ctx.connection`` is the chunk's transaction in the job repository's database: what
    ``function`` writes through it commits with the partition's position, or not at all. Writes
    elsewhere (another database, a file, an API) commit on their own: a chunk whose transaction
    then fails, or whose node dies before it commits, is called again, so make them idempotent
    (an upsert keyed by id). ``function`` may also be called again after a transient database
    error, with the same ids.
    """
    if function is not None:
        return _build(function, **options)

    def wrap(fn: IdsFunction) -> Job:
        return _build(fn, **options)

    return wrap
