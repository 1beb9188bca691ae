"""The Oracle 0.1.0 -> 0.2.0 migration runs again cleanly after being cut at any of its steps.

Oracle commits each DDL statement on its own, so a migration cut short (a lost connection, a
killed process, a DBA's script stopped half way) leaves a schema between two steps. The script
that ``dbcluster migrate --sql`` prints for Oracle 23ai (0.1.0's flags were native BOOLEANs
there) is what ``dbcluster migrate`` runs; here it runs on a model of Oracle's data dictionary
that refuses what Oracle refuses (a column added twice, ORA-01430; a name used twice, ORA-00955;
a column dropped or renamed that is not there, ORA-00904; NOT NULL twice, ORA-01442), cut after
each of its statements and then run again from the start. No Oracle server runs here: the model
stands in for one, and every step is checked to be guarded by what the dictionary says.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import pytest

from dbcluster import migrations
from dbcluster.dialects import provider_for_name
from dbcluster.migrations.baseline import baseline

_BLOCK = re.compile(
    r"^BEGIN\s+FOR pending IN \(SELECT 1 FROM dual WHERE (?P<condition>.*)\) LOOP\s+"
    r"EXECUTE IMMEDIATE '(?P<statement>.*)';\s+END LOOP;\s+END;\s*/$",
    re.S,
)
_EXISTS = re.compile(
    r"EXISTS \(SELECT 1 FROM (?P<view>user_tab_columns|user_tables|user_indexes) WHERE "
    r"(?P<where>[^()]*)\)"
)
_EQUALS = re.compile(r"(\w+) = '([^']*)'")


class OracleRefused(Exception):
    """What the server would raise."""


@dataclass
class Dictionary:
    """Oracle's data dictionary, as much as the migration asks of it, with the rows of the
    version table and the statements of the open transaction."""

    #: table -> column -> (type, nullable), names in upper case as unquoted names are stored.
    tables: dict[str, dict[str, tuple[str, bool]]] = field(default_factory=dict)
    indexes: set[str] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)
    pending: list[str] = field(default_factory=list)

    # --- the conditions the guards ask ------------------------------------------------------

    def holds(self, condition: str) -> bool:
        def answer(found: re.Match[str]) -> str:
            where = dict(_EQUALS.findall(found.group("where")))
            if found.group("view") == "user_tables":
                return str(where["table_name"] in self.tables)
            if found.group("view") == "user_indexes":
                return str(where["index_name"] in self.indexes)
            column = self.tables.get(where["table_name"], {}).get(where["column_name"])
            if column is None:
                return "False"
            if "data_type" in where and column[0].split("(")[0] != where["data_type"]:
                return "False"
            if "nullable" in where and column[1] != (where["nullable"] == "Y"):
                return "False"
            return "True"

        python = _EXISTS.sub(answer, condition).replace("AND", "and").replace("NOT", "not")
        assert re.fullmatch(r"[\sa-zA-Z]*", python), f"a condition the model cannot read: {python}"
        return bool(eval(python))  # noqa: S307 - True/False/and/not only (checked above)

    # --- the statements ---------------------------------------------------------------------

    def run(self, statement: str) -> None:
        if statement == "COMMIT":
            self.commit()
        elif statement.startswith(("INSERT", "UPDATE")):
            self.dml(statement)
        else:
            self.commit()  # DDL commits what the transaction did before it
            self.ddl(statement)

    def commit(self) -> None:
        for statement in self.pending:
            version = re.search(r"INSERT INTO batch_schema_version .* VALUES \('(\d+)'", statement)
            if version:
                if version.group(1) in self.versions:
                    raise OracleRefused("ORA-00001: unique constraint violated")
                self.versions.add(version.group(1))
        self.pending.clear()

    def cut(self) -> None:
        """The session is lost: what it did not commit is rolled back."""
        self.pending.clear()

    def _column(self, table: str, column: str) -> tuple[str, bool]:
        found = self.tables.get(table.upper(), {}).get(column.upper())
        if found is None:
            raise OracleRefused(f'ORA-00904: "{column.upper()}": invalid identifier')
        return found

    def dml(self, statement: str) -> None:
        if found := re.match(r"UPDATE (\w+) SET (\w+) = CASE WHEN (\w+) THEN", statement):
            table, target, flag = found.groups()
            self._column(table, target)
            if self._column(table, flag)[0] != "BOOLEAN":
                raise OracleRefused("ORA-00920: invalid relational operator")
        elif found := re.match(r"INSERT INTO (\w+)", statement):
            if found.group(1).upper() not in self.tables:
                raise OracleRefused("ORA-00942: table or view does not exist")
        self.pending.append(statement)

    def ddl(self, statement: str) -> None:
        if found := re.match(r"CREATE TABLE (\w+) \((.*)\)$", statement, re.S):
            self.create_table(found.group(1), found.group(2))
        elif found := re.match(r"CREATE INDEX (\w+) ON (\w+) ", statement):
            name = found.group(1).upper()
            if name in self.indexes:
                raise OracleRefused("ORA-00955: name is already used by an existing object")
            self.indexes.add(name)
        elif found := re.match(r"ALTER TABLE (\w+) ADD \((\w+) (.*)\)$", statement):
            table, column, spec = found.groups()
            if column.upper() in self.tables[table.upper()]:
                raise OracleRefused("ORA-01430: column being added already exists in table")
            self.tables[table.upper()][column.upper()] = _column_of(spec)
        elif found := re.match(r"ALTER TABLE (\w+) DROP COLUMN (\w+)$", statement):
            table, column = found.groups()
            self._column(table, column)
            del self.tables[table.upper()][column.upper()]
        elif found := re.match(r"ALTER TABLE (\w+) RENAME COLUMN (\w+) TO (\w+)$", statement):
            table, old, new = found.groups()
            kept = self._column(table, old)
            if new.upper() in self.tables[table.upper()]:
                raise OracleRefused("ORA-00957: duplicate column name")
            del self.tables[table.upper()][old.upper()]
            self.tables[table.upper()][new.upper()] = kept
        elif found := re.match(r"ALTER TABLE (\w+) MODIFY \((\w+) NOT NULL\)$", statement):
            table, column = found.groups()
            kind, nullable = self._column(table, column)
            if not nullable:
                raise OracleRefused("ORA-01442: column to be modified to NOT NULL is already")
            self.tables[table.upper()][column.upper()] = (kind, False)
        elif found := re.match(r"ALTER TABLE (\w+) MODIFY \((\w+) (\S+)\)$", statement):
            table, column, kind = found.groups()
            self.tables[table.upper()][column.upper()] = (kind, self._column(table, column)[1])
        else:
            raise AssertionError(f"a statement the model does not know: {statement}")

    def create_table(self, name: str, body: str) -> None:
        if name.upper() in self.tables:
            raise OracleRefused("ORA-00955: name is already used by an existing object")
        columns = {}
        for line in body.splitlines():
            item = line.strip().rstrip(",").strip()
            if not item or item.startswith(("CONSTRAINT", "PRIMARY KEY", "UNIQUE", "FOREIGN")):
                continue
            column, _, spec = item.partition(" ")
            columns[column.strip('"').upper()] = _column_of(spec)
        self.tables[name.upper()] = columns


def _column_of(spec: str) -> tuple[str, bool]:
    return spec.split()[0], "NOT NULL" not in spec and "IDENTITY" not in spec


def _start(flag_type: str) -> Dictionary:
    """A database 0.1.0 made on Oracle (its flags ``flag_type``: BOOLEAN on 23ai, a number
    before), all committed."""
    model = Dictionary()
    for statement in baseline("oracle").statements:
        model.run(statement.replace(" BOOLEAN ", f" {flag_type} "))
    model.commit()
    return model


def _steps(script: str) -> list[str]:
    """The script's statements, in order: PL/SQL blocks end with "/", the others with ";"."""
    steps = []
    for chunk in script.split("\n\n"):
        chunk = "\n".join(line for line in chunk.splitlines() if not line.startswith("--"))
        if chunk.strip():
            steps.append(chunk.strip())
    return steps


