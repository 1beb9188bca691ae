#!/usr/bin/env bash
# A PostgreSQL cluster of its own for `dbcluster bench ceiling` (Debian/Ubuntu's postgresql-common):
# port 5434, max_connections 2500 (CEILING_MAX_CONNECTIONS), pg_stat_statements preloaded (the scenario's statement counts),
# trust for 127.0.0.1. It leaves the cluster on 5432 alone. Run as root; idempotent.
#
#   bash benchmarks/ceiling-postgres.sh            # create (if needed) and start
#   bash benchmarks/ceiling-postgres.sh pgbouncer  # and PgBouncer in front (transaction mode)
#   bash benchmarks/ceiling-postgres.sh stop       # stop both
#   bash benchmarks/ceiling-postgres.sh drop       # stop both and delete the cluster
set -euo pipefail
NAME=${CEILING_CLUSTER:-ceiling}
PORT=${CEILING_PORT:-5434}
VERSION=${PG_VERSION:-$(ls /usr/lib/postgresql | sort -V | tail -1)}
# PgBouncer (Debian's): CEILING_PGB_PORT, a pool of CEILING_PGB_POOL server connections (about
# ten per core serve a few thousand idle nodes) and room for 5,000 clients.
PGB_PORT=${CEILING_PGB_PORT:-6434}
PGB_DIR=${CEILING_PGB_DIR:-/var/tmp/dbcluster-ceiling-pgbouncer}

pgb_stop() {
    if [ -f "$PGB_DIR/pgbouncer.pid" ] && kill -0 "$(cat "$PGB_DIR/pgbouncer.pid")" 2>/dev/null; then
        kill "$(cat "$PGB_DIR/pgbouncer.pid")"
    fi
}

pgb_start() {
    command -v pgbouncer >/dev/null || apt-get install -y -q pgbouncer >/dev/null
    pgb_stop
    install -d -o postgres -g postgres "$PGB_DIR"
    echo '"postgres" ""' >"$PGB_DIR/userlist.txt"
    cat >"$PGB_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
pool_mode = transaction
max_client_conn = 5000
default_pool_size = ${CEILING_PGB_POOL:-20}
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = $PGB_DIR/pgbouncer.log
pidfile = $PGB_DIR/pgbouncer.pid
INI
    chown postgres:postgres "$PGB_DIR"/*
    # One descriptor per client and per server connection.
    runuser -u postgres -- sh -c "ulimit -n 12000 && pgbouncer -d '$PGB_DIR/pgbouncer.ini'"
    for _ in $(seq 1 50); do
        psql -h 127.0.0.1 -p "$PGB_PORT" -U postgres -d postgres -Atc "SELECT 1" >/dev/null 2>&1 && break
        sleep 0.2
    done
    echo "ulimit -n 12000  # the load generator's connections too"
    echo "dbcluster bench ceiling --url 'postgresql+psycopg://postgres@127.0.0.1:$PGB_PORT/postgres?dbcluster_pooler=transaction' --ceiling-plain-connections"
}

case "${1:-start}" in
stop) pgb_stop; pg_ctlcluster "$VERSION" "$NAME" stop; exit 0 ;;
drop) pgb_stop; pg_dropcluster --stop "$VERSION" "$NAME"; exit 0 ;;
start | pgbouncer) ;;
*) echo "usage: $0 [start|pgbouncer|stop|drop]" >&2; exit 2 ;;
esac

if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$VERSION $NAME"; then
    pg_createcluster "$VERSION" "$NAME" -p "$PORT" >/dev/null
fi
CONF=/etc/postgresql/$VERSION/$NAME
cat >"$CONF/conf.d/ceiling.conf" <<CONF
max_connections = ${CEILING_MAX_CONNECTIONS:-2500}
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track_utility = on
listen_addresses = '127.0.0.1'
CONF
if ! grep -q "^host all all 127.0.0.1/32 trust" "$CONF/pg_hba.conf"; then
    sed -i '1i host all all 127.0.0.1/32 trust' "$CONF/pg_hba.conf"
fi
if pg_lsclusters -h | awk -v v="$VERSION" -v n="$NAME" '$1==v && $2==n {print $4}' | grep -q online; then
    pg_ctlcluster "$VERSION" "$NAME" restart
else
    pg_ctlcluster "$VERSION" "$NAME" start
fi
psql -h 127.0.0.1 -p "$PORT" -U postgres -Atc "SELECT 'ready: max_connections=' || current_setting('max_connections')"
echo "dbcluster bench ceiling --url postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"
if [ "${1:-start}" = pgbouncer ]; then
    pgb_start
fi
