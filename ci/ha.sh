#!/usr/bin/env bash
# High-availability topologies on loopback, for the HA tests and chaos runs (issues 34 and 35).
#
#   ci/ha.sh pg up [--sync|--async]   PostgreSQL 15 primary + streaming standby (pg_basebackup -R)
#   ci/ha.sh pg restart [DOWN_S]      stop the primary (-m fast), wait DOWN_S (default 0), start
#   ci/ha.sh pg crash [DOWN_S] [--immediate]
#                                     kill -9 the primary's postmaster and its children (or stop it
#                                     -m immediate), wait DOWN_S, start it (crash recovery)
#   ci/ha.sh pg switchover [--rebuild] [--down S]
#                                     stop the primary, (wait S s, as a failover tool deciding
#                                     would,) promote the standby; --rebuild makes the old
#                                     primary a standby of the new one (fresh pg_basebackup)
#   ci/ha.sh pg failover [--rebuild]  an unplanned failover: kill -9 the primary, promote the
#                                     standby (asynchronous replication loses what was not sent)
#   ci/ha.sh pg rebuild               make the server that is not the primary its standby again
#   ci/ha.sh pg down | status | urls
#   ci/ha.sh galera up                three MariaDB Galera nodes (galera-4, rsync SST)
#   ci/ha.sh galera kill N            kill -9 node N (1..3)
#   ci/ha.sh galera rejoin N          start node N again and wait until it is Synced
#   ci/ha.sh galera bounce N DOWN_S   kill N, wait DOWN_S, rejoin N
#   ci/ha.sh galera down | status | urls
#   ci/ha.sh pgbouncer up | down | status | urls
#                                     PgBouncer (Debian's 1.18) in transaction mode in front of
#                                     the pair's primary (start `pg up` first)
#   ci/ha.sh all up | down
#
# Every `up` is idempotent (a healthy topology is left as it is and its URLs printed again; a
# broken or half-made one is torn down and made anew), waits for readiness with a deadline
# (HA_TIMEOUT seconds, default 90) and prints the URLs to use on stdout as `export NAME='URL'`
# lines (so `eval "$(ci/ha.sh pg up)"` works). Every `down` stops what this script started, by
# pid or through pg_ctlcluster, and removes its data directories. Timings go to stderr.
#
# Runs as root (it installs pgbouncer if missing, and runs the servers as postgres and mysql).
# Ports never collide with the shared servers (5432, 3306) and stay below the ephemeral range
# (32768 and up: a port there can be taken by an outgoing connection); override them below.
# Servers are small: shared_buffers 32MB, innodb_buffer_pool_size 64M, gcache 16M.
set -euo pipefail

HA_NAME=${HA_NAME:-dbcha}                 # prefix of the PostgreSQL cluster names
HA_DIR=${HA_DIR:-/var/tmp/dbcluster-ha-$HA_NAME}
HA_TIMEOUT=${HA_TIMEOUT:-90}
HA_PG_PORT=${HA_PG_PORT:-25432}           # primary at HA_PG_PORT, standby at HA_PG_PORT+1
HA_GALERA_PORT=${HA_GALERA_PORT:-23306}   # node N (1..3) at HA_GALERA_PORT+N-1
HA_GALERA_GCOMM=${HA_GALERA_GCOMM:-24560} # node N: gcomm +N, IST +10+N, SST +20+N
HA_PGB_PORT=${HA_PGB_PORT:-26432}
PG_VERSION=${PG_VERSION:-15}

PG_A="${HA_NAME}_a"
PG_B="${HA_NAME}_b"
PGBIN="/usr/lib/postgresql/$PG_VERSION/bin"
GALERA_LIB=/usr/lib/galera/libgalera_smm.so

