"""Job parameters: typed values with an identifying flag, and the job-instance key they produce."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Union

from dbcluster.batch.exceptions import JobParametersError

ParameterValue = Union[str, int, float, bool, date, datetime]  # noqa: UP007

_TYPE_NAMES = ("str", "int", "float", "bool", "date", "datetime")


def type_name_of(value: object) -> str:
    """The parameter type name of a value (bool before int, datetime before date)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, datetime):
        return "datetime"
    if isinstance(value, date):
        return "date"
    if isinstance(value, str):
        return "str"
    raise JobParametersError(
        f"job parameter values must be str, int, float, bool, date or datetime, "
        f"not {type(value).__name__}"
    )


def format_value(value: ParameterValue) -> str:
    """The canonical text of a parameter value (what is stored and hashed)."""
    kind = type_name_of(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "float":
        return repr(float(value))
    if kind in ("date", "datetime"):
        return value.isoformat()  # type: ignore[union-attr]
    return str(value)


def parse_value(type_name: str, text: str) -> ParameterValue:
    """The inverse of :func:`format_value`."""
    try:
        if type_name == "str":
            return text
        if type_name == "int":
            return int(text)
        if type_name == "float":
            return float(text)
        if type_name == "bool":
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes"):
                return True
            if lowered in ("false", "0", "no"):
                return False
            raise ValueError(f"{text!r} is not a boolean (true/false)")
        if type_name == "date":
            return date.fromisoformat(text)
        if type_name == "datetime":
            return datetime.fromisoformat(text)
    except ValueError as error:
        raise JobParametersError(f"cannot read {text!r} as {type_name}: {error}") from error
    raise JobParametersError(
        f"unknown job parameter type {type_name!r}; use one of {', '.join(_TYPE_NAMES)}"
    )


@dataclass(frozen=True)
class JobParameter:
    """One typed parameter value; identifying parameters make up the job instance's identity."""

    value: ParameterValue
    identifying: bool = True

    def __post_init__(self) -> None:
        type_name_of(self.value)

    @property
    def type_name(self) -> str:
        return type_name_of(self.value)

    @property
    def text(self) -> str:
        return format_value(self.value)


# name, optional (type), '=' value; a leading '-' marks the parameter non-identifying.
_SYNTAX = re.compile(
    r"^(?P<minus>-)?(?P<name>[^=()\s][^=()]*?)(?:\((?P<type>[a-z]+)\))?=(?P<value>.*)$", re.DOTALL
)


class JobParameters(Mapping[str, ParameterValue]):
    """An immutable, ordered map of job parameters.

    Built from plain values (identifying) or :class:`JobParameter` objects::

        JobParameters({"run.date": date(2024, 1, 1), "attempt": JobParameter(2, identifying=False)})
        JobParameters.parse(["run.date(date)=2024-01-01", "-attempt(int)=2"])
    """

    def __init__(self, values: Mapping[str, ParameterValue | JobParameter] | None = None) -> None:
        params: dict[str, JobParameter] = {}
        for name, value in (values or {}).items():
            if not isinstance(name, str) or not name:
                raise JobParametersError(f"job parameter names must be non-empty str: {name!r}")
            params[name] = value if isinstance(value, JobParameter) else JobParameter(value)
        self._params = params

    @classmethod
    def parse(cls, items: Iterable[str]) -> JobParameters:
        """Parse ``[-]name[(type)]=value`` strings.

        ``type`` is one of str (default), int, float, bool, date (ISO), datetime (ISO); a leading
        ``-`` makes the parameter non-identifying, e.g. ``run.date(date)=2024-01-01``,
        ``count(int)=5``, ``-attempt(int)=2``.
        """
        values: dict[str, JobParameter] = {}
        for item in items:
            match = _SYNTAX.match(item)
            if match is None:
                raise JobParametersError(
                    f"bad job parameter {item!r}: expected [-]name[(type)]=value, "
                    f"e.g. run.date(date)=2024-01-01 or -attempt(int)=2"
                )
            type_name = match["type"] or "str"
            if type_name not in _TYPE_NAMES:
                raise JobParametersError(
                    f"bad job parameter {item!r}: unknown type {type_name!r}; "
                    f"use one of {', '.join(_TYPE_NAMES)}"
                )
            name = match["name"].strip()
            try:
                value = parse_value(type_name, match["value"])
            except JobParametersError as error:
                raise JobParametersError(f"bad job parameter {item!r}: {error}") from error
            values[name] = JobParameter(value, identifying=match["minus"] is None)
        return cls(values)

    def parameter(self, name: str) -> JobParameter:
        return self._params[name]

    def parameters(self) -> dict[str, JobParameter]:
        return dict(self._params)

    def __getitem__(self, name: str) -> ParameterValue:
        return self._params[name].value

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def identifying(self) -> dict[str, JobParameter]:
        return {name: p for name, p in self._params.items() if p.identifying}

    def job_key(self) -> str:
        """A stable hash (sha256 hex, 64 chars) of the identifying parameters."""
        canonical = json.dumps(
            sorted([name, p.type_name, p.text] for name, p in self.identifying().items()),
            separators=(",", ":"),
            ensure_ascii=True,
        )
        return hashlib.sha256(canonical.encode("ascii")).hexdigest()

    def to_strings(self) -> list[str]:
        """The parameters in the syntax :meth:`parse` reads."""
        return [
            f"{'' if p.identifying else '-'}{name}({p.type_name})={p.text}"
            for name, p in self._params.items()
        ]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JobParameters):
            return self._params == other._params
        return NotImplemented

    def __hash__(self) -> int:
        # Equal parameters hash alike whatever their order (equality ignores it too).
        return hash(frozenset(self._params.items()))

    def __repr__(self) -> str:
        return f"JobParameters({self.to_strings()!r})"


