"""No password reaches a message, a log line or a page: one masking function
(``dbcluster.masking``), used by the URL shown in every error and by every log handler the
commands install."""

from __future__ import annotations

import io
import logging
import random
from pathlib import Path

import pytest
from cli_helpers import run_cli

from dbcluster.dialects import safe_url
from dbcluster.dialects.registry import parse_url
from dbcluster.errors import ConfigurationError
from dbcluster.logs import configure
from dbcluster.masking import mask_secrets

SECRET = "s3cret"

URLS = [
    # user:pass@host, with and without a driver, IPv6, an '@' left unencoded in the password
    ("postgresql+psycopg://etl:s3cret@db.example:5432/sales", "etl:***@db.example:5432/sales"),
    ("postgresql://etl:s3cret@[::1]:5432/sales", "etl:***@[::1]:5432/sales"),
    ("postgresql://etl:s3cret@x@db.example/sales", "etl:***@db.example/sales"),
    # percent-encoded passwords (SQLAlchemy decodes them: both forms must go)
    ("mysql+pymysql://etl:s3cret%40%3Aword@db/sales", "etl:***@db/sales"),
    # no scheme at all: not a URL SQLAlchemy reads, masked all the same
    ("postgres:s3cret@dbhost/db", "postgres:***@dbhost/db"),
    ("etl:s3cret@dbhost", "etl:***@dbhost"),
    # passwords in the query string
    ("postgresql+psycopg://etl@db/sales?password=s3cret&sslmode=require", "sslmode=require"),
    ("mysql+pymysql://etl@db/sales?passwd=s3cret", "passwd=***"),
    (
        "mssql+pyodbc:///?odbc_connect=DRIVER%3D%7BODBC+Driver+18%7D%3BSERVER%3Ddb%3BUID%3Detl"
        "%3BPWD%3Ds3cret%3B",
        "SERVER=db;UID=etl;PWD=***;",
    ),
    (
        "mssql+pyodbc:///?odbc_connect=DRIVER={ODBC Driver 18};SERVER=db;PWD={s3;cret};UID=etl",
        "PWD={***};UID=etl",
    ),
    ("oracle+oracledb://etl:s3cret@db/?service_name=FREEPDB1", "service_name=FREEPDB1"),
]


@pytest.mark.parametrize(("url", "shown"), URLS)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    safe = safe_url(url)
    assert SECRET not in safe and "s3;cret" not in safe and "%40%3Aword" not in safe, safe
    assert shown in safe, safe


def test_a_url_without_a_password_is_shown_whole() -> None:
    for url in (
        "postgresql+psycopg://postgres@127.0.0.1:5432/test",
        "sqlite:////var/lib/jobs.db",
        "mariadb+pymysql://root@127.0.0.1:3306/test?charset=utf8mb4",
    ):
        assert safe_url(url) == url


@pytest.mark.parametrize(
    "text",
    [
        "connection failed: host=db user=etl password=s3cret dbname=sales",
        "connection failed: host=db password='s3 cret' dbname=sales",
        "[Microsoft][ODBC Driver 18] login failed: DSN=x;UID=etl;PWD=s3cret;",
        "connect(**{'user': 'etl', 'password': 's3cret'})",
        '{"db_password": "s3cret"}',
        "url was postgres:s3cret@dbhost/db",
        "odbc_connect=DRIVER%3D%7Bx%7D%3BPWD%3Ds3cret%3BUID%3Detl",
        "token=s3cret api_key: s3cret",
    ],
)
def test_free_text_is_masked(text: str) -> None:
    masked = mask_secrets(text)
    assert SECRET not in masked and "s3 cret" not in masked, masked
    assert "***" in masked


def test_text_without_a_password_is_left_alone() -> None:
    for text in (
        "partition p3 of job 12 moved from node-a to node-b at 2026-11-30T02:00:00Z",
        "bypass=1 tokens: 5 ratio 1:2",
        "sqlite:///tmp/x.db",
    ):
        assert mask_secrets(text) == text