T0=$(date +%s.%N)
say() { echo "ha: $*" >&2; }
die() { echo "ha: $*" >&2; exit 1; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# The outage a fault made: from just before the server went away to the first write it took.
DOWN_AT=""
went_down() { DOWN_AT=$(date +%s.%N); }
came_back() {
    say "$1: outage $(awk -v a="$DOWN_AT" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
}
done_in() { say "$1 done in $(elapsed) s"; }
# After a down: the state directory goes too once nothing of any topology is left in it.
tidy() { rmdir "$HA_DIR" 2>/dev/null || true; }

# wait_for WHAT COMMAND...: poll until COMMAND succeeds, or fail after HA_TIMEOUT seconds.
wait_for() {
    local what=$1; shift
    local deadline=$(( $(date +%s) + HA_TIMEOUT ))
    until "$@" >/dev/null 2>&1; do
        if (( $(date +%s) >= deadline )); then
            die "timed out after ${HA_TIMEOUT} s waiting for $what"
        fi
        sleep 0.2
    done
}

need_root() { [[ $(id -u) == 0 ]] || die "run as root (it starts servers as postgres and mysql)"; }

apt_install() {  # apt_install PACKAGE...: install what is missing (a fresh machine of this kind)
    local missing=()
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    (( ${#missing[@]} )) || return 0
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# ------------------------------------------------------------------------------------------------
# PostgreSQL: a primary and a streaming standby
# ------------------------------------------------------------------------------------------------

pg_port_of() { [[ $1 == "$PG_A" ]] && echo "$HA_PG_PORT" || echo $((HA_PG_PORT + 1)); }
pg_other() { [[ $1 == "$PG_A" ]] && echo "$PG_B" || echo "$PG_A"; }
pg_exists() { [[ -f "/etc/postgresql/$PG_VERSION/$1/postgresql.conf" ]]; }
pg_datadir() { echo "$HA_DIR/pg/$1"; }
psql_at() {  # psql_at PORT SQL
    psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -XtAq -v ON_ERROR_STOP=1 -c "$2"
}
pg_ready() { pg_isready -h 127.0.0.1 -p "$1" -q; }
pg_is_primary() { [[ $(psql_at "$1" "SELECT pg_is_in_recovery()" 2>/dev/null) == f ]]; }
pg_is_standby() { [[ $(psql_at "$1" "SELECT pg_is_in_recovery()" 2>/dev/null) == t ]]; }
pg_running() { pg_exists "$1" && pg_ctlcluster "$PG_VERSION" "$1" status >/dev/null 2>&1; }

# The cluster that is the primary now (by asking the servers), or nothing.
pg_primary() {
    local c
    for c in "$PG_A" "$PG_B"; do
        if pg_exists "$c" && pg_is_primary "$(pg_port_of "$c")"; then echo "$c"; return 0; fi
    done
    return 1
}

pg_mode() { cat "$HA_DIR/pg/mode" 2>/dev/null || echo async; }

# The standby's walreceiver reports cluster_name (Debian sets "15/NAME") as its application name.
pg_write_mode_conf() {  # pg_write_mode_conf CLUSTER MODE
    local conf="/etc/postgresql/$PG_VERSION/$1/conf.d/ha-mode.conf"
    if [[ $2 == sync ]]; then
        echo "synchronous_standby_names = '*'" >"$conf"
    else
        echo "synchronous_standby_names = ''" >"$conf"
    fi
    chown postgres:postgres "$conf"
}

pg_new_cluster() {  # pg_new_cluster NAME PORT
    local name=$1 port=$2 dir
    dir=$(pg_datadir "$name")
    mkdir -p "$(dirname "$dir")"
    chown postgres:postgres "$(dirname "$dir")"
    pg_createcluster "$PG_VERSION" "$name" --port "$port" -d "$dir" --start-conf=manual \
        -- --auth=trust >/dev/null
    cat >"/etc/postgresql/$PG_VERSION/$name/conf.d/ha.conf" <<EOF
listen_addresses = '127.0.0.1'
shared_buffers = 32MB
max_connections = 200
wal_level = replica
max_wal_senders = 5
wal_keep_size = 256MB
hot_standby = on
log_min_messages = warning
EOF
    local hba="/etc/postgresql/$PG_VERSION/$name/pg_hba.conf"
    cat >"$hba" <<EOF
local all all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
EOF
    chown postgres:postgres "$hba"
}

# Make CLUSTER a standby of the primary at PRIMARY_PORT (its data replaced by a base backup).
pg_make_standby() {  # pg_make_standby CLUSTER PRIMARY_PORT
    local name=$1 from=$2 dir
    dir=$(pg_datadir "$name")
    pg_ctlcluster "$PG_VERSION" "$name" stop -m immediate >/dev/null 2>&1 || true
    rm -rf "$dir"
    install -d -o postgres -g postgres -m 700 "$dir"
    runuser -u postgres -- "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$from" -U postgres \
        -D "$dir" -R -X stream -c fast
    pg_ctlcluster "$PG_VERSION" "$name" start
    wait_for "$name to accept connections" pg_ready "$(pg_port_of "$name")"
    wait_for "$name to run as a standby" pg_is_standby "$(pg_port_of "$name")"
    wait_for "$name to stream from port $from" pg_streaming "$from"
}

pg_streaming() {  # a standby streams from the primary at PORT
    [[ $(psql_at "$1" "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") -ge 1 ]]
}

pg_healthy() {
    local p s
    p=$(pg_primary) || return 1
    s=$(pg_other "$p")
    pg_is_standby "$(pg_port_of "$s")" && pg_streaming "$(pg_port_of "$p")"
}

pg_urls() {
    local a=$HA_PG_PORT b=$((HA_PG_PORT + 1)) p
    echo "export HA_PG_PAIR_URL='postgresql+psycopg://postgres@/test?host=127.0.0.1:$a&host=127.0.0.1:$b&target_session_attrs=read-write'"
    if p=$(pg_primary 2>/dev/null); then
        echo "export HA_PG_PRIMARY_URL='postgresql+psycopg://postgres@127.0.0.1:$(pg_port_of "$p")/test'"
        echo "export HA_PG_STANDBY_URL='postgresql+psycopg://postgres@127.0.0.1:$(pg_port_of "$(pg_other "$p")")/test'"
    fi
    echo "export HA_PG_MODE='$(pg_mode)'"
}

pg_set_mode() {  # pg_set_mode MODE: on both clusters, reloaded
    local mode=$1 c
    mkdir -p "$HA_DIR/pg"
    echo "$mode" >"$HA_DIR/pg/mode"
    for c in "$PG_A" "$PG_B"; do
        pg_exists "$c" || continue
        pg_write_mode_conf "$c" "$mode"
        if pg_running "$c"; then pg_ctlcluster "$PG_VERSION" "$c" reload >/dev/null; fi
    done
}

pg_up() {
    local mode=async
    for arg in "$@"; do
        case $arg in
            --sync) mode=sync ;;
            --async) mode=async ;;
            *) die "pg up: unknown option $arg (use --sync or --async)" ;;
        esac
    done
    need_root
    if pg_healthy 2>/dev/null; then
        if [[ $(pg_mode) != "$mode" ]]; then pg_set_mode "$mode"; fi
        pg_wait_mode "$mode"
        say "pg: already up ($mode)"
        pg_urls
        done_in "pg up"
        return 0
    fi
    pg_down_quiet
    mkdir -p "$HA_DIR/pg"
    echo "$mode" >"$HA_DIR/pg/mode"
    pg_new_cluster "$PG_A" "$HA_PG_PORT"
    # Asynchronous until its standby exists (a synchronous primary alone blocks every COMMIT).
    pg_write_mode_conf "$PG_A" async
    pg_ctlcluster "$PG_VERSION" "$PG_A" start
    wait_for "$PG_A to accept connections" pg_ready "$HA_PG_PORT"
    psql_at "$HA_PG_PORT" "CREATE DATABASE test"
    pg_new_cluster "$PG_B" $((HA_PG_PORT + 1))
    pg_write_mode_conf "$PG_B" "$mode"
    pg_make_standby "$PG_B" "$HA_PG_PORT"
    pg_set_mode "$mode"
    pg_wait_mode "$mode"
    pg_urls
    done_in "pg up ($mode)"
}

# In sync mode, wait until the primary reports its standby as synchronous.
pg_wait_mode() {
    [[ $1 == sync ]] || return 0
    local p
    p=$(pg_primary)
    wait_for "a synchronous standby" pg_sync_standby "$(pg_port_of "$p")"
}
pg_sync_standby() {
    [[ $(psql_at "$1" "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") -ge 1 ]]
}

pg_down_quiet() {
    local c
    for c in "$PG_A" "$PG_B"; do
        if pg_exists "$c"; then
            pg_ctlcluster "$PG_VERSION" "$c" stop -m immediate >/dev/null 2>&1 || true
            pg_dropcluster "$PG_VERSION" "$c" >/dev/null 2>&1 || true
        fi
        rm -rf "$(pg_datadir "$c")" "/etc/postgresql/$PG_VERSION/$c"
    done
    rm -rf "$HA_DIR/pg"
}

pg_down() {
    need_root
    pg_down_quiet
    tidy
    done_in "pg down"
}

pg_restart() {  # pg_restart [DOWN_S]
    local down=${1:-0} p
    p=$(pg_primary) || die "pg restart: no primary is running"
    went_down
    pg_ctlcluster "$PG_VERSION" "$p" stop -m fast
    say "pg: $p stopped (fast); down for ${down} s"
    sleep "$down"
    pg_start_again "$p"
    done_in "pg restart of $p"
}

# Kill -9 CLUSTER's postmaster and its children (as a machine loss would), and wait until the
# last of them is gone (the shared memory block is busy until then).
pg_kill() {  # pg_kill CLUSTER
    local pm children
    pm=$(head -n 1 "$(pg_datadir "$1")/postmaster.pid")
    # Held still first, so that it forks no backend between the listing of its children and
    # its death (an orphan missed so kept the shared memory, and the restart failed with
    # "pre-existing shared memory block is still in use" under load).
    kill -STOP "$pm"
    children=$(ps -o pid= --ppid "$pm" || true)
    kill -9 "$pm"
    # shellcheck disable=SC2086 # a list of pids
    [[ -z $children ]] || kill -9 $children 2>/dev/null || true
    wait_for "the old postmaster's processes to end" pids_gone "$pm" $children
    rm -f "$(pg_datadir "$1")/postmaster.pid"
}

# Promote the standby CLUSTER. In sync mode a promoted standby without a standby of its own
# would block every COMMIT: it runs asynchronously until it has one again (as Patroni does when
# not "strict").
pg_promote() {  # pg_promote CLUSTER
    pg_write_mode_conf "$1" async
    pg_ctlcluster "$PG_VERSION" "$1" reload
    pg_ctlcluster "$PG_VERSION" "$1" promote
    wait_for "$1 to accept writes" pg_is_primary "$(pg_port_of "$1")"
}

pg_crash() {  # pg_crash [DOWN_S] [--immediate]
    local down=0 how=kill9 p
    for arg in "$@"; do
        case $arg in
            --immediate) how=immediate ;;
            --kill) how=kill9 ;;
            *) down=$arg ;;
        esac
    done
    p=$(pg_primary) || die "pg crash: no primary is running"
    went_down
    if [[ $how == immediate ]]; then
        pg_ctlcluster "$PG_VERSION" "$p" stop -m immediate
    else
        pg_kill "$p"
    fi
    say "pg: $p crashed ($how); down for ${down} s"
    sleep "$down"
    pg_start_again "$p"
    done_in "pg crash of $p ($how)"
}

