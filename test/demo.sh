#!/usr/bin/env bash
#
# demo.sh — the main job in one command (`make demo`).
#
# Starts a throwaway PostgreSQL 15 cluster with outbox_dispatcher preloaded
# (default settings: 2 workers, batch 100), a local HTTP endpoint (the test
# sink, which records every request), creates an endpoint with a Standard
# Webhooks signing secret, and has a producer commit DEMO_N messages (default
# 20,000) in transactions of 500 while a live line shows the queue draining.
# Ends with a summary: delivered, throughput, latency (created_at -> done_at),
# what the endpoint received, and the dead letters if any.
#
# Run as root on a fresh Debian 12 machine: it installs what it needs,
# builds and installs the extension, then runs as the postgres user.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${DEMO_N:-20000}
PORT=${DEMO_PORT:-55433}

if [ "$(id -u)" = 0 ]; then
    "$ROOT/test/install_deps.sh"
    make -C "$ROOT" -s >/dev/null && make -C "$ROOT" -s install >/dev/null
    WORK=$(mktemp -d /tmp/od_demo.XXXXXX)
    # the postgres user may not be able to read the clone (e.g. under /root,
    # mode 0700): it runs a copy of the scripts in the work directory
    mkdir -p "$WORK/src"
    tar -C "$ROOT" --exclude=.git -cf - test | tar -C "$WORK/src" -xf -
    chown -R postgres "$WORK"
    exec su postgres -s /bin/bash -c "cd '$WORK' && OD_DEMO_WORK=$WORK DEMO_N=$N DEMO_PORT=$PORT bash '$WORK/src/test/demo.sh'"
fi

WORK=${OD_DEMO_WORK:-$(mktemp -d /tmp/od_demo.XXXXXX)}
export PATH="$(pg_config --bindir):$PATH"
SINK_PID=""
cleanup() {
    [ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
    pg_ctl -D "$WORK/data" -m fast stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "== starting a local HTTP endpoint (test/sink/sink.py)"
/usr/bin/python3 "$ROOT/test/sink/sink.py" --port 0 --port-file "$WORK/sink.port" >/dev/null 2>&1 &
SINK_PID=$!
for _ in $(seq 1 100); do [ -s "$WORK/sink.port" ] && break; sleep 0.1; done
SINK="http://127.0.0.1:$(cat "$WORK/sink.port")"

echo "== starting a throwaway cluster with shared_preload_libraries = 'outbox_dispatcher'"
initdb -D "$WORK/data" -A trust -U postgres >/dev/null
cat >> "$WORK/data/postgresql.conf" <<EOF
shared_preload_libraries = 'outbox_dispatcher'
port = $PORT
listen_addresses = ''
unix_socket_directories = '$WORK'
EOF
pg_ctl -D "$WORK/data" -l "$WORK/log" -w start >/dev/null
psql() { command psql -h "$WORK" -p "$PORT" -U postgres -d postgres -XAtq "$@"; }

psql <<EOF
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url, signing_secret, headers)
VALUES ('default', '$SINK/webhooks/orders', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
        '{"Authorization": "Bearer demo-token"}');
EOF
echo "   endpoint 'default' -> $SINK/webhooks/orders (signed)"
echo "== producing $N messages (transactions of 500) while the workers deliver them"

start=$(date +%s.%N)
(
    for ((off = 0; off < N; off += 500)); do
        n=$(( N - off < 500 ? N - off : 500 ))
        echo "BEGIN;
              INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
              SELECT 'order', (g % 997)::text, 'OrderPlaced',
                     jsonb_build_object('order_id', g, 'amount_cents', (g * 37) % 100000, 'currency', 'EUR')
                FROM generate_series($off + 1, $off + $n) AS g;
              COMMIT;
              SELECT pg_sleep(0.01);"
    done
) | psql >/dev/null &
PRODUCER=$!

prev=0; prev_t=$start
while :; do
    sleep 0.5
    line=$(psql -F ' ' -c "SELECT coalesce(sum(count) FILTER (WHERE status = 'pending'), 0),
                                  coalesce(sum(count) FILTER (WHERE status = 'processing'), 0),
                                  coalesce(sum(count) FILTER (WHERE status = 'done'), 0),
                                  coalesce(sum(count) FILTER (WHERE status = 'dead'), 0)
                             FROM outbox.queue_depth")
    read -r pending processing done dead <<<"$line"
    now=$(date +%s.%N)
    rate=$(echo "($done - $prev) / ($now - $prev_t)" | bc)
    prev=$done; prev_t=$now
    printf '\r   committed %6d  pending %6d  processing %4d  done %6d  dead %3d  %6d msg/s ' \
        "$((pending + processing + done + dead))" "$pending" "$processing" "$done" "$dead" "$rate"
    if ! kill -0 $PRODUCER 2>/dev/null && [ $((done + dead)) -ge "$N" ]; then break; fi
done
end=$(date +%s.%N)
echo

echo "== summary"
psql -F ' ' -c "SELECT count(*) FILTER (WHERE status = 'done'),
                       count(*) FILTER (WHERE status = 'dead'),
                       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - created_at)) * 1000)::numeric, 1),
                       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - created_at)) * 1000)::numeric, 1),
                       round(count(*) / extract(epoch FROM max(done_at) - min(created_at)))
                  FROM outbox.messages" | {
    read -r done dead p50 p99 rate
    echo "   delivered:        $done messages ($dead dead)"
    echo "   throughput:       $rate msg/s (first commit to last delivery; producer and workers ran together)"
    echo "   latency:          p50 $p50 ms, p99 $p99 ms (created_at -> done_at, i.e. until the endpoint's 2xx was recorded)"
}
curl -s "$SINK/_control/stats" | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
print("   endpoint saw:     %d requests, %d distinct Idempotency-Keys, %d duplicates" % (s["total"], s["distinct_ids"], s["duplicates"]))'
curl -s "$SINK/_control/requests?limit=1" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
print("   one request as received:")
for k, v in r["headers"].items():
    print("     %s: %s" % (k, v))
print("     (body) %s" % r["body"])'
echo "   workers:"
psql -F ' ' -c "SELECT '     worker ' || worker || ' (pid ' || pid || '): ' || delivered || ' delivered, http avg '
                       || round(latency_avg_ms::numeric, 2) || ' ms, lost leases ' || lost_leases
                  FROM outbox.worker_stats"
