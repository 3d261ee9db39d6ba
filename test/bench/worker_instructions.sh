#!/usr/bin/env bash
#
# worker_instructions.sh — the instructions one dispatcher worker executes
# per delivered message, counted by valgrind --tool=callgrind: a figure
# that other work on this shared machine does not move (the same run gives
# the same count to within 0.3 %), for changes whose effect the timed
# benchmarks cannot separate from the machine's drift.
#
# A throwaway cluster is started under callgrind (every process is counted,
# each into its own file; one worker, autovacuum off), the worker delivers a
# 200-message warm-up (its plans are prepared on a small table, as in
# production), then N (2,500) ~250-byte unordered messages committed while
# it was paused, to one nginx worker answering `return 200` on loopback.
# Printed: the worker's instructions from its start to its exit, the WAL
# bytes per message of the drain (a CHECKPOINT before the insert, as in
# `make bench`), and,
# with N2 set, the marginal instructions per message between a run of N and
# one of N2 (the warm-up, start-up and shutdown cancel out).  TOGGLE=name*
# counts only inside the named function (e.g. TOGGLE='od_finalize*') and
# KEEP=1 keeps the callgrind file for callgrind_annotate.  Kernel time (system
# calls, the TCP stack) is not counted.
#
# RATE=r delivers the N messages as they come instead of as a backlog: the
# worker running, one pgbench client commits N/10 transactions of 10
# messages, r per second — the shape of the sustained-load scenario (a few
# messages per claim, a claim, finalize and attempt-log statement per
# cycle), at the pace of a worker slowed down ~50 times by callgrind (5 tx/s
# leaves it mostly idle between them).  The WAL figure then includes the
# producer's inserts and is not printed.  PER_TX=k (default 10) commits k
# messages per transaction instead: PER_TX=1 RATE=4 is the idle path, one
# wake, claim, request and finalize per message.
#
# Usage (root: installs valgrind and nginx if missing, builds and installs
# the extension, runs the cluster as postgres):
#     test/bench/worker_instructions.sh
#     N=500 N2=2500 test/bench/worker_instructions.sh
#     SQL="..." test/bench/worker_instructions.sh   (statements run after CREATE EXTENSION,
#                                                    before the warm-up, each in its own transaction)
# Run time: about a minute per run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
N=${N:-2500}
PER_TX=${PER_TX:-10}
PORT=${PORT:-5497}
NGINX_PORT=${NGINX_PORT:-18283}

[ "$(id -u)" = 0 ] || { echo "worker_instructions.sh: run as root" >&2; exit 1; }
command -v valgrind >/dev/null && command -v nginx >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind nginx-light >/dev/null
make -C "$ROOT" -s >/dev/null && make -C "$ROOT" -s install >/dev/null
PGBIN=$(pg_config --bindir)