def _run(model: Dictionary, step: str) -> None:
    block = _BLOCK.match(step)
    if block is not None:
        if model.holds(block.group("condition")):
            model.run(block.group("statement").replace("''", "'"))
        return
    assert not step.startswith(("BEGIN", "DECLARE")), f"a block the model cannot read: {step}"
    assert step.endswith(";"), step
    model.run(step[:-1])


@pytest.fixture(scope="module")
def script() -> list[str]:
    return _steps(migrations.upgrade_sql(provider_for_name("oracle", (23,))))


def _finished(script: list[str], flag_type: str) -> Dictionary:
    model = _start(flag_type)
    for step in script:
        _run(model, step)
    model.cut()
    return model


def test_every_ddl_step_of_the_script_checks_the_dictionary_first(script: list[str]) -> None:
    """Every statement but the guarded INSERTs and the COMMIT is a PL/SQL block that runs its
    DDL only while the dictionary says it is still to do."""
    unguarded = [
        step
        for step in script
        if not _BLOCK.match(step)
        and not step.startswith("INSERT INTO batch_schema_version")
        and not (step.startswith("INSERT INTO batch_job_masters") and "NOT (EXISTS" in step)
        and step != "COMMIT;"
    ]
    assert not unguarded, unguarded
    assert script[-1] == "COMMIT;", "SQLcl and SQL Developer do not commit on exit"