def as_job_parameters(params: JobParameters | Mapping[str, Any] | None) -> JobParameters:
    if params is None:
        return JobParameters()
    if isinstance(params, JobParameters):
        return params
    return JobParameters(params)


class RunIdIncrementer:
    """Makes the next run's parameters: the previous run's, with ``key`` (default ``run.id``, an
    identifying int) one higher (1 for a first run). Give it to ``Job(incrementer=...)`` and start
    the next run with ``JobLauncher.next_parameters`` or ``dbcluster launch --next``."""

    def __init__(self, key: str = "run.id") -> None:
        self.key = key

    def get_next(self, previous: JobParameters | None) -> JobParameters:
        values = previous.parameters() if previous is not None else {}
        last = values.get(self.key)
        number = last.value if last is not None else 0
        if isinstance(number, bool) or not isinstance(number, int):
            raise JobParametersError(
                f"parameter {self.key!r} of the last run is {number!r}, not an int to increment"
            )
        values[self.key] = JobParameter(number + 1)
        return JobParameters(values)


ParameterType = type | str


def _type_name(expected: ParameterType) -> str:
    name = expected if isinstance(expected, str) else getattr(expected, "__name__", "")
    if name not in _TYPE_NAMES:
        raise JobParametersError(
            f"unknown job parameter type {expected!r}; use one of {', '.join(_TYPE_NAMES)}"
        )
    return name


class ParametersValidator:
    """Checks a job's parameters at every launch (Spring's ``DefaultJobParametersValidator``,
    with types): each ``required`` key must be there; when ``optional`` is given, no key outside
    ``required`` and ``optional`` may be; a key given a type (``{"run.date": date}`` or
    ``"date"``; None: any) must have a value of that type. Keys may be given as a list (any
    type) or a mapping of key to type."""

    def __init__(
        self,
        required: Mapping[str, ParameterType | None] | Iterable[str] = (),
        optional: Mapping[str, ParameterType | None] | Iterable[str] | None = None,
    ) -> None:
        self.required = self._typed(required)
        self.optional = None if optional is None else self._typed(optional)
        both = set(self.required) & set(self.optional or ())
        if both:
            raise JobParametersError(f"keys both required and optional: {sorted(both)}")

    @staticmethod
    def _typed(keys: Mapping[str, ParameterType | None] | Iterable[str]) -> dict[str, str | None]:
        if isinstance(keys, Mapping):
            return {k: None if t is None else _type_name(t) for k, t in keys.items()}
        return {k: None for k in keys}

    def validate(self, params: JobParameters, *, also_allowed: Iterable[str] = ()) -> None:
        """Raise :class:`JobParametersError` naming every problem found."""
        problems = [f"{key!r} is missing" for key in self.required if key not in params]
        if self.optional is not None:
            known = {*self.required, *self.optional, *also_allowed}
            problems += [
                f"{key!r} is not a parameter of this job" for key in params if key not in known
            ]
        expected = {**(self.optional or {}), **self.required}
        for key, value in params.items():
            kind = expected.get(key)
            if kind is not None and type_name_of(value) != kind:
                problems.append(f"{key!r} must be {kind}, not {type_name_of(value)} ({value!r})")
        if problems:
            raise JobParametersError("bad job parameters: " + "; ".join(problems))