WORK=$(mktemp -d /tmp/od_instr.XXXXXX)
chmod 755 "$WORK"
cleanup() {
    su postgres -c "$PGBIN/pg_ctl -D $WORK/data -m immediate stop" >/dev/null 2>&1 || true
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
. "$ROOT/test/bench/nginx_sink.sh"
start_nginx "$WORK" "$NGINX_PORT"

# one run of n messages: prints "<worker instructions> <WAL bytes per message>"
run() {
    local n=$1 out="$WORK/out.$1" P
    rm -rf "$WORK/data" "$out"
    mkdir -p "$WORK/data" "$out" "$WORK/sock"
    chown postgres "$WORK/data" "$out" "$WORK/sock"
    su postgres -c "$PGBIN/initdb -D $WORK/data -A trust -U postgres" >/dev/null
    cat >> "$WORK/data/postgresql.conf" <<CONF
shared_preload_libraries = 'outbox_dispatcher'
port = $PORT
listen_addresses = ''
unix_socket_directories = '$WORK/sock'
outbox_dispatcher.enabled = off
outbox_dispatcher.workers = 1
autovacuum = off
CONF
    su postgres -c "cd $out && valgrind --tool=callgrind ${TOGGLE:+--toggle-collect=$TOGGLE} \
        --callgrind-out-file=$out/cg.%p $PGBIN/postgres -D $WORK/data > $out/server.log 2>&1 &"
    P="$PGBIN/psql -h $WORK/sock -p $PORT -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1"
    for _ in $(seq 120); do $P -c 'SELECT 1' >/dev/null 2>&1 && break; sleep 1; done
    $P -c 'SELECT 1' >/dev/null || { echo "worker_instructions.sh: the server did not start: $out/server.log" >&2; exit 1; }
    $P -c 'CREATE EXTENSION outbox_dispatcher' \
       -c "INSERT INTO outbox.endpoints (name, url) VALUES ('nginx', 'http://127.0.0.1:$NGINX_PORT/hook')"
    # each statement of SQL in its own transaction (psql -f), so that VACUUM can be one of them
    [ -z "${SQL:-}" ] || printf '%s\n' "$SQL" | $P -f - >/dev/null
    insert() {
        $P -c "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
               SELECT 'order', hashint4(g + $2)::text, 'OrderCreated',
                      jsonb_build_object('order_id', g, 'amount', g % 1000, 'note', repeat('x', 200)), 'nginx'
                 FROM generate_series(1, $1) AS g"
    }
    enable() { $P -c "ALTER SYSTEM SET outbox_dispatcher.enabled = $1" -c 'SELECT pg_reload_conf()' >/dev/null; }
    drained() {
        for _ in $(seq 6000); do
            [ "$($P -f "$ROOT/test/bench/drained.sql")" = 0 ] && return 0
            sleep 0.2
        done
        echo "worker_instructions.sh: the drain did not finish" >&2
        return 1
    }
    insert 200 0
    enable on
    drained
    enable off
    sleep 2
    $P -c CHECKPOINT
    local worker l0 l1 wal
    if [ -n "${RATE:-}" ]; then
        enable on
        sleep 2
        worker=$($P -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'")
        l0=$($P -c 'SELECT pg_current_wal_insert_lsn()')
        cat > "$WORK/trickle.sql" <<SQL
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
SELECT 'order', md5(random()::text), 'OrderCreated',
       jsonb_build_object('order_id', g, 'amount', g % 1000, 'note', repeat('x', 200)), 'nginx'
  FROM generate_series(1, $PER_TX) AS g;
SQL
        chmod 644 "$WORK/trickle.sql"
        su postgres -c "$PGBIN/pgbench -h $WORK/sock -p $PORT -U postgres -n -c 1 -R $RATE -t $((n / PER_TX)) \
            -f $WORK/trickle.sql postgres" >/dev/null
    else
        insert "$n" 1000
        worker=$($P -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'")
        l0=$($P -c 'SELECT pg_current_wal_insert_lsn()')
        enable on
    fi
    drained
    l1=$($P -c 'SELECT pg_current_wal_insert_lsn()')
    wal=$($P -c "SELECT round(pg_wal_lsn_diff('$l1', '$l0') / $n)")
    su postgres -c "$PGBIN/pg_ctl -D $WORK/data -m fast stop" >/dev/null
    # pg_ctl returns when the postmaster is gone; its children under valgrind may
    # still be writing their files: wait for the worker's to be complete (its
    # totals line is written last) and for every process of this cluster to end,
    # so that neither the result nor the cleanup reads a file being written
    for _ in $(seq 600); do grep -qs '^totals: ' "$out/cg.$worker" && break; sleep 0.1; done
    for _ in $(seq 600); do pgrep -f "callgrind-out-file=$out/" >/dev/null || break; sleep 0.1; done
    grep -qs '^totals: ' "$out/cg.$worker" ||
        { echo "worker_instructions.sh: no totals in $out/cg.$worker" >&2; exit 1; }
    echo "$(sed -n 's/^totals: //p' "$out/cg.$worker") $wal"
    [ "${KEEP:-0}" = 1 ] && echo "callgrind file: $out/cg.$worker" >&2
    return 0
}

read -r i1 w1 < <(run "$N")
wal_text=", WAL $w1 B per message"
[ -z "${RATE:-}" ] || wal_text=""
echo "N=$N${RATE:+ (as they come: $RATE tx/s of $PER_TX)}: worker instructions $i1 ($((i1 / N)) per message, start-up and warm-up included)$wal_text${TOGGLE:+ (counted inside $TOGGLE only)}"
if [ -n "${N2:-}" ]; then
    read -r i2 w2 < <(run "$N2")
    wal_text=", WAL $w2 B per message"
    [ -z "${RATE:-}" ] || wal_text=" (as they come)"
    echo "N=$N2: worker instructions $i2$wal_text"
    echo "marginal: $(( (i2 - i1) / (N2 - N) )) instructions per message"
fi
