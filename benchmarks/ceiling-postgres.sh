#!/usr/bin/env bash
# A PostgreSQL cluster of its own for `dbcluster bench ceiling` (Debian/Ubuntu's postgresql-common):
# port 5434, max_connections 2500 (CEILING_MAX_CONNECTIONS), pg_stat_statements preloaded (the scenario's statement counts),
# trust for 127.0.0.1. It leaves the cluster on 5432 alone. Run as root; idempotent.
#
#   bash benchmarks/ceiling-postgres.sh          # create (if needed) and start
#   bash benchmarks/ceiling-postgres.sh stop     # stop it
#   bash benchmarks/ceiling-postgres.sh drop     # stop and delete it
set -euo pipefail
NAME=${CEILING_CLUSTER:-ceiling}
PORT=${CEILING_PORT:-5434}
VERSION=${PG_VERSION:-$(ls /usr/lib/postgresql | sort -V | tail -1)}

case "${1:-start}" in
stop) pg_ctlcluster "$VERSION" "$NAME" stop; exit 0 ;;
drop) pg_dropcluster --stop "$VERSION" "$NAME"; exit 0 ;;
start) ;;
*) echo "usage: $0 [start|stop|drop]" >&2; exit 2 ;;
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