pids_gone() {
    local pid
    for pid in "$@"; do
        if kill -0 "$pid" 2>/dev/null; then return 1; fi
    done
}

pg_start_again() {
    local c=$1 port
    port=$(pg_port_of "$c")
    pg_ctlcluster "$PG_VERSION" "$c" start
    wait_for "$c to accept connections" pg_ready "$port"
    wait_for "$c to accept writes" pg_is_primary "$port"
    came_back "pg: $c"
    if pg_running "$(pg_other "$c")"; then
        wait_for "the standby to stream again" pg_streaming "$port"
    fi
    pg_wait_mode "$(pg_mode)"
}

pg_switchover() {  # pg_switchover [--rebuild] [--down S]
    local rebuild=0 down=0 old new
    while (( $# )); do
        case $1 in
            --rebuild) rebuild=1 ;;
            --down) down=${2:?pg switchover --down S}; shift ;;
            *) die "pg switchover: unknown option $1" ;;
        esac
        shift
    done
    old=$(pg_primary) || die "pg switchover: no primary is running"
    new=$(pg_other "$old")
    pg_is_standby "$(pg_port_of "$new")" || die "pg switchover: $new is not a running standby"
    went_down
    # The standby receives everything the primary wrote until its fast shutdown.
    pg_ctlcluster "$PG_VERSION" "$old" stop -m fast
    # A failover tool takes a while to decide (Patroni: up to its ttl); --down plays that part.
    sleep "$down"
    pg_promote "$new"
    came_back "pg: switchover to $new"
    say "pg: switched over from $old to $new"
    if (( rebuild )); then pg_rebuild_standby; fi
    pg_urls
    done_in "pg switchover"
}

