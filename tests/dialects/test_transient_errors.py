"""Each provider's transient-error classifier, fed the exceptions its drivers really raise.

Where the driver is installed here the exception is the driver's own class, built the way the
driver builds it (or raised by the driver itself: a connect to a closed local port). pyodbc needs
unixODBC and MariaDB Connector/Python needs MariaDB Connector/C, neither of which this machine
has: their exceptions are stand-ins with the driver's documented shape, and say so.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from sqlalchemy.exc import DBAPIError

from dbcluster.dialects import provider_for_name


def _closed_port() -> int:
    """A local TCP port nothing listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raised(connect: Callable[[], object]) -> BaseException:
    try:
        connect()
    except Exception as exc:  # noqa: BLE001 - the driver's own connect failure is the sample
        return exc
    raise AssertionError("the connect to a closed port succeeded")


def _transient(provider_name: str, orig: BaseException) -> bool:
    provider = provider_for_name(provider_name)
    return provider.is_transient(DBAPIError("SELECT 1", None, orig))  # type: ignore[arg-type]


# --- Oracle (python-oracledb) ---------------------------------------------------------------------


def _ora(code: int, text: str) -> BaseException:
    """A server error as the thin driver raises it: an _Error with the ORA- number as ``code``
    (the driver itself maps lost-session codes to DPY-4011), wrapped in its exception class."""
    from oracledb import errors

    error = errors._Error(f"ORA-{code:05}: {text}", code=code)
    return error.exc_type(error)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (28, "your session has been killed"),
        (1012, "not logged on"),
        (2396, "exceeded maximum idle time, please connect again"),
        (1033, "ORACLE initialization or shutdown in progress"),
        (1089, "immediate shutdown or close in progress - no operations are permitted"),
        (12516, "TNS:listener could not find available handler with matching protocol stack"),
        (12520, "TNS:listener could not find available handler for requested type of server"),
        (12528, "TNS:listener: all appropriate instances are blocking new connections"),
        (54, "resource busy and acquire with NOWAIT specified or timeout expired"),
        (30006, "resource busy; acquire with WAIT timeout expired"),
        (60, "deadlock detected while waiting for resource"),
    ],
)
def test_oracle_transient_codes(code: int, text: str) -> None:
    assert _transient("oracle", _ora(code, text))


def test_oracle_thin_listener_refusal_and_connect_failure() -> None:
    import oracledb
    from oracledb import errors

    refused = errors._create_exception(errors.ERR_LISTENER_REFUSED_CONNECTION, error_code="12528")
    assert "Similar to ORA-12528" in str(refused)
    assert _transient("oracle", refused)
    port = _closed_port()
    cannot_connect = _raised(
        lambda: oracledb.connect(user="u", password="p", dsn=f"127.0.0.1:{port}/x")
    )
    assert "DPY-6005" in str(cannot_connect)
    assert _transient("oracle", cannot_connect)


def test_oracle_a_round_trip_cut_by_the_call_timeout_is_transient() -> None:
    """DPY-4024 (thin) and DPI-1067 with ORA-03156 (thick, which the driver reports as DPY-4024
    too), built by python-oracledb's own error code."""
    from oracledb import errors

    thin = errors._create_exception(errors.ERR_CALL_TIMEOUT_EXCEEDED, timeout=11000)
    assert str(thin).startswith("DPY-4024: call timeout of 11000 ms exceeded")
    thick_error = errors._Error("DPI-1067: call timeout of 11000 ms exceeded with ORA-3156")
    thick = thick_error.exc_type(thick_error)
    assert thick_error.full_code == "DPY-4024"
    for error in (thin, thick):
        assert _transient("oracle", error)


def test_oracle_permanent_errors_are_not_transient() -> None:
    assert not _transient("oracle", _ora(1, "unique constraint (DBC.PK) violated"))
    assert not _transient("oracle", _ora(12899, 'value too large for column "EXIT_MESSAGE"'))
    assert not _transient("oracle", _ora(1017, "invalid username/password; logon denied"))


# --- SQL Server (pymssql and pyodbc) --------------------------------------------------------------


