#!/usr/bin/env bash
# The backend matrix on a machine with Docker, exactly as .github/workflows/backends.yml runs it
# (one job per backend calls this script). For each backend named (default: all) it starts the
# database in a container, waits until the container reports healthy, and runs:
#   1. the whole test suite against it (python -m pytest, only that backend's URL set),
#   2. the shipped conformance suite (pytest --pyargs dbcluster.testing.suite --dbcluster-url),
#   3. a short seeded `dbcluster chaos` run.
#
#   ci/matrix.sh                  # every backend
#   ci/matrix.sh oracle mssql     # Oracle 21 XE and 23 Free, then SQL Server 2022
#   ci/matrix.sh --list           # the backend names
#
# Backends: sqlite postgresql mariadb mysql oracle21 oracle23 mssql db2 ("oracle" = both Oracles).
# DBCLUSTER_MATRIX_KEEP=1 leaves the containers running; DBCLUSTER_MATRIX_VENV picks the virtual
# environment (default: .venv-matrix). tox -e NAME stays the way to run one backend's tests
# against a server you started yourself.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(sqlite postgresql mariadb mysql oracle21 oracle23 mssql db2)
VENV=${DBCLUSTER_MATRIX_VENV:-.venv-matrix}
KEEP=${DBCLUSTER_MATRIX_KEEP:-0}
# Throwaway credentials for throwaway containers bound to 127.0.0.1 only.
PASSWORD=Dbcluster-Matrix-1

log() { printf 'matrix: %s\n' "$*" >&2; }

# wait_until NAME TIMEOUT_S WHAT COMMAND...: run COMMAND every 5 s until it succeeds; after
# TIMEOUT_S, or once the container is gone, print its log's tail and fail.
wait_until() {
    local name=$1 timeout=$2 what=$3 waited=0
    shift 3
    log "$name: waiting up to ${timeout}s for $what"
    until "$@"; do
        if [ "$waited" -ge "$timeout" ] || ! docker inspect "dbc-$name" >/dev/null 2>&1; then
            docker logs --tail 50 "dbc-$name" >&2 || true
            log "$name: no $what after ${waited}s"
            return 1
        fi
        sleep 5
        waited=$((waited + 5))
    done
    log "$name: $what after ${waited}s"
}

healthy() { # healthy NAME: the container reports healthy
    [ "$(docker inspect --format '{{.State.Health.Status}}' "dbc-$1" 2>/dev/null)" = healthy ]
}

logged() { # logged NAME TEXT: a line of the container's log contains TEXT
    # grep reads the whole log (not -q): under pipefail, docker logs killed by SIGPIPE once
    # grep -q stopped reading would fail the pipeline even when the line is there.
    docker logs "dbc-$1" 2>&1 | grep -F "$2" >/dev/null
}

# start NAME TIMEOUT_S HEALTH_CMD DOCKER_RUN_ARGS...: start a container, wait until healthy.
start() {
    local name=$1 timeout=$2 health=$3
    shift 3
    docker rm -f "dbc-$name" >/dev/null 2>&1 || true
    docker run -d --name "dbc-$name" --health-cmd "$health" --health-interval 5s \
        --health-retries 1000 "$@" >/dev/null
    wait_until "$name" "$timeout" "a healthy container" healthy "$name"
}

stop() {
    [ "$KEEP" = 1 ] || docker rm -f "dbc-$1" >/dev/null 2>&1 || true
}