# An unplanned failover: the primary is killed (kill -9 of its postmaster and children, as a
# machine loss would), the standby promoted with whatever it had received. Asynchronous
# replication loses here what the primary had acknowledged and not yet sent.
pg_failover() {  # pg_failover [--rebuild]
    local rebuild=0 old new
    for arg in "$@"; do
        case $arg in
            --rebuild) rebuild=1 ;;
            *) die "pg failover: unknown option $arg" ;;
        esac
    done
    old=$(pg_primary) || die "pg failover: no primary is running"
    new=$(pg_other "$old")
    pg_is_standby "$(pg_port_of "$new")" || die "pg failover: $new is not a running standby"
    went_down
    pg_kill "$old"
    pg_promote "$new"
    came_back "pg: failover to $new"
    say "pg: failed over from $old (killed) to $new"
    if (( rebuild )); then pg_rebuild_standby; fi
    pg_urls
    done_in "pg failover"
}

# Make the cluster that is not the primary a standby of it again (a fresh base backup), and
# restore the pair's mode.
pg_rebuild_standby() {
    local p s
    p=$(pg_primary) || die "pg rebuild: no primary is running"
    s=$(pg_other "$p")
    pg_make_standby "$s" "$(pg_port_of "$p")"
    pg_set_mode "$(pg_mode)"
    pg_wait_mode "$(pg_mode)"
    say "pg: $s rebuilt as a standby of $p"
}