def _pymssql_execute_error(number: int, text: bytes) -> BaseException:
    """What pymssql's cursor raises: ``raise OperationalError, e.args[0]`` on an
    MSSQLDatabaseException((number, message)), i.e. OperationalError(number, message)."""
    import pymssql

    return pymssql.exceptions.OperationalError(number, text)


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1205, b"Transaction (Process ID 52) was deadlocked on lock resources with another "
         b"process and has been chosen as the deadlock victim. Rerun the transaction."
         b"DB-Lib error message 20018, severity 13:\nGeneral SQL Server error: Check messages "
         b"from the SQL Server\n"),
        (1222, b"Lock request time out period exceeded.DB-Lib error message 20018, severity 16:"
         b"\nGeneral SQL Server error: Check messages from the SQL Server\n"),
        (20047, b"DBPROCESS is dead or not enabled"),
    ],
)  # fmt: skip
def test_pymssql_numbered_errors(number: int, text: bytes) -> None:
    assert _transient("mssql", _pymssql_execute_error(number, text))


def test_pymssql_connect_failure_and_permanent_error() -> None:
    import pymssql

    port = _closed_port()
    refused = _raised(
        lambda: pymssql.connect(server="127.0.0.1", port=port, user="sa", password="x")
    )
    assert isinstance(refused.args[0], tuple) and refused.args[0][0] == 20009, refused.args
    assert _transient("mssql", refused)
    duplicate = pymssql.exceptions.IntegrityError(2627, b"Violation of PRIMARY KEY constraint")
    assert not _transient("mssql", duplicate)


def _pyodbc_error(class_name: str, sqlstate: str, message: str) -> BaseException:
    """A pyodbc error: args = (sqlstate, message with the native number in parentheses). The real
    class when pyodbc loads here, else a stand-in of the same shape (pyodbc needs unixODBC)."""
    try:
        import pyodbc

        cls = getattr(pyodbc, class_name)
    except ImportError:
        cls = type(class_name, (Exception,), {})
    return cls(sqlstate, message)


@pytest.mark.parametrize(
    ("sqlstate", "message", "transient"),
    [
        ("40001", "[40001] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Transaction "
         "(Process ID 53) was deadlocked on lock resources with another process and has been "
         "chosen as the deadlock victim. Rerun the transaction. (1205) (SQLExecDirectW)", True),
        ("HY000", "[HY000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Lock request "
         "time out period exceeded. (1222) (SQLExecDirectW)", True),
        ("08001", "[08001] [Microsoft][ODBC Driver 18 for SQL Server]TCP Provider: Error code "
         "0x2749 (10057) (SQLDriverConnect)", True),
        ("HYT00", "[HYT00] [Microsoft][ODBC Driver 18 for SQL Server]Login timeout expired (0) "
         "(SQLDriverConnect)", True),
        ("23000", "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of "
         "PRIMARY KEY constraint 'PK'. (2627) (SQLExecDirectW)", False),
    ],
)  # fmt: skip
def test_pyodbc_errors(sqlstate: str, message: str, transient: bool) -> None:
    error = _pyodbc_error("OperationalError", sqlstate, message)
    assert _transient("mssql", error) is transient


@pytest.mark.parametrize(
    ("class_name", "sqlstate", "message"),
    [
        # The key value is 20003, one of DB-Library's transient numbers: it is not the error's.
        ("IntegrityError", "23000", "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL "
         "Server]Violation of PRIMARY KEY constraint 'PK__batch_jo__3214EC07'. Cannot insert "
         "duplicate key in object 'dbo.batch_job_execution'. The duplicate key value is "
         "(20003). (2627) (SQLExecDirectW)"),
        ("IntegrityError", "23000", "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL "
         "Server]Cannot insert duplicate key row in object 'dbo.batch_job_instance' with unique "
         "index 'uq_job_inst_name_key'. The duplicate key value is (nightly, 1205). (2601) "
         "(SQLExecDirectW)"),
        ("ProgrammingError", "42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL "
         "Server]The conversion of the varchar value '(40613)' overflowed an int column. (248) "
         "(SQLExecDirectW)"),
    ],
)  # fmt: skip
def test_pyodbc_a_number_in_the_message_is_not_the_errors_number(
    class_name: str, sqlstate: str, message: str
) -> None:
    """Only the native number pyodbc puts before the ODBC function's name counts."""
    assert not _transient("mssql", _pyodbc_error(class_name, sqlstate, message))


def test_pyodbc_each_diagnostic_record_keeps_its_own_number() -> None:
    """pyodbc joins several diagnostic records with "; ": a deadlock reported second counts."""
    message = (
        "[01000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Changed database context "
        "to 'dbc'. (5701) (SQLExecDirectW); [40001] [Microsoft][ODBC Driver 18 for SQL Server]"
        "[SQL Server]Transaction (Process ID 61) was deadlocked on lock resources with another "
        "process and has been chosen as the deadlock victim. Rerun the transaction. (1205)"
    )
    assert _transient("mssql", _pyodbc_error("Error", "01000", message + " (SQLExecute)"))