# Each up_NAME starts the database and sets URL (the server), ENV (the test variable that names
# it) and EXTRA (the pip extra of its driver).
up_sqlite() {
    SCRATCH=$(mktemp -d)
    URL="sqlite:///$SCRATCH/matrix.db" ENV=DBCLUSTER_TEST_SQLITE_URL EXTRA=test
}
up_postgresql() {
    start postgresql 180 "pg_isready -U postgres -d test" -p 127.0.0.1:15432:5432 \
        -e POSTGRES_HOST_AUTH_METHOD=trust -e POSTGRES_DB=test postgres:16-alpine
    URL="postgresql+psycopg://postgres@127.0.0.1:15432/test"
    ENV=DBCLUSTER_TEST_POSTGRESQL_URL EXTRA=postgresql
}
up_mariadb() {
    start mariadb 180 "healthcheck.sh --connect --innodb_initialized" -p 127.0.0.1:13306:3306 \
        -e MARIADB_ROOT_PASSWORD="$PASSWORD" -e MARIADB_DATABASE=test mariadb:11.4
    URL="mariadb+pymysql://root:$PASSWORD@127.0.0.1:13306/test"
    ENV=DBCLUSTER_TEST_MARIADB_URL EXTRA=mariadb
}
up_mysql() {
    # MySQL 8.4 authenticates with caching_sha2_password: PyMySQL needs cryptography (the extra).
    start mysql 240 "mysqladmin ping -h 127.0.0.1 -uroot -p$PASSWORD --silent" \
        -p 127.0.0.1:13307:3306 -e MYSQL_ROOT_PASSWORD="$PASSWORD" -e MYSQL_DATABASE=test \
        mysql:8.4
    URL="mysql+pymysql://root:$PASSWORD@127.0.0.1:13307/test"
    ENV=DBCLUSTER_TEST_MYSQL_URL EXTRA=mysql
}
up_oracle21() {
    start oracle21 900 healthcheck.sh -p 127.0.0.1:11521:1521 -e ORACLE_PASSWORD="$PASSWORD" \
        -e APP_USER=dbc -e APP_USER_PASSWORD="$PASSWORD" gvenzl/oracle-xe:21-slim
    URL="oracle+oracledb://dbc:$PASSWORD@127.0.0.1:11521/?service_name=XEPDB1"
    ENV=DBCLUSTER_TEST_ORACLE_URL EXTRA=oracle
}
up_oracle23() {
    start oracle23 900 healthcheck.sh -p 127.0.0.1:11522:1521 -e ORACLE_PASSWORD="$PASSWORD" \
        -e APP_USER=dbc -e APP_USER_PASSWORD="$PASSWORD" gvenzl/oracle-free:23-slim
    URL="oracle+oracledb://dbc:$PASSWORD@127.0.0.1:11522/?service_name=FREEPDB1"
    ENV=DBCLUSTER_TEST_ORACLE_URL EXTRA=oracle
}
up_mssql() {
    if ! odbcinst -q -d -n "ODBC Driver 18 for SQL Server" >/dev/null 2>&1; then
        log "mssql: unixODBC and Microsoft's ODBC Driver 18 (package msodbcsql18) are needed:" \
            "see .github/workflows/backends.yml for how to install them on Ubuntu"
        return 1
    fi
    start mssql 300 "/opt/mssql-tools18/bin/sqlcmd -C -S localhost -U sa -P $PASSWORD -Q 'SELECT 1'" \
        -p 127.0.0.1:11433:1433 -e ACCEPT_EULA=Y -e MSSQL_SA_PASSWORD="$PASSWORD" \
        mcr.microsoft.com/mssql/server:2022-latest
    # The container's certificate is self-signed: ODBC Driver 18 refuses it without this.
    URL="mssql+pyodbc://sa:$PASSWORD@127.0.0.1:11433/master?driver=ODBC+Driver+18+for+SQL+Server&TrustServerCertificate=yes"
    ENV=DBCLUSTER_TEST_MSSQL_URL EXTRA=mssql
}
up_db2() {
    start db2 1200 "su - db2inst1 -c 'db2 connect to testdb' >/dev/null" --privileged \
        -p 127.0.0.1:50000:50000 -e LICENSE=accept -e DB2INSTANCE=db2inst1 \
        -e DB2INST1_PASSWORD="$PASSWORD" -e DBNAME=testdb -e ARCHIVE_LOGS=false \
        -e AUTOCONFIG=false icr.io/db2_community/db2:11.5.9.0
    # The database answers a connect while the image's setup still runs (it restarts the
    # instance after): wait for the setup's own last line too (a health check is not enough).
    wait_until db2 1200 "the end of the image's setup" logged db2 "Setup has completed"
    URL="db2+ibm_db://db2inst1:$PASSWORD@127.0.0.1:50000/testdb"
    ENV=DBCLUSTER_TEST_DB2_URL EXTRA=db2
}

run() {
    local name=$1 rc=0
    if ! "up_$name"; then
        stop "$name"
        return 1
    fi
    "$VENV/bin/python" -m pip install --quiet -e ".[test,$EXTRA]" || rc=1
    if [ "$rc" = 0 ]; then
        log "$name: the whole test suite"
        # Only this backend: the others are skipped with their reason, never started from here.
        env DBCLUSTER_TEST_CONTAINERS=0 "$ENV=$URL" "$VENV/bin/python" -m pytest -q || rc=1
        log "$name: the shipped conformance suite"
        "$VENV/bin/python" -m pytest -q -p no:cacheprovider -p dbcluster.testing.plugin \
            --pyargs dbcluster.testing.suite --dbcluster-url "$URL" || rc=1
        log "$name: a short chaos run"
        "$VENV/bin/dbcluster" chaos --url "$URL" --nodes 3 --jobs 2 --faults 4 --seed 7 || rc=1
    fi
    stop "$name"
    return "$rc"
}

main() {
    if [ "${1:-}" = --list ]; then
        printf '%s\n' "${ALL[@]}"
        return 0
    fi
    local names=() arg
    for arg in "${@:-${ALL[@]}}"; do
        case $arg in
            oracle) names+=(oracle21 oracle23) ;;
            sqlite | postgresql | mariadb | mysql | oracle21 | oracle23 | mssql | db2) names+=("$arg") ;;
            *) log "unknown backend '$arg' (one of: ${ALL[*]} oracle)"; return 2 ;;
        esac
    done
    if [ "${names[*]}" != sqlite ] && ! docker info >/dev/null 2>&1; then
        log "no Docker engine answers: only 'ci/matrix.sh sqlite' runs without one"
        return 2
    fi
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    local failed=()
    for arg in "${names[@]}"; do
        run "$arg" || failed+=("$arg")
    done
    if [ "${#failed[@]}" -gt 0 ]; then
        log "failed: ${failed[*]}"
        return 1
    fi
    log "passed: ${names[*]}"
}

main "$@"
