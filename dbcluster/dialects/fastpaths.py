"""Fast paths: several writes in one statement (or one statement for many rows) where the
database can; each hook answers None here and its caller runs the portable statements.

A provider overrides one where its database has the statement, and declares the capability flag
its callers read (``supports_array_insert``, ``supports_multi_table_update``,
``supports_writable_cte``): ``insert_from_arrays`` and ``update_from_arrays`` (many rows as one
INSERT or UPDATE of array parameters), ``insert_with_children`` / ``insert_child_row`` (a row
and its children in one statement), ``insert_unless_present`` (an INSERT that writes nothing
where the key exists), ``together`` (two INSERTs in one statement). The conformance suite
compares each with the portable path. PostgreSQL's one-statement claim and final write are in
:mod:`dbcluster.dialects.postgresql_ctes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Insert, Select, Table, Update
from sqlalchemy.sql.elements import ColumnElement

from dbcluster import schema
from dbcluster.dialects.family import StatementFamily


def array_parameters(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> dict[str, list[Any]]:
    """Rows as the parameters of an :meth:`QueryProvider.insert_from_arrays` statement: one list
    per column, named ``a_<column>`` (a column a row leaves out is None there)."""
    return {f"a_{name}": [row.get(name) for row in rows] for name in columns}


class FastPathStatements(StatementFamily):
    """The fast paths' hooks."""

    # --- a step's writes ------------------------------------------------------------------------

    def update_step_and_context(
        self, step_update: Update, context_update: Update, context_values: Mapping[str, Any]
    ) -> Update | None:
        """One statement doing both of a step's per-chunk writes, where the database can: it
        changes both rows or neither, so a row count of 0 says it was refused. ``step_update``
        is the guarded UPDATE of the step execution row; ``context_update`` the UPDATE of its
        context row (the two share their bind parameters: ``b_id`` names the step execution in
        both) and ``context_values`` its SET clause. With :attr:`supports_multi_table_update`
        one UPDATE joins both rows (2 rows matched with ``CLIENT_FOUND_ROWS``, which
        SQLAlchemy's MySQL drivers set; 1 or 2 changed without it, as the context may be
        unchanged); with :attr:`supports_writable_cte` (PostgreSQL: see
        :mod:`dbcluster.dialects.postgresql_ctes`) the context update runs in a ``WITH`` and
        the step's row is updated only if it did (1 row). None: two statements."""
        if self.supports_multi_table_update:
            se, sc = schema.step_execution, schema.step_execution_context
            return step_update.where(sc.c.step_execution_id == se.c.step_execution_id).values(
                {sc.c[name]: value for name, value in context_values.items()}
            )
        return None

    def fold_guard(
        self,
        guard: Update,
        step_update: Update,
        context_update: Update | None = None,
        *,
        claim_next: bool = False,
    ) -> Select[Any] | None:
        """Where :attr:`supports_writable_cte` (PostgreSQL: see
        :mod:`dbcluster.dialects.postgresql_ctes`): a step's final write and the guarded UPDATE
        of its owner row (``guard``, e.g. a partition's finish) as one statement, in the lock
        order of the transaction it replaces: the guard's row first; then the context row (when
        ``context_update`` is given) and the step execution row, each written only if the one
        before changed. It answers one row: ``guarded`` (rows the guard changed: 1 or 0) and
        ``written`` (step execution rows written: 1, or 0 when the guard refused or the version
        was stale). The three share their bind parameters (``b_id`` names the step execution).
        With ``claim_next``, the same statement then claims one more partition for the node
        (parameters ``n_id``, ``n_node``, ``n_started_at``), and the row carries what it won
        (``p_id`` NULL when nothing was won). None: the guard and the write are statements of
        their own."""
        return None

    def refusal(self, guarded: Any, written: Any) -> ColumnElement[Any] | None:
        """An expression over a folded final write's two counts (see :meth:`fold_guard`) that
        raises an error, failing the statement and so its transaction, unless both are 1 (the
        guard changed its row and the step execution was written); :meth:`refusal_of` reads
        the counts back from that error. With it, the statement can be sent with its
        ``COMMIT`` in one round trip (``Prebuilt.one_committing``): a refused guard then fails
        the statement, and the ``COMMIT`` behind it is not run. None: the database has no such
        expression (the caller reads the counts and rolls back)."""
        return None

    def refusal_of(self, error: BaseException) -> tuple[int, int] | None:
        """The ``(guarded, written)`` counts of a folded final write whose :meth:`refusal`
        raised ``error``; None for any other error."""
        return None

    def _refused_column(self, counts: Any) -> Any | None:
        """:meth:`refusal` over the counts subquery ``counts``, labelled ``dbc_r`` (NULL when
        it does not raise); None where the database has none."""
        refused = self.refusal(counts.c.guarded, counts.c.written)
        return None if refused is None else refused.label("dbc_r")

    # --- inserts --------------------------------------------------------------------------------

    def update_from_arrays(
        self,
        table: Table,
        match: Sequence[str],
        columns: Sequence[str],
        values: Mapping[str, Any] | None = None,
    ) -> Update | None:
        """Where :attr:`supports_array_insert`: an UPDATE of many rows, each found by its
        ``match`` columns and given its ``columns``, every one of those one array parameter
        named ``a_<column>`` (the rows pass as a list per column, as for
        :meth:`insert_from_arrays`), plus ``values``, SET expressions the same for every row
        (which may refer to the row's own columns: ``version + 1``). Its row count is the rows
        it changed. One statement for any number of rows; None: the caller runs an
        executemany."""
        return None

    def insert_from_arrays(
        self,
        table: Table,
        columns: Sequence[str],
        values: Mapping[str, Any] | None = None,
    ) -> Insert | None:
        """Where :attr:`supports_array_insert`: an INSERT of many rows whose every column in
        ``columns`` is one array parameter named ``a_<column>`` (the rows pass as a list per
        column), plus ``values``, expressions the same for every row. One short statement for
        any number of rows: no text of thousands of placeholders for the driver to parse on
        each execution, as an executemany folded into multi-row VALUES has. None: the caller
        runs an executemany."""
        return None

    def insert_with_children(
        self,
        parent: Insert,
        parent_key: Any,
        children: Sequence[tuple[Table, Sequence[str], Sequence[str]]],
    ) -> Select[Any] | None:
        """Where :attr:`supports_writable_cte` (and, for array columns,
        :attr:`supports_array_insert`): one statement that inserts ``parent`` (one row) and,
        for each ``(child, columns, arrays)``, the rows of ``child`` that belong to it. Their
        first column of ``columns`` takes the parent's new ``parent_key``, the others the bound
        parameters of their names (the same in every row); each column of ``arrays`` takes one
        element of the array parameter ``a_<column>``, a row per element (no row for empty
        arrays; without arrays, one row). It returns that key. A job execution, its context and
        its parameters in one round trip. None: the caller runs the INSERTs."""
        return None

    def insert_child_row(
        self, parent: Insert, parent_key: Any, child: Table, child_columns: Sequence[str]
    ) -> Select[Any] | None:
        """Where :attr:`supports_writable_cte`: one statement that inserts ``parent`` (one row)
        and the row of ``child`` that belongs to it, whose first column of ``child_columns``
        takes the parent's new ``parent_key`` and the others the bound parameters of their
        names; it returns that key. A step execution and its context in one round trip. None:
        the caller runs the two INSERTs."""
        return self.insert_with_children(parent, parent_key, [(child, child_columns, ())])

    def insert_unless_present(self, table: Table, key: Sequence[str]) -> Insert | None:
        """An INSERT into ``table`` (values to be given) that inserts nothing, without an error
        and without ending the transaction, where a row with the same ``key`` columns (a unique
        key) exists or is being committed (it waits for that one's outcome, as a plain INSERT's
        unique check does), usable as a CTE. A first launch then creates its instance without
        reading first whether it exists. None: the database has no such statement (the caller
        reads first)."""
        return None

    def together(self, write: Insert, then: Any) -> Any | None:
        """One statement that runs the INSERT ``write`` and the statement ``then`` (another
        INSERT, or a :meth:`notify`), taking the parameters of both, or None where the database
        cannot (then they are two). Neither may need to see the other's rows: a launch's
        coordination row and its master history row, a placement's partitions and its wake-ups
        (sent at COMMIT) go in one round trip."""
        return None
