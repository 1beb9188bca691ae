"""The execution context: a JSON-only key/value map persisted with each job and step execution."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from dbcluster.batch.exceptions import ContextValueError

#: Integers this far from 0 are plain values (a longer one still goes through JSON, which may
#: refuse it: past the interpreter's limit on digits).
_INT64 = 1 << 63


def _normalize(key: str, value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is bool or value is None or (kind is int and -_INT64 <= value < _INT64):
        return value  # JSON gives it back as it is (a partitioner puts thousands of these)
    if kind is float and math.isfinite(value):
        return value
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=True)
    except (TypeError, ValueError) as error:
        raise ContextValueError(
            f"execution context key {key!r}: value of type {type(value).__name__} cannot be "
            f"stored as JSON ({error}); store str, int, float, bool, None, or lists/dicts of them"
        ) from error
    return json.loads(text)


#: Value types no one can change in place (a context holding only these changed only if dirty).
_SCALARS = frozenset({str, int, float, bool, type(None)})


class ExecutionContext:
    """A key/value map whose values must be JSON (never pickled), with a dirty flag.

    Values are normalized through JSON when put (a tuple becomes a list), so what a step sees is
    exactly what it will see after a restart.
    """

    __slots__ = ("_data", "_saved", "dirty")

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = {}
        #: The JSON last read from or written to the database (None: never).
        self._saved: str | None = None
        self.dirty = False
        if data:
            for key, value in data.items():
                self.put(key, value)
            self.dirty = False

    def put(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise ContextValueError(f"execution context keys must be str, got {key!r}")
        normalized = _normalize(key, value)
        if key not in self._data or self._data[key] != normalized:
            self._data[key] = normalized
            self.dirty = True

    def __setitem__(self, key: str, value: Any) -> None:
        self.put(key, value)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def remove(self, key: str) -> Any:
        value = self._data.pop(key, None)
        self.dirty = True
        return value

    def __delitem__(self, key: str) -> None:
        del self._data[key]
        self.dirty = True

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> Any:
        return self._data.keys()

    def items(self) -> Any:
        return self._data.items()

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.to_json())

    def update(self, other: Mapping[str, Any]) -> None:
        for key, value in other.items():
            self.put(key, value)

    def _scalars(self) -> bool:
        """Whether every value is one no one can change in place (a copy need not go through
        JSON)."""
        return all(type(value) in _SCALARS for value in self._data.values())

    def copy(self) -> ExecutionContext:
        clone = ExecutionContext()
        clone._data = dict(self._data) if self._scalars() else json.loads(self.to_json())
        clone.dirty = self.dirty
        clone._saved = self._saved
        return clone

    def reset_to(self, other: ExecutionContext) -> None:
        """Make this context (in place) a copy of ``other``, dirty flag included."""
        self._data = json.loads(other.to_json())
        self.dirty = other.dirty
        self._saved = other._saved

    def state(self) -> tuple[str, bool, str | None]:
        """What :meth:`restore_state` needs to undo later changes (cheaper than :meth:`copy`)."""
        return self.to_json(), self.dirty, self._saved

    def restore_state(self, state: tuple[str, bool, str | None]) -> None:
        text, self.dirty, self._saved = state
        if text != self.to_json():
            self._data = json.loads(text)

    def clear_dirty(self) -> None:
        self.dirty = False

    def mark_saved(self, text: str) -> None:
        """The database now holds ``text`` (this context's JSON)."""
        self._saved = text
        self.dirty = False

    def changed(self) -> bool:
        """Whether the database does not hold this context as it is now: put or removed since it
        was last saved, or a value mutated in place (which the dirty flag cannot see)."""
        if self.dirty or self._saved is None:
            return True
        if self._scalars():
            return False  # nothing in it can be mutated in place: only put or remove change it
        return self.to_json() != self._saved

    def to_json(self) -> str:
        return json.dumps(self._data, sort_keys=True, ensure_ascii=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | None) -> ExecutionContext:
        context = cls()
        if text:
            loaded = json.loads(text)
            if not isinstance(loaded, dict):
                raise ContextValueError(
                    f"a serialized execution context must be a JSON object: {text[:80]!r}"
                )
            context._data = loaded
            context._saved = text
        return context

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ExecutionContext):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"ExecutionContext({self._data!r}, dirty={self.dirty})"
