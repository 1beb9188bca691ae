"""The released 0.1.0 schema, as its ``schemas/<db>.sql`` files shipped it (copied verbatim from
the 0.1.0 tag into ``baseline_0_1_0/``): what a 0.1.0 ``dbcluster init`` or a DBA created.

Revision 0001 runs these statements; later revisions read from them what 0.1.0 had (a column's
rendered type, an index's name) instead of assuming it, so they never drift with ``schema.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

#: The tables 0.1.0 created (a database holding all of them and no version row is at 0.1.0).
TABLES_0_1_0 = (
    "batch_job_instance",
    "batch_nodes",
    "batch_job_execution",
    "batch_job_coordination",
    "batch_job_execution_context",
    "batch_job_execution_params",
    "batch_step_execution",
    "batch_partitions",
    "batch_step_execution_context",
)

_CREATE_TABLE = re.compile(r"^CREATE TABLE (\w+) \((.*)\)", re.S)
_CREATE_INDEX = re.compile(r"^CREATE INDEX (\w+) ON (\w+) \(([^)]*)\)")
_KEY = re.compile(r"^(?:CONSTRAINT (\w+) )?(PRIMARY KEY|UNIQUE) \(([^)]*)\)")
#: Where a column's type ends in its definition.
_TYPE_END = re.compile(r" (?:NOT NULL|NULL|GENERATED|AUTO_INCREMENT|IDENTITY)\b")


@dataclass(frozen=True)
class Key:
    """An index, unique constraint or primary key of the 0.1.0 schema."""

    kind: str  # "index", "unique" or "primary"
    name: str | None  # None: a primary key the database named
    table: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Baseline:
    """The 0.1.0 schema of one database."""

    statements: tuple[str, ...]
    #: (table, column) -> the type as 0.1.0 rendered it, e.g. "VARCHAR(100)".
    column_types: dict[tuple[str, str], str]
    keys: tuple[Key, ...]
    #: (table, column) -> the column's name as 0.1.0 wrote it, quotes and case kept (Db2's
    #: ``"version"``).
    column_names: dict[tuple[str, str], str] = field(default_factory=dict)

    def keys_on(self, table: str, columns: set[str]) -> list[Key]:
        """The indexes and keys of ``table`` that cover any of ``columns``."""
        return [k for k in self.keys if k.table == table and columns & set(k.columns)]


def _split(items: str) -> tuple[str, ...]:
    return tuple(part.strip().strip('"') for part in items.split(","))


@cache
def baseline(provider_name: str) -> Baseline:
    """The 0.1.0 schema of the database a provider serves (its name is the file's)."""
    path = resources.files(__package__).joinpath(f"baseline_0_1_0/{provider_name}.sql")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise LookupError(f"dbcluster 0.1.0 had no schema for {provider_name!r}") from None
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    statements = tuple(s.strip() for s in body.split(";\n") if s.strip().rstrip(";"))
    statements = tuple(s.rstrip(";").strip() for s in statements)
    types: dict[tuple[str, str], str] = {}
    names: dict[tuple[str, str], str] = {}
    keys: list[Key] = []
    for statement in statements:
        if index := _CREATE_INDEX.match(statement):
            keys.append(Key("index", index[1], index[2], _split(index[3])))
            continue
        table = _CREATE_TABLE.match(statement)
        if table is None:
            continue
        for line in table[2].splitlines():
            item = line.strip().rstrip(",").strip()
            if not item:
                continue
            if key := _KEY.match(item):
                kind = "primary" if key[2] == "PRIMARY KEY" else "unique"
                keys.append(Key(kind, key[1], table[1], _split(key[3])))
                continue
            if item.startswith(("CONSTRAINT ", "FOREIGN KEY", "CHECK")):
                continue
            name, _, rest = item.partition(" ")
            end = _TYPE_END.search(rest)
            types[(table[1], name.strip('"'))] = (rest[: end.start()] if end else rest).strip()
            names[(table[1], name.strip('"'))] = name
    return Baseline(statements, types, tuple(keys), names)
