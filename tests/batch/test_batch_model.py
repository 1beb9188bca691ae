"""The in-memory model: contexts, parameters, statuses, registry. No database needed."""

from __future__ import annotations

import math
import sys
import types
from datetime import date, datetime
from pathlib import Path

import pytest

from dbcluster.batch import (
    BatchStatus,
    ChunkContext,
    ChunkStep,
    ContextValueError,
    ExecutionContext,
    ExitStatus,
    IntegerRangePartitioner,
    IterableItemReader,
    Job,
    JobParameter,
    JobParameters,
    JobParametersError,
    JobRegistry,
    ListItemWriter,
    NoSuchJobError,
    NoSuchStepError,
    PartitionStep,
    RegistryLoadError,
    load_registry,
    tasklet,
)
from dbcluster.errors import DbclusterError


def test_context_refuses_non_json_value_naming_the_key() -> None:
    ctx = ExecutionContext()
    with pytest.raises(ContextValueError, match="'reader.position'") as caught:
        ctx.put("reader.position", object())
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, DbclusterError)
    with pytest.raises(ContextValueError, match="'when'"):
        ctx["when"] = datetime(2024, 1, 1)
    with pytest.raises(ContextValueError, match="'ratio'"):
        ctx.put("ratio", math.nan)
    with pytest.raises(ContextValueError, match="'tags'"):
        ctx.put("tags", {"a", "b"})
    assert "reader.position" not in ctx and len(ctx) == 0
    assert not ctx.dirty


def test_context_normalizes_and_tracks_dirty() -> None:
    ctx = ExecutionContext({"a": 1})
    assert not ctx.dirty
    ctx.put("a", 1)
    assert not ctx.dirty, "putting an equal value does not dirty the context"
    ctx.put("pair", (1, "x"))
    assert ctx.dirty and ctx["pair"] == [1, "x"]
    again = ExecutionContext.from_json(ctx.to_json())
    assert again == ctx and not again.dirty
    copy = ctx.copy()
    copy.put("a", 2)
    assert ctx["a"] == 1


def test_parameters_parse_types_and_identity() -> None:
    params = JobParameters.parse(
        [
            "run.date(date)=2024-01-01",
            "count(int)=5",
            "ratio(float)=0.5",
            "name=x=y",
            "dry(bool)=true",
            "at(datetime)=2024-01-01T10:00:00",
            "-attempt(int)=3",
        ]
    )
    assert params["run.date"] == date(2024, 1, 1)
    assert params["count"] == 5 and params["ratio"] == 0.5 and params["name"] == "x=y"
    assert params["dry"] is True and params["at"] == datetime(2024, 1, 1, 10)
    assert params.parameter("attempt") == JobParameter(3, identifying=False)
    assert set(params.identifying()) == {"run.date", "count", "ratio", "name", "dry", "at"}
    # The key ignores non-identifying parameters and the order of the identifying ones.
    other = JobParameters.parse(list(reversed(params.to_strings()[:-1])) + ["-attempt(int)=9"])
    assert other.job_key() == params.job_key()
    assert len(params.job_key()) == 64
    assert (
        JobParameters.parse(["count(int)=6"]).job_key()
        != JobParameters.parse(["count(int)=5"]).job_key()
    )
    assert (
        JobParameters.parse(["count(int)=5"]).job_key()
        != JobParameters.parse(["count=5"]).job_key()
    ), "the type is part of the identity"
    assert JobParameters.parse(params.to_strings()) == params


@pytest.mark.parametrize(
    "text", ["noequals", "x(decimal)=1", "n(int)=five", "d(date)=yesterday", "=1", "b(bool)=maybe"]
)
def test_parameters_bad_syntax(text: str) -> None:
    with pytest.raises(JobParametersError) as caught:
        JobParameters.parse([text])
    assert isinstance(caught.value, ValueError)


def test_parameters_refuse_unsupported_value() -> None:
    with pytest.raises(JobParametersError, match="list"):
        JobParameters({"x": [1]})  # type: ignore[dict-item]


def test_batch_status_order_and_upgrade() -> None:
    order = list(BatchStatus)
    assert [s.value for s in order] == [
        "COMPLETED",
        "STARTING",
        "STARTED",
        "STOPPING",
        "STOPPED",
        "FAILED",
        "ABANDONED",
        "UNKNOWN",
    ]
    assert all(a < b for a, b in zip(order, order[1:], strict=False))
    assert BatchStatus.max(BatchStatus.FAILED, BatchStatus.COMPLETED) is BatchStatus.FAILED
    assert BatchStatus.STARTED.upgrade_to(BatchStatus.COMPLETED) is BatchStatus.COMPLETED
    assert BatchStatus.COMPLETED.upgrade_to(BatchStatus.FAILED) is BatchStatus.FAILED
    assert BatchStatus.STARTING.upgrade_to(BatchStatus.STARTED) is BatchStatus.STARTED
    assert BatchStatus.STOPPING.is_running and not BatchStatus.STOPPED.is_running


def test_exit_status_and_takes_the_more_severe() -> None:
    done = ExitStatus("COMPLETED", "ok")
    failed = ExitStatus("FAILED", "boom")
    assert done.and_(failed) == ExitStatus("FAILED", "ok; boom")
    assert failed.and_(done).code == "FAILED"
    assert ExitStatus("CUSTOM").and_(failed).code == "CUSTOM"
    assert ExitStatus("EXECUTING").and_(done).code == "COMPLETED"


