"""Which rows of the test application's tables belong to one run.

Job and step execution ids do not name one run in a database that has seen others: the
conformance suite drops and re-creates the dbcluster tables (so the ids start again at 1) while
the test tables may keep an earlier run's rows under the same ids. A run therefore takes a mark
before it starts any node, the highest id in each test table, and judges only the rows above
it: an identity or auto-increment id never goes below the highest one a table holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine, Table, func, select, true
from sqlalchemy.sql.elements import ColumnElement

from dbcluster.testing.app import ledger_metadata


@dataclass(frozen=True)
class RowMark:
    """The highest id of each test table before a run (table name -> id)."""

    ids: Mapping[str, int] = field(default_factory=dict)

    def after(self, table: Table) -> ColumnElement[bool]:
        """The rows of ``table`` written after the mark was taken."""
        if table.name not in self.ids:
            return true()
        return table.c.id > self.ids[table.name]


#: No mark: every row counts.
EVERY_ROW = RowMark()


def mark_rows(engine: Engine) -> RowMark:
    """Take the mark (the test tables must exist)."""
    tables = [t for t in ledger_metadata.sorted_tables if "id" in t.c]
    with engine.connect() as conn:
        return RowMark(
            {t.name: conn.execute(select(func.max(t.c.id))).scalar() or 0 for t in tables}
        )