@pytest.mark.parametrize("flag_type", ["BOOLEAN", "SMALLINT"], ids=["23ai", "19c"])
def test_the_migration_runs_on_a_database_0_1_0_made(script: list[str], flag_type: str) -> None:
    """On 23ai the flags become numbers; on 19c (where 0.1.0 made them numbers) the five
    steps find nothing to do."""
    model = _finished(script, flag_type)
    assert model.versions == {"0002"}
    for table, column in (("BATCH_PARTITIONS", "TRANSFERABLE"), ("BATCH_JOB_EXECUTION_PARAMS",
                                                                  "IDENTIFYING")):  # fmt: skip
        assert model.tables[table][column] == ("SMALLINT", False), model.tables[table]
        assert f"{column}_NEW" not in model.tables[table]
    assert {"BATCH_JOB_MASTERS", "BATCH_LEASES", "BATCH_SCHEMA_VERSION"} <= set(model.tables)
    assert "MASTER_EPOCH" in model.tables["BATCH_JOB_COORDINATION"]


def test_a_run_cut_after_any_step_completes_when_run_again(script: list[str]) -> None:
    done = _finished(script, "BOOLEAN")
    for cut in range(len(script)):
        model = _start("BOOLEAN")
        for step in script[:cut]:
            _run(model, step)
        model.cut()
        interrupted = copy.deepcopy(model)
        try:
            for step in script:
                _run(model, step)
        except OracleRefused as refused:
            pytest.fail(
                f"cut after step {cut} ({script[cut - 1][:80]!r}): the rerun failed: {refused}"
            )
        model.cut()
        assert (model.tables, model.indexes, model.versions) == (
            done.tables,
            done.indexes,
            done.versions,
        ), f"cut after step {cut}: {interrupted.tables}"


def test_the_model_refuses_what_oracle_refuses() -> None:
    """The test of the test: without its guards (the 0.1.0 -> 0.2.0 script as it was), a run
    cut after its first step fails on the rerun, as Oracle did (ORA-01430)."""
    model = _start("BOOLEAN")
    model.run("ALTER TABLE batch_partitions ADD (transferable_new SMALLINT)")
    with pytest.raises(OracleRefused, match="ORA-01430"):
        model.run("ALTER TABLE batch_partitions ADD (transferable_new SMALLINT)")
    with pytest.raises(OracleRefused, match="ORA-00955"):
        model.run("CREATE INDEX ix_part_node_status ON batch_partitions (assigned_node, status)")
    with pytest.raises(OracleRefused, match="ORA-00920"):
        _start("SMALLINT").run(
            "UPDATE batch_partitions SET transferable = CASE WHEN transferable THEN 1 ELSE 0 END"
        )