def _sample_job() -> Job:
    worker = ChunkStep("worker", reader=IterableItemReader([]), writer=ListItemWriter())
    split = PartitionStep("split", worker, IntegerRangePartitioner(0, 10))

    @tasklet
    def prepare(ctx: object) -> None:
        return None

    return Job("sample", [prepare, split])


def test_registry_finds_jobs_and_nested_steps() -> None:
    job = _sample_job()
    registry = JobRegistry([job])
    assert registry.get_job("sample") is job
    assert registry.get_step("worker") is job.steps[1].worker_step  # type: ignore[attr-defined]
    assert registry.get_step("prepare").name == "prepare"
    with pytest.raises(NoSuchJobError, match="'nope'"):
        registry.get_job("nope")
    with pytest.raises(NoSuchStepError, match="'nope'"):
        registry.get_step("nope")


def test_load_registry_from_module_attribute() -> None:
    module = types.ModuleType("dbcluster_test_jobs")
    module.registry = JobRegistry([_sample_job()])  # type: ignore[attr-defined]
    module.make = lambda: [_sample_job()]  # type: ignore[attr-defined]
    module.other = 3  # type: ignore[attr-defined]
    module.step_function = lambda ids, ctx: None  # type: ignore[attr-defined]
    module.Context = ChunkContext  # type: ignore[attr-defined]
    sys.modules["dbcluster_test_jobs"] = module
    try:
        assert load_registry("dbcluster_test_jobs:registry").get_job("sample")
        assert load_registry("dbcluster_test_jobs:make").get_step("worker")
        with pytest.raises(RegistryLoadError, match="package.module:attribute"):
            load_registry("dbcluster_test_jobs")
        with pytest.raises(RegistryLoadError, match="no attribute"):
            load_registry("dbcluster_test_jobs:missing")
        with pytest.raises(RegistryLoadError, match="int"):
            load_registry("dbcluster_test_jobs:other")
        with pytest.raises(RegistryLoadError, match="cannot import"):
            load_registry("no_such_module_xyz:registry")
        # A job's function or a class needing arguments: one line, not a TypeError from within.
        with pytest.raises(RegistryLoadError, match="function that takes arguments"):
            load_registry("dbcluster_test_jobs:step_function")
        with pytest.raises(RegistryLoadError, match="class that takes arguments"):
            load_registry("dbcluster_test_jobs:Context")
    finally:
        del sys.modules["dbcluster_test_jobs"]


def test_load_registry_finds_a_module_of_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like Celery's ``-A``: ``dbcluster worker --app myjobs:registry`` run from the folder of
    ``myjobs.py`` loads it, though the ``dbcluster`` script's own folder is what Python put on
    ``sys.path`` (the current directory is not)."""
    (tmp_path / "dbc_cwd_jobs.py").write_text(
        "from dbcluster import JobRegistry, partitioned_job\n"
        "registry = JobRegistry([partitioned_job(lambda ids, ctx: None, name='cwd', "
        "ids=range(3))])\n"
    )
    monkeypatch.chdir(tmp_path)
    here = str(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", here)])
    monkeypatch.delitem(sys.modules, "dbc_cwd_jobs", raising=False)

    assert load_registry("dbc_cwd_jobs:registry").job_names() == ["cwd"]
    assert sys.path[0] == here  # later imports of the application's own modules work too
    load_registry("dbc_cwd_jobs:registry")
    assert sys.path.count(here) == 1
    sys.modules.pop("dbc_cwd_jobs", None)


def test_range_partitioner_names_derive_from_slices() -> None:
    parts = IntegerRangePartitioner(0, 10).partition(3)
    assert list(parts) == ["range-0-3", "range-3-6", "range-6-10"]
    assert parts["range-3-6"] == {"lo": 3, "hi": 6}


def test_a_context_of_plain_values_keeps_them_as_json_would_and_copies_apart() -> None:
    """Plain values (str, int, bool, None, finite floats) are stored without a trip through
    JSON, exactly as that trip gives them back; anything else still goes through it (a tuple
    becomes a list, NaN is refused); a copy shares nothing with its original."""
    import json
    import math

    from dbcluster.batch import ExecutionContext
    from dbcluster.batch.exceptions import ContextValueError

    plain = {"s": "é\ud800x", "i": 10**30, "b": True, "n": None, "f": 0.1, "neg": -0.0}
    ctx = ExecutionContext(plain)
    for key, value in plain.items():
        again = json.loads(json.dumps(value, ensure_ascii=True))
        assert ctx[key] == again and type(ctx[key]) is type(again)
    ctx.put("t", (1, 2))
    assert ctx["t"] == [1, 2]
    with pytest.raises(ContextValueError):  # past the interpreter's digits for str(int)
        ctx.put("huge", 10**5000)
    with pytest.raises(ContextValueError):
        ctx.put("nan", math.nan)
    original = ExecutionContext({"lo": 1, "hi": 2})
    copy = original.copy()
    copy.put("lo", 5)
    assert original["lo"] == 1 and copy.to_json() == '{"hi": 2, "lo": 5}'
    nested = ExecutionContext({"list": [1, 2]})
    clone = nested.copy()
    clone["list"].append(3)
    assert nested["list"] == [1, 2]