def test_skipping_a_pattern_that_cannot_match_changes_nothing() -> None:
    """mask_secrets runs each pattern only where it could match (a log line costs ~70 µs
    through both); on any text it gives what both patterns, run unconditionally, give."""
    from dbcluster import masking

    def unconditional(text: str) -> str:
        text = masking._USERINFO.sub(lambda m: f"{m.group('lead')}:{masking.MASK}@", text)
        return masking._KEY_VALUE.sub(masking._mask_value, text)

    pieces = [
        "node",
        " ",
        ":",
        "@",
        "=",
        "%3D",
        "%3B",
        ";",
        "'",
        '"',
        "{",
        "}",
        "/",
        "://",
        "x",
        "etl",
        "s3cret",
        "password",
        "PassWord",
        "PWD",
        "pass",
        "bypass",
        "token",
        "Api_Key",
        "apikey",
        "secret",
        "passphrase",
        "passwd",
        "paſſword",
        "K",
        "pwd",
        "(",
        ")",
        ",",
        "partition p3 (12, attempt 1)",
        "postgresql://",
        "host",
        "é",
    ]
    rng = random.Random(35)
    texts = [
        "node bench0-7f3a claimed 8 partitions: p1 (1001, attempt 1), p2 (1002, attempt 1)",
        "node bench0-7f3a completed 2 partitions in one transaction: p1 (1), p2 (2)",
        "paſſword=s3cret",
    ]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(20000)]
    for text in texts:
        assert mask_secrets(text) == unconditional(text), text


def test_a_url_that_does_not_parse_is_refused_without_its_password() -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_url("postgres:s3cret@dbhost/db")
    assert SECRET not in str(refused.value) and "postgres:***@dbhost/db" in str(refused.value)


def test_every_log_line_is_masked_text_and_json() -> None:
    for log_format in ("text", "json"):
        out = io.StringIO()
        handler = configure("info", log_format, stream=out)
        try:
            log = logging.getLogger("dbcluster.test")
            log.warning("cannot connect to %s", "postgresql://etl:s3cret@db/sales")
            try:
                raise RuntimeError("password=s3cret")
            except RuntimeError:
                log.exception("failed with %r", {"password": SECRET})
        finally:
            logging.getLogger().removeHandler(handler)
        text = out.getvalue()
        assert SECRET not in text and text.count("***") >= 3, text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgres:s3cret@dbhost/db", "postgres:***@dbhost/db"),
        ("postgresql+psycopg://etl@127.0.0.1:9/nowhere?password=s3cret", "password=***"),
        ("postgresql+psycopg://etl:s3cret%2F1@127.0.0.1:9/nowhere", "etl:***@127.0.0.1:9"),
    ],
)
def test_the_commands_never_print_the_password(url: str, shown: str) -> None:
    for command in (
        ["status"],
        ["submit", "--app", "dbcluster.demo:registry", "reconcile-receipts"],
        ["prune"],
    ):
        args = [*command, "--url", url] + (["--older-than", "30d"] if command == ["prune"] else [])
        proc = run_cli(*args, "--connect-timeout", "0", timeout=60)
        output = proc.stdout + proc.stderr
        assert proc.returncode in (2, 3), (command, proc.returncode, output)
        assert SECRET not in output and "%2F1" not in output, output
        assert "Traceback" not in output and len(proc.stderr.strip().splitlines()) == 1, output
        if command == ["status"]:
            assert shown in output, output


def test_job_views_show_no_password(tmp_path: Path) -> None:
    from sqlalchemy import update

    from dbcluster.batch.parameters import as_job_parameters
    from dbcluster.batch.repository import JobRepository
    from dbcluster.batch.status import BatchStatus
    from dbcluster.dialects import make_engine
    from dbcluster.schema import job_execution

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert run_cli("init", "--url", url).returncode == 0
    engine = make_engine(url)
    try:
        repository = JobRepository(engine)
        params = as_job_parameters({"source": "postgresql://etl:s3cret@db/sales"})
        execution = repository.create_job_execution(
            repository.create_job_instance("export", params), params
        )
        execution.status = BatchStatus.FAILED
        repository.update_job_execution(execution)
        with engine.begin() as conn:
            conn.execute(
                update(job_execution)
                .where(job_execution.c.job_execution_id == execution.id)
                .values(exit_message="cannot connect: host=db password=s3cret")
            )
    finally:
        engine.dispose()
    for args in (
        ["job", str(execution.id)],
        ["job", str(execution.id), "--json"],
        ["jobs", "--json"],
    ):
        proc = run_cli(*args, "--url", url)
        assert proc.returncode == 0, proc.stderr
        assert SECRET not in proc.stdout, proc.stdout
        if args[0] == "job":  # it shows the parameters and the exit message
            assert "etl:***@db/sales" in proc.stdout and "password=***" in proc.stdout
