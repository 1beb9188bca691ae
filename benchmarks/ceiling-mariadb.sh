#!/usr/bin/env bash
# A MariaDB (or MySQL) server of its own for `dbcluster bench ceiling`: port 3307,
# max_connections 2500 (CEILING_MAX_CONNECTIONS), root without a password on 127.0.0.1, data under /var/tmp. Its
# SHOW GLOBAL STATUS counters are then the scenario's alone (a shared server's include every
# other client's statements). It leaves the server on 3306 alone. Run as root; idempotent.
#
#   bash benchmarks/ceiling-mariadb.sh          # create (if needed) and start
#   bash benchmarks/ceiling-mariadb.sh stop     # stop it
#   bash benchmarks/ceiling-mariadb.sh drop     # stop it and delete its data
set -euo pipefail
PORT=${CEILING_PORT:-3307}
DIR=${CEILING_DIR:-/var/tmp/dbcluster-ceiling-mariadb}
SOCKET=$DIR/mysqld.sock

stop() {
    if [ -f "$DIR/mysqld.pid" ] && kill -0 "$(cat "$DIR/mysqld.pid")" 2>/dev/null; then
        mariadb-admin --socket="$SOCKET" -uroot shutdown
    fi
}
case "${1:-start}" in
stop) stop; exit 0 ;;
drop) stop; rm -rf "$DIR"; exit 0 ;;
start) ;;
*) echo "usage: $0 [start|stop|drop]" >&2; exit 2 ;;
esac

mkdir -p "$DIR"
cat >"$DIR/my.cnf" <<CNF
[mariadbd]
datadir = $DIR/data
socket = $SOCKET
pid-file = $DIR/mysqld.pid
port = $PORT
bind-address = 127.0.0.1
max_connections = ${CEILING_MAX_CONNECTIONS:-2500}
thread_handling = ${CEILING_THREAD_HANDLING:-pool-of-threads}
skip-name-resolve
log-error = $DIR/error.log
CNF
chown -R mysql:mysql "$DIR"
if [ ! -d "$DIR/data/mysql" ]; then
    mariadb-install-db --defaults-file="$DIR/my.cnf" --user=mysql --auth-root-authentication-method=normal >/dev/null
fi
if ! { [ -f "$DIR/mysqld.pid" ] && kill -0 "$(cat "$DIR/mysqld.pid")" 2>/dev/null; }; then
    mariadbd --defaults-file="$DIR/my.cnf" --user=mysql >/dev/null 2>&1 &
    for _ in $(seq 1 100); do
        mariadb-admin --socket="$SOCKET" -uroot ping >/dev/null 2>&1 && break
        sleep 0.2
    done
fi
mariadb --socket="$SOCKET" -uroot -e "
    CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
    GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
    CREATE DATABASE IF NOT EXISTS test;
    SELECT CONCAT('ready: max_connections=', @@max_connections) AS '';"
echo "dbcluster bench ceiling --url mariadb+pymysql://root@127.0.0.1:$PORT/test"
