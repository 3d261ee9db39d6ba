#!/usr/bin/env bash
#
# dispatch_bench.sh — end-to-end throughput and latency of the dispatcher.
#
#   1. drain: N messages (default 50,000, ~250-byte JSON payloads) are
#      committed while the workers are paused, then the workers are enabled
#      and we time until every message is done.  The endpoint is a local
#      nginx (Debian nginx-light) answering `return 200` over keep-alive.
#      Printed: msg/s by wall clock and by done_at (first..last done).
#   2. idle latency: with the workers idle, M single-message transactions
#      are committed one at a time (a pause between them), and the time from
#      the message's created_at (the start of its one-statement transaction,
#      so slightly before its commit: the figure errs high) to the request's
#      arrival at a recording sink (test/sink/sink.py, which stamps arrival
#      before doing anything else) is reported as p50/p90/p99/max.
#
# Everything runs on a throwaway cluster and throwaway nginx; nothing else on
# the machine is touched.  Settings are the extension's defaults unless
# overridden: WORKERS (default 4), BATCH, N, M, PORT.  The cluster runs with
# fsync = off and synchronous_commit = off so that what is measured is the
# dispatcher, not this machine's disk.
#
# Usage (root or postgres): test/bench/dispatch_bench.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORKERS=${WORKERS:-4}
N=${N:-50000}
M=${M:-200}
PORT=${PORT:-55432}
NGINX_PORT=${NGINX_PORT:-18181}
BATCH=${BATCH:-}

if [ "$(id -u)" = 0 ]; then
    "$ROOT/test/install_deps.sh" >/dev/null
    make -C "$ROOT" -s >/dev/null && make -C "$ROOT" -s install >/dev/null
    WORK=$(mktemp -d /tmp/od_bench.XXXXXX)
    # a copy of the scripts the postgres user can read (the clone may be under /root)
    mkdir -p "$WORK/src"
    tar -C "$ROOT" --exclude=.git -cf - test | tar -C "$WORK/src" -xf -
    chown -R postgres "$WORK"
    exec su postgres -s /bin/bash -c "cd '$WORK' && OD_BENCH_WORK=$WORK WORKERS=$WORKERS N=$N M=$M PORT=$PORT NGINX_PORT=$NGINX_PORT BATCH='$BATCH' bash '$WORK/src/test/bench/dispatch_bench.sh'"
fi

WORK=${OD_BENCH_WORK:-$(mktemp -d /tmp/od_bench.XXXXXX)}
PGBIN=$(pg_config --bindir)
export PATH="$PGBIN:$PATH"
SINK_PID=""
cleanup() {
    [ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    pg_ctl -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# ---------------------------------------------------------------- nginx
. "$ROOT/test/bench/nginx_sink.sh"
start_nginx "$WORK" "$NGINX_PORT"

# ---------------------------------------------------------------- sink for latency
/usr/bin/python3 "$ROOT/test/sink/sink.py" --port 0 --port-file "$WORK/sink.port" >/dev/null 2>&1 &
SINK_PID=$!
for _ in $(seq 1 100); do [ -s "$WORK/sink.port" ] && break; sleep 0.1; done
SINK_PORT=$(cat "$WORK/sink.port")

# ---------------------------------------------------------------- cluster
initdb -D "$WORK/data" -A trust -U postgres >/dev/null
cat >> "$WORK/data/postgresql.conf" <<EOF
shared_preload_libraries = 'outbox_dispatcher'
port = $PORT
listen_addresses = ''
unix_socket_directories = '$WORK'
fsync = off
synchronous_commit = off
outbox_dispatcher.workers = $WORKERS
outbox_dispatcher.enabled = off
EOF
[ -n "$BATCH" ] && echo "outbox_dispatcher.batch_size = $BATCH" >> "$WORK/data/postgresql.conf"
pg_ctl -D "$WORK/data" -l "$WORK/log" -w start >/dev/null
psql() { command psql -h "$WORK" -p "$PORT" -U postgres -d postgres -XAtq "$@"; }

psql -c "CREATE EXTENSION outbox_dispatcher"
psql -c "INSERT INTO outbox.endpoints (name, url) VALUES ('nginx', 'http://127.0.0.1:$NGINX_PORT/hook'), ('sink', 'http://127.0.0.1:$SINK_PORT/hook')"

echo "outbox_dispatcher dispatch benchmark"
echo "  machine: $(nproc) cores; PostgreSQL $(pg_config --version | awk '{print $2}'); workers=$WORKERS batch_size=$(psql -c 'SHOW outbox_dispatcher.batch_size')"

# ---------------------------------------------------------------- 1. drain
psql -c "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
         SELECT 'order', g::text, 'OrderCreated',
                jsonb_build_object('order_id', g, 'amount', g % 1000, 'note', repeat('x', 200)), 'nginx'
           FROM generate_series(1, $N) g"
psql -c "VACUUM ANALYZE outbox.messages"
start=$(date +%s.%N)
psql -c "ALTER SYSTEM SET outbox_dispatcher.enabled = on" -c "SELECT pg_reload_conf()" >/dev/null
while :; do
    left=$(psql -f "$ROOT/test/bench/drained.sql")
    [ "$left" = 0 ] && break
    sleep 0.05
done
end=$(date +%s.%N)
done_n=$(psql -c "SELECT count(*) FROM outbox.messages WHERE status = 'done'")
by_done=$(psql -c "SELECT round($N / extract(epoch FROM max(done_at) - min(done_at)))::int FROM outbox.messages")
wall=$(echo "$N / ($end - $start)" | bc)
echo "drain: $N messages to nginx, $done_n done"
echo "  wall clock:            $wall msg/s ($(echo "$end - $start" | bc | cut -c1-6) s)"
echo "  first..last done_at:   $by_done msg/s"
psql -F ' ' -c "SELECT '  worker ' || worker || ': delivered ' || delivered || ', http p50 <= ' || latency_p50_ms || ' ms, p99 <= ' || latency_p99_ms || ' ms, lost leases ' || lost_leases FROM outbox.worker_stats"

# ---------------------------------------------------------------- 2. idle latency
psql -c "TRUNCATE outbox.messages"
sleep 1.5   # let the workers go idle
# one producer session, one autocommitted INSERT every 20 ms
for i in $(seq 1 "$M"); do
    echo "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)
          VALUES ('order', '$i', 'OrderCreated', '{\"n\": $i}', 'sink');
          SELECT pg_sleep(0.02);"
done | psql >/dev/null
for _ in $(seq 1 100); do
    [ "$(psql -c "SELECT count(*) FROM outbox.messages WHERE status = 'done'")" = "$M" ] && break
    sleep 0.1
done
curl -s "http://127.0.0.1:$SINK_PORT/_control/requests?path=/hook" > "$WORK/requests.json"
psql -c "SELECT id, extract(epoch FROM created_at) FROM outbox.messages" > "$WORK/created.txt"
/usr/bin/python3 - "$WORK/requests.json" "$WORK/created.txt" <<'EOF'
import json, sys
reqs = json.load(open(sys.argv[1]))
created = {}
for line in open(sys.argv[2]):
    i, t = line.strip().split('|')
    created[i] = float(t)
lat = []
for r in reqs:
    key = r['headers_lc'].get('idempotency-key')
    if key in created:
        lat.append((r['t'] - created[key]) * 1000.0)
lat.sort()
def pct(p):
    return lat[min(len(lat) - 1, int(p * len(lat)))]
print("idle latency: %d single-message transactions, created_at -> arrival at the sink" % len(lat))
print("  p50 %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms" % (pct(0.5), pct(0.9), pct(0.99), lat[-1]))
EOF