pg_status() {
    local c port role p
    for c in "$PG_A" "$PG_B"; do
        port=$(pg_port_of "$c")
        if ! pg_exists "$c"; then role=absent
        elif pg_is_primary "$port"; then role=primary
        elif pg_is_standby "$port"; then role=standby
        else role=down; fi
        echo "$c 127.0.0.1:$port $role"
    done
    echo "mode $(pg_mode)"
    if p=$(pg_primary 2>/dev/null); then
        echo "synchronous_standby_names on the primary: '$(psql_at "$(pg_port_of "$p")" "SHOW synchronous_standby_names")'"
    fi
}

# ------------------------------------------------------------------------------------------------
# MariaDB Galera: three nodes on loopback
# ------------------------------------------------------------------------------------------------

g_dir() { echo "$HA_DIR/galera/n$1"; }
g_port() { echo $((HA_GALERA_PORT + $1 - 1)); }
g_sock() { echo "$(g_dir "$1")/mysqld.sock"; }
g_pid() { cat "$(g_dir "$1")/mysqld.pid" 2>/dev/null; }
g_sql() {  # g_sql N SQL
    mariadb -h 127.0.0.1 -P "$(g_port "$1")" -uroot --connect-timeout=2 -NBe "$2"
}
g_status_var() { g_sql "$1" "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | awk '{print $2}'; }
g_synced() {
    [[ $(g_status_var "$1" wsrep_local_state_comment) == Synced ]] &&
        [[ $(g_status_var "$1" wsrep_ready) == ON ]]
}
g_size_is() { [[ $(g_status_var "$1" wsrep_cluster_size) == "$2" ]]; }
g_alive() { local pid; pid=$(g_pid "$1") && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }

g_write_conf() {  # g_write_conf N
    local n=$1 dir gcomm=""
    dir=$(g_dir "$n")
    for i in 1 2 3; do gcomm+="${gcomm:+,}127.0.0.1:$((HA_GALERA_GCOMM + i))"; done
    cat >"$dir/my.cnf" <<EOF
[mysqld]
user = mysql
datadir = $dir/data
socket = $(g_sock "$n")
# Its own tmpdir: a starting node deletes every '#sql*' file in its tmpdir (leftovers of its
# own last run), so in a shared /tmp it deleted the live temporary tables of the other nodes
# (a statement on node 2 failed with error 6 "Error on delete of '/tmp/#sql-update-...MAI'"
# while node 1 rejoined).
tmpdir = $dir/tmp
pid-file = $dir/mysqld.pid
log-error = $dir/error.log
port = $(g_port "$n")
bind-address = 127.0.0.1
skip-name-resolve
performance_schema = OFF
innodb_buffer_pool_size = 64M
innodb_log_file_size = 32M
max_connections = 300
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
wsrep_on = ON
wsrep_provider = $GALERA_LIB
wsrep_cluster_name = $HA_NAME
wsrep_cluster_address = gcomm://$gcomm
wsrep_node_name = n$n
wsrep_node_address = 127.0.0.1:$((HA_GALERA_GCOMM + n))
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:$((HA_GALERA_GCOMM + n));ist.recv_addr=127.0.0.1:$((HA_GALERA_GCOMM + 10 + n));gcache.size=16M;gcache.page_size=16M;evs.suspect_timeout=PT5S;evs.inactive_timeout=PT10S"
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$((HA_GALERA_GCOMM + 20 + n))
wsrep_slave_threads = 2
EOF
}

g_start() {  # g_start N [--wsrep-new-cluster]
    local n=$1; shift
    local dir
    dir=$(g_dir "$n")
    rm -f "$dir/mysqld.pid"
    # Its own session, in the background; ended by the pid in its pid file.
    setsid /usr/sbin/mariadbd --defaults-file="$dir/my.cnf" "$@" \
        </dev/null >>"$dir/stdout.log" 2>&1 &
}

g_wait_synced() {  # g_wait_synced N
    wait_for "galera node $1 to be Synced (see $(g_dir "$1")/error.log)" g_synced "$1"
}

g_urls() {
    for n in 1 2 3; do
        echo "export HA_GALERA_URL_$n='mariadb+pymysql://root@127.0.0.1:$(g_port "$n")/test'"
    done
    echo "export HA_GALERA_URLS='mariadb+pymysql://root@127.0.0.1:$(g_port 1)/test mariadb+pymysql://root@127.0.0.1:$(g_port 2)/test mariadb+pymysql://root@127.0.0.1:$(g_port 3)/test'"
}

g_healthy() {
    local n
    for n in 1 2 3; do g_synced "$n" && g_size_is "$n" 3 || return 1; done
}

g_up() {
    need_root
    [[ -f $GALERA_LIB ]] || apt_install galera-4
    apt_install rsync
    if g_healthy 2>/dev/null; then
        say "galera: already up"
        g_urls
        done_in "galera up"
        return 0
    fi
    g_down_quiet
    for n in 1 2 3; do
        install -d -o mysql -g mysql "$(g_dir "$n")" "$(g_dir "$n")/data" "$(g_dir "$n")/tmp"
        g_write_conf "$n"
    done
    # Only the first node gets system tables; the others receive everything by SST.
    mariadb-install-db --defaults-file="$(g_dir 1)/my.cnf" --user=mysql \
        --auth-root-authentication-method=normal --skip-test-db >"$(g_dir 1)/install.log" 2>&1 \
        || die "mariadb-install-db failed: see $(g_dir 1)/install.log"
    g_start 1 --wsrep-new-cluster
    g_wait_synced 1
    g_sql 1 "CREATE DATABASE IF NOT EXISTS test"
    for n in 2 3; do
        g_start "$n"
        g_wait_synced "$n"
    done
    for n in 1 2 3; do wait_for "galera node $n to see 3 nodes" g_size_is "$n" 3; done
    g_urls
    done_in "galera up"
}

g_kill() {  # g_kill N
    local n=$1 pid
    pid=$(g_pid "$n") || die "galera kill: node $n has no pid file"
    kill -9 "$pid" 2>/dev/null || true
    wait_for "galera node $n (pid $pid) to end" pids_gone "$pid"
    say "galera: node $n killed (pid $pid)"
    done_in "galera kill $n"
}

g_rejoin() {  # g_rejoin N
    local n=$1
    if g_alive "$n"; then say "galera: node $n is running"; else g_start "$n"; fi
    g_wait_synced "$n"
    for m in 1 2 3; do
        if g_alive "$m"; then wait_for "node $m to see node $n" g_size_is "$m" "$(g_live_count)"; fi
    done
    done_in "galera rejoin $n"
}
g_live_count() { local c=0; for m in 1 2 3; do g_alive "$m" && c=$((c + 1)); done; echo $c; }

g_down_quiet() {
    local n pid pids=()
    for n in 1 2 3; do
        pid=$(g_pid "$n" || true)
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    (( ${#pids[@]} == 0 )) || wait_for "the galera nodes to end" pids_gone "${pids[@]}"
    rm -rf "$HA_DIR/galera"
}

g_down() {
    need_root
    g_down_quiet
    tidy
    done_in "galera down"
}

g_status() {
    for n in 1 2 3; do
        if g_alive "$n"; then
            echo "n$n 127.0.0.1:$(g_port "$n") $(g_status_var "$n" wsrep_local_state_comment)" \
                "size=$(g_status_var "$n" wsrep_cluster_size)"
        else
            echo "n$n 127.0.0.1:$(g_port "$n") down"
        fi
    done
}

# ------------------------------------------------------------------------------------------------
# PgBouncer in transaction mode, in front of the pair's primary
# ------------------------------------------------------------------------------------------------

b_dir() { echo "$HA_DIR/pgbouncer"; }
b_pid() { cat "$(b_dir)/pgbouncer.pid" 2>/dev/null; }
b_alive() { local pid; pid=$(b_pid) && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }
b_ready() { psql -h 127.0.0.1 -p "$HA_PGB_PORT" -U postgres -d test -XtAqc "SELECT 1"; }

# dbcluster's URL through PgBouncer says that it pools by transaction (docs/databases.md); the
# direct URL of the primary is the one for a node's listening connection (listen_url).
b_urls() {
    echo "export HA_PGBOUNCER_URL='postgresql+psycopg://postgres@127.0.0.1:$HA_PGB_PORT/test?dbcluster_pooler=transaction'"
}

b_up() {
    need_root
    apt_install pgbouncer
    local p port dir
    p=$(pg_primary) || die "pgbouncer up: no PostgreSQL primary (run: ci/ha.sh pg up)"
    port=$(pg_port_of "$p")
    dir=$(b_dir)
    if b_alive && b_ready >/dev/null 2>&1 && grep -q "port=$port " "$dir/pgbouncer.ini"; then
        say "pgbouncer: already up"
        b_urls
        done_in "pgbouncer up"
        return 0
    fi
    b_down_quiet
    install -d -o postgres -g postgres "$dir"
    echo '"postgres" ""' >"$dir/userlist.txt"
    # HA_PGB_IGNORE: startup parameters PgBouncer accepts and drops. By default only
    # extra_float_digits, as shipped: a client sending `options` (e.g. -c lock_timeout=...) is
    # refused, never silently stripped of its session settings.
    cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$port 
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $HA_PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
server_reset_query =
ignore_startup_parameters = ${HA_PGB_IGNORE:-extra_float_digits}
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
    chown postgres:postgres "$dir"/*
    runuser -u postgres -- pgbouncer -d "$dir/pgbouncer.ini"
    wait_for "pgbouncer to answer on $HA_PGB_PORT" b_ready
    b_urls
    done_in "pgbouncer up (transaction mode, in front of $p)"
}

b_down_quiet() {
    local pid
    pid=$(b_pid || true)
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -INT "$pid" 2>/dev/null || true
        wait_for "pgbouncer (pid $pid) to end" pids_gone "$pid"
    fi
    rm -rf "$(b_dir)"
}

b_down() {
    need_root
    b_down_quiet
    tidy
    done_in "pgbouncer down"
}

b_status() {
    if b_alive; then echo "pgbouncer 127.0.0.1:$HA_PGB_PORT up"; else echo "pgbouncer down"; fi
}

# ------------------------------------------------------------------------------------------------

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

topology=${1:-}; action=${2:-}
[[ -n $topology && -n $action ]] || usage
shift 2
case "$topology:$action" in
    pg:up) pg_up "$@" ;;
    pg:down) pg_down ;;
    pg:restart) pg_restart "$@" ;;
    pg:crash) pg_crash "$@" ;;
    pg:switchover) pg_switchover "$@" ;;
    pg:failover) pg_failover "$@" ;;
    pg:rebuild) pg_rebuild_standby; pg_urls; done_in "pg rebuild" ;;
    pg:status) pg_status ;;
    pg:urls) pg_urls ;;
    galera:up) g_up ;;
    galera:down) g_down ;;
    galera:kill) g_kill "${1:?galera kill N}" ;;
    galera:rejoin) g_rejoin "${1:?galera rejoin N}" ;;
    galera:bounce)
        g_kill "${1:?galera bounce N DOWN_S}"
        sleep "${2:-0}"
        g_rejoin "$1"
        ;;
    galera:status) g_status ;;
    galera:urls) g_urls ;;
    pgbouncer:up) b_up ;;
    pgbouncer:down) b_down ;;
    pgbouncer:status) b_status ;;
    pgbouncer:urls) b_urls ;;
    all:up) pg_up "$@"; b_up; g_up ;;
    all:down) b_down; g_down; pg_down ;;
    *) usage ;;
esac