# --- MySQL and MariaDB (PyMySQL, MariaDB Connector/Python) ----------------------------------------


@pytest.mark.parametrize("provider", ["mysql", "mariadb"])
@pytest.mark.parametrize(
    ("errno", "text"),
    [
        (3101, "Plugin instructed the server to rollback the current transaction."),
        (1927, "Connection was killed"),
        (1213, "Deadlock found when trying to get lock; try restarting transaction"),
        (1205, "Lock wait timeout exceeded; try restarting transaction"),
        (
            3572,
            "Statement aborted because lock(s) could not be acquired immediately and NOWAIT "
            "is set.",
        ),
    ],
)
def test_pymysql_numbered_errors(provider: str, errno: int, text: str) -> None:
    import pymysql

    assert _transient(provider, pymysql.err.OperationalError(errno, text))


def test_pymysql_connect_failure_and_permanent_error() -> None:
    import pymysql

    port = _closed_port()
    refused = _raised(lambda: pymysql.connect(host="127.0.0.1", port=port, user="u"))
    assert refused.args[0] == 2003
    assert _transient("mysql", refused)
    assert not _transient("mysql", pymysql.err.IntegrityError(1062, "Duplicate entry 'x'"))


class MariaDBConnectorError(Exception):
    """MariaDB Connector/Python's error shape: the message in ``args``, the server's number in
    ``errno`` and its state in ``sqlstate``. A stand-in: the package builds against MariaDB
    Connector/C, which this machine does not have."""

    def __init__(self, msg: str, errno: int, sqlstate: str) -> None:
        super().__init__(msg)
        self.errno = errno
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("errno", "sqlstate", "transient"),
    [(1213, "40001", True), (1927, "70100", True), (3101, "HY000", True), (2013, "HY000", True),
     (1062, "23000", False)],
)  # fmt: skip
def test_mariadb_connector_errno_shape(errno: int, sqlstate: str, transient: bool) -> None:
    error = MariaDBConnectorError(f"error {errno}", errno, sqlstate)
    assert _transient("mariadb", error) is transient


# --- Db2 (ibm_db) ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("[IBM][CLI Driver][DB2/LINUXX8664] SQL1229N  The current transaction has been rolled "
         "back because of a system error.  SQLSTATE=40504 SQLCODE=-1229", True),
        ('[IBM][CLI Driver][DB2/LINUXX8664] SQL0911N  The current transaction has been rolled '
         'back because of a deadlock or timeout.  Reason code "68".  SQLSTATE=40001 '
         'SQLCODE=-911', True),
        ('[IBM][CLI Driver] SQL30081N  A communication error has been detected. Communication '
         'protocol being used: "TCP/IP".  Communication API being used: "SOCKETS".  Location '
         'where the error was detected: "127.0.0.1".  Communication function detecting the '
         'error: "connect".  Protocol specific error code(s): "111", "*", "*".  SQLSTATE=08001 '
         'SQLCODE=-30081', True),
        ("[IBM][CLI Driver][DB2/LINUXX8664] SQL0803N  One or more values in the INSERT statement "
         "... are not valid because the primary key ... SQLSTATE=23505 SQLCODE=-803", False),
    ],
)  # fmt: skip
def test_ibm_db_errors(message: str, transient: bool) -> None:
    """ibm_db_dbi's own exception classes, with the message text the CLI driver produces."""
    import ibm_db_dbi

    assert _transient("db2", ibm_db_dbi.OperationalError(message)) is transient


# --- PostgreSQL (psycopg) -------------------------------------------------------------------------


def test_psycopg_connect_failure_without_sqlstate() -> None:
    import psycopg

    port = _closed_port()
    refused = _raised(lambda: psycopg.connect(f"host=127.0.0.1 port={port} user=u"))
    assert getattr(refused, "sqlstate", None) is None
    assert _transient("postgresql", refused)
    denied = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
        'password authentication failed for user "batch"'
    )
    assert not _transient("postgresql", denied)
    assert _transient("postgresql", psycopg.errors.DeadlockDetected("deadlock detected"))
    assert not _transient("postgresql", psycopg.errors.UniqueViolation("duplicate key"))


