#!/usr/bin/env bash
# The issue-34 baseline: how today's code rides through the database's own faults, measured on
# the topologies of ci/ha.sh. Writes one JSON (or text) file per measurement under OUT and prints
# a one-line summary of each. Run it again after a fix and compare.
#
#   ci/ha-baseline.sh launch  [TRIES]   `dbcluster launch --detach` issued around a 5 s restart
#                                       (LAUNCH_FROM: the first try's offset, default -1.6 s)
#   ci/ha-baseline.sh restart [SEEDS]   restart-only chaos (3 restarts each), seeds 1..SEEDS
#   ci/ha-baseline.sh crash   [SEEDS]   crash-only chaos (kill -9 of the postmaster)
#   ci/ha-baseline.sh switchover [MODE] switchover chaos over the multi-host URL (async|sync)
#   ci/ha-baseline.sh galera  [RUNS]    Galera chaos with node kills, workers on all three nodes
#
# Needs the topology up (ci/ha.sh pg up / galera up) and the project installed (dbcluster on
# PATH). OUT defaults to /tmp/dbcluster-ha-baseline. CHAOS_ARGS adds options to every chaos run
# (e.g. "--node-env DBCLUSTER_UNREACHABLE_THRESHOLD=10000 --node-env
# DBCLUSTER_CLEANUP_THRESHOLD=20000": thresholds above the outage), TAG names such a series.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dbcluster-ha-baseline}
mkdir -p "$OUT"
HA=ci/ha.sh
APP=dbcluster.testing.app:chaos_registry
eval "$($HA pg urls 2>/dev/null || true)"

fresh_pg_db() {  # fresh_pg_db NAME: an empty database on the pair's primary
    local port
    port=$(sed -E 's|.*127\.0\.0\.1:([0-9]+)/.*|\1|' <<<"$HA_PG_PRIMARY_URL")
    psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -XqAc "DROP DATABASE IF EXISTS $1 WITH (FORCE)"
    psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -XqAc "CREATE DATABASE $1"
}

summarize() {  # summarize FILE: one line from a chaos JSON summary
    python3 - "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
inv = s["invariants"]
print(
    f"{sys.argv[1]}: ok={s['ok']} faults={s['faults_by_kind']} "
    f"first_execution={'held' if inv['first_execution']['held'] else inv['first_execution']['violations']} "
    f"dup={s['duplicate_non_transferable_effects']} lost={s['lost_partitions']} "
    f"stuck={s['stuck_jobs']} restarts={s['job_restarts']} relaunches={s['relaunches_before_start']} "
    f"launch_exits={s['launch_exit_codes']} errors={s['logs']['errors']} "
    f"tracebacks={s['logs']['tracebacks']} per_outage={s['logs'].get('errors_per_outage')}/"
    f"{s['logs'].get('tracebacks_per_outage')} top={[t['message'] for t in s['logs']['top_errors'][:4]]}"
)
EOF
}

# CHAOS_ARGS: more options for every chaos run (e.g. --node-env settings); TAG: a suffix for the
# result files' names.
chaos_run() {  # chaos_run NAME ARGS...: one chaos run, its JSON in OUT/NAME.json
    local name=$1${TAG:+-$TAG}; shift
    # shellcheck disable=SC2086 # CHAOS_ARGS is a list of options
    set -- "$@" ${CHAOS_ARGS:-}
    local work="$OUT/$name.work"
    rm -rf "$work"
    set +e
    dbcluster chaos --json --workdir "$work" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
    local rc=$?
    set -e
    echo "exit $rc" >>"$OUT/$name.err"
    summarize "$OUT/$name.json" || tail -5 "$OUT/$name.err"
}