# --- read-only servers ----------------------------------------------------------------------------


def _read_only(provider_name: str, orig: BaseException) -> bool:
    provider = provider_for_name(provider_name)
    return provider.is_read_only(DBAPIError("UPDATE t SET x = 1", None, orig))  # type: ignore[arg-type]


def test_a_write_refused_by_a_read_only_server_is_told_apart() -> None:
    """What a demoted primary answers a write (a worker does not withdraw over it); the other
    errors of a write are not that."""
    import sqlite3

    import psycopg
    import pymysql

    assert _read_only(
        "postgresql",
        psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
    )
    assert not _read_only("postgresql", psycopg.errors.UndefinedColumn("column x does not exist"))
    for name in ("mysql", "mariadb"):
        assert _read_only(
            name,
            pymysql.err.OperationalError(
                1290,
                "The MariaDB server is running with the --read-only option so it cannot execute "
                "this statement",
            ),
        )
        assert _read_only(
            name,
            pymysql.err.InternalError(1792, "Cannot execute statement in a READ ONLY transaction."),
        )
        assert not _read_only(name, pymysql.err.OperationalError(1054, "Unknown column 'x'"))
    assert _read_only("sqlite", sqlite3.OperationalError("attempt to write a readonly database"))
    assert not _read_only("sqlite", sqlite3.OperationalError("no such column: x"))
    for name in ("oracle", "mssql", "db2"):
        assert not _read_only(name, RuntimeError("not classified for this database"))


def test_oracle_a_standby_open_read_only_is_told_apart() -> None:
    """ORA-16000, what the old primary answers a write once a Data Guard switchover made it a
    standby, through the thin driver (its code) and as text (a wrapped message)."""
    from oracledb import errors

    assert _read_only(
        "oracle", _ora(16000, "database or pluggable database open for read-only access")
    )
    wrapped = errors._Error("ORA-16000: database or pluggable database open for read-only access")
    assert _read_only("oracle", wrapped.exc_type(wrapped))
    assert not _read_only("oracle", _ora(1, "unique constraint (DBC.PK) violated"))
    assert not _read_only("oracle", _ora(60, "deadlock detected while waiting for resource"))


def test_sql_server_a_read_only_database_is_told_apart() -> None:
    """3906: an availability group's secondary (or a database set READ_ONLY) refuses a write,
    through pyodbc and pymssql; a number in the message is not the error's."""
    import pymssql

    text = 'Failed to update database "dbc" because the database is read-only.'
    pyodbc_error = _pyodbc_error(
        "ProgrammingError",
        "25000",
        f"[25000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]{text} (3906) "
        "(SQLExecDirectW)",
    )
    assert _read_only("mssql", pyodbc_error)
    assert _read_only(
        "mssql",
        pymssql.exceptions.OperationalError(
            3906,
            text.encode() + b"DB-Lib error message 20018, severity 16:\nGeneral SQL Server "
            b"error: Check messages from the SQL Server\n",
        ),
    )
    duplicate = _pyodbc_error(
        "IntegrityError",
        "23000",
        "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of PRIMARY "
        "KEY constraint 'PK'. The duplicate key value is (3906). (2627) (SQLExecDirectW)",
    )
    assert not _read_only("mssql", duplicate)


def test_db2_an_hadr_standby_is_told_apart() -> None:
    """SQL1773N: a read-enabled HADR standby refuses a write (reason 5) and any isolation above
    UR (reason 1), as the old primary does once a takeover made it the standby (IBM, "Reads on
    standby restrictions"); through ibm_db's own exception classes."""
    import ibm_db_dbi

    for reason in (5, 1):
        message = (
            "[IBM][CLI Driver][DB2/LINUXX8664] SQL1773N  The statement or command requires "
            "functionality that is not supported on a read-enabled HADR standby database. "
            f'Reason code = "{reason}".  SQLSTATE=08004 SQLCODE=-1773'
        )
        assert _read_only("db2", ibm_db_dbi.ProgrammingError(message))
    assert _read_only("db2", ibm_db_dbi.Error("SQL1773N  ... read-enabled HADR standby"))
    assert not _read_only(
        "db2",
        ibm_db_dbi.IntegrityError(
            "[IBM][CLI Driver][DB2/LINUXX8664] SQL0803N  One or more values in the INSERT "
            "statement ... SQLSTATE=23505 SQLCODE=-803"
        ),
    )