launch_probe() {
    local tries=${1:-10} db=hb_launch url
    fresh_pg_db "$db"
    url="${HA_PG_PRIMARY_URL%/test}/$db"
    dbcluster init --url "$url" >/dev/null
    # The test application's own tables (its jobs write a ledger).
    python3 -c 'import sys; from dbcluster.dialects import make_engine; from dbcluster.testing.app import ledger_metadata; ledger_metadata.create_all(make_engine(sys.argv[1]))' "$url"
    : >"$OUT/launch.txt"
    for i in $(seq 0 $((tries - 1))); do
        # The launch starts OFFSET s after the restart begins (negative: before it), from
        # LAUNCH_FROM (default -1.6) in steps of 0.2 s: a Python command needs about a second
        # before it connects, so these land in its schema check, in the server's shutdown, and
        # while it is down.
        local offset rc
        offset=$(awk -v i="$i" -v f="${LAUNCH_FROM:--1.6}" 'BEGIN { printf "%.1f", f + (i % 10) * 0.2 }')
        set +e
        if awk -v o="$offset" 'BEGIN { exit !(o < 0) }'; then
            dbcluster launch --detach --json --url "$url" --app "$APP" ledger "probe=$i" \
                "n(int)=$i" "delay_ms(int)=100" >"$OUT/launch-$i.out" 2>"$OUT/launch-$i.err" &
            local launcher=$!
            sleep "${offset#-}"
            $HA pg restart 5 >/dev/null 2>"$OUT/launch-restart-$i.err" &
            local restart=$!
            wait "$launcher"
            rc=$?
        else
            $HA pg restart 5 >/dev/null 2>"$OUT/launch-restart-$i.err" &
            local restart=$!
            sleep "$offset"
            dbcluster launch --detach --json --url "$url" --app "$APP" ledger "probe=$i" \
                "n(int)=$i" "delay_ms(int)=100" >"$OUT/launch-$i.out" 2>"$OUT/launch-$i.err"
            rc=$?
        fi
        set -e
        wait "$restart"
        local tb=no
        if grep -q "Traceback" "$OUT/launch-$i.err"; then tb=yes; fi
        local last
        last=$({ grep -v '^\s*$' "$OUT/launch-$i.err" || true; } | tail -n 1 | cut -c1-200)
        echo "try $i offset ${offset}s: exit $rc traceback=$tb last: $last" | tee -a "$OUT/launch.txt"
        # A detached master that did start: end it by its pid (it runs the small job to its end).
        local pid
        pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("pid", ""))' \
            "$OUT/launch-$i.out" 2>/dev/null || true)
        if [[ -n $pid ]]; then
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
}

case ${1:-} in
    launch) launch_probe "${2:-10}" ;;
    restart | crash)
        kind=$1
        for seed in $(seq 1 "${2:-3}"); do
            db="hb_${kind}_$seed"
            fresh_pg_db "$db"
            if [[ $kind == restart ]]; then
                control=(--kinds dbrestart --db-restart "$HA pg restart 3")
            else
                control=(--kinds dbcrash --db-crash "$HA pg crash 3")
            fi
            chaos_run "$kind-$seed" --url "${HA_PG_PRIMARY_URL%/test}/$db" --nodes 3 --jobs 5 \
                --faults 3 --seed "$seed" "${control[@]}"
        done
        ;;
    switchover)
        mode=${2:-async}
        $HA pg up "--$mode" >/dev/null
        eval "$($HA pg urls)"
        db="hb_switchover_$mode"
        fresh_pg_db "$db"
        chaos_run "switchover-$mode" --url "${HA_PG_PAIR_URL/\/test?//$db?}" --nodes 3 --jobs 5 \
            --faults 2 --seed 1 --kinds switchover --db-switchover "$HA pg switchover --rebuild"
        ;;
    galera)
        eval "$($HA galera urls)"
        for run in $(seq 1 "${2:-2}"); do
            db="hb_galera_$run"
            mariadb -h 127.0.0.1 -P "$(sed -E 's|.*:([0-9]+)/.*|\1|' <<<"$HA_GALERA_URL_1")" -uroot \
                -e "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db"
            chaos_run "galera-$run" --url "${HA_GALERA_URL_1%/test}/$db" \
                --url "${HA_GALERA_URL_2%/test}/$db" --url "${HA_GALERA_URL_3%/test}/$db" \
                --nodes 3 --jobs 5 --faults 2 --seed "$run" --kinds galera-kill \
                --db-kill "$HA galera kill {node}" --db-rejoin "$HA galera rejoin {node}"
        done
        ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
