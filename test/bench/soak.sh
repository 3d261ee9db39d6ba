#!/usr/bin/env bash
#
# soak.sh — long run with random endpoint failures and one crash in the middle;
# checks the "nothing is lost" invariant over everything committed.
#
#   - a throwaway cluster with the extension's default settings (2 workers,
#     lease 60s, max_attempts 12, backoff 1s..5min, fsync on); only what the
#     soak needs is set (preload, a private socket, the database);
#   - the recording sink (test/sink/sink.py) on loopback as the endpoint,
#     scripted with fail_ratio 0.05 (answered 503) and delay_ratio 0.01
#     (+200 ms), seeded; it keeps per-id counters for every request but only
#     the last ~1,000 request bodies (--max-records);
#   - a producer commits SOAK_N messages (default 500,000) in transactions of
#     1,000 at a steady pace (SOAK_RATE msg/s, default 1,500) while the
#     workers deliver.  Each transaction also records its batch number in a
#     table of its own, so after a connection loss the producer knows whether
#     the batch in doubt committed and never commits one twice;
#   - at ~50% of the messages done, a worker with requests in flight
#     (outbox.worker_stats.in_flight > 0) is SIGKILLed: the postmaster
#     terminates every backend, reinitializes and restarts (crash recovery);
#     we wait for it to come back, and the producer reconnects and continues.
#     Messages claimed before the crash stay `processing` until their lease
#     (60 s) expires and are then claimed again;
#   - at the end we wait until nothing is pending or processing and check,
#     for every committed message: `done` and received by the sink at least
#     once, or `dead` with a reason (none is expected: 12 attempts against 5%
#     random failures); nothing pending/processing; the sink received no id
#     that was never committed.
#
# Printed: messages, done, dead, throughput, duplicates (2xx answers beyond
# the first per id, and all requests beyond the first per id), and every
# worker's VmRSS / RssAnon from /proc/<pid>/status: the pre-crash workers at
# ~10% of the messages done and just before the kill; the post-crash workers
# right after the restart, at ~60% and at the end — growth is measured within
# one process lifetime.  VmRSS includes the shared buffers a backend has
# touched, so it grows as a process touches more of them; RssAnon (private
# memory) is the figure to watch for leaks.
#
# Bounded: the run stops by itself after SOAK_TIMEOUT seconds (default 1800)
# with a failure.  Exit status 0 only when the invariant holds.
#
# Not part of CI.  Usage (root or postgres):
#   test/bench/soak.sh
#   SOAK_N=100000 SOAK_RATE=2000 test/bench/soak.sh
# Environment: SOAK_N, SOAK_RATE, SOAK_TIMEOUT, SOAK_SEED (sink's random
# seed, default 1), SOAK_CRASH (default 1; 0 = no crash), PORT (default 55433).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SOAK_N=${SOAK_N:-500000}
SOAK_RATE=${SOAK_RATE:-1500}
SOAK_TIMEOUT=${SOAK_TIMEOUT:-1800}
SOAK_SEED=${SOAK_SEED:-1}
SOAK_CRASH=${SOAK_CRASH:-1}
PORT=${PORT:-55433}
BATCH=1000

if [ "$(id -u)" = 0 ]; then
    "$ROOT/test/install_deps.sh" >/dev/null
    make -C "$ROOT" -s >/dev/null && make -C "$ROOT" -s install >/dev/null
    WORK=$(mktemp -d /tmp/od_soak.XXXXXX)
    # a copy of the scripts the postgres user can read (the clone may be under /root)
    mkdir -p "$WORK/src"
    tar -C "$ROOT" --exclude=.git -cf - test | tar -C "$WORK/src" -xf -
    chown -R postgres "$WORK"
    # the script stops by itself at SOAK_TIMEOUT; timeout(1) is the backstop
    exec timeout -k 30 $((SOAK_TIMEOUT + 60)) su postgres -s /bin/bash -c \
        "cd '$WORK' && OD_SOAK_WORK=$WORK SOAK_N=$SOAK_N SOAK_RATE=$SOAK_RATE SOAK_TIMEOUT=$SOAK_TIMEOUT SOAK_SEED=$SOAK_SEED SOAK_CRASH=$SOAK_CRASH PORT=$PORT bash '$WORK/src/test/bench/soak.sh'"
fi

WORK=${OD_SOAK_WORK:-$(mktemp -d /tmp/od_soak.XXXXXX)}
PGBIN=$(pg_config --bindir)
export PATH="$PGBIN:$PATH"
PY=/usr/bin/python3
T_START=$(date +%s)
DEADLINE=$((T_START + SOAK_TIMEOUT))
SINK_PID=""
PRODUCER_PID=""
cleanup() {
    [ -n "$PRODUCER_PID" ] && kill "$PRODUCER_PID" 2>/dev/null || true
    [ -n "$SINK_PID" ] && kill "$SINK_PID" 2>/dev/null || true
    pg_ctl -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true
    if [ "${KEEP:-0}" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'echo "soak: interrupted"; exit 124' TERM INT HUP

psql() { command psql -h "$WORK" -p "$PORT" -U postgres -d postgres -XAtq "$@"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
elapsed() { echo $(( $(date +%s) - T_START )); }
die() { echo "soak: FAILED: $*"; KEEP=1; exit 1; }
check_deadline() { [ "$(date +%s)" -lt "$DEADLINE" ] || die "hard timeout of ${SOAK_TIMEOUT}s reached ($*)"; }

# ---------------------------------------------------------------- sink
"$PY" "$ROOT/test/sink/sink.py" --port 0 --port-file "$WORK/sink.port" --max-records 1000 \
    --watch-pid $$ >"$WORK/sink.log" 2>&1 &
SINK_PID=$!
for _ in $(seq 1 100); do [ -s "$WORK/sink.port" ] && break; sleep 0.1; done
[ -s "$WORK/sink.port" ] || die "sink did not start"
SINK="http://127.0.0.1:$(cat "$WORK/sink.port")"
curl -sS --noproxy '*' -o /dev/null -d "{\"path\": \"/hook\", \"fail_ratio\": 0.05, \"fail_status\": 503,
    \"delay_ratio\": 0.01, \"delay_ratio_ms\": 200, \"seed\": $SOAK_SEED}" "$SINK/_control/script"

# ---------------------------------------------------------------- cluster
initdb -D "$WORK/data" -A trust -U postgres >/dev/null
cat >> "$WORK/data/postgresql.conf" <<EOF
shared_preload_libraries = 'outbox_dispatcher'
port = $PORT
listen_addresses = ''
unix_socket_directories = '$WORK'
restart_after_crash = on
EOF
pg_ctl -D "$WORK/data" -l "$WORK/log" -w start >/dev/null
psql -c "CREATE EXTENSION outbox_dispatcher"
psql -c "INSERT INTO outbox.endpoints (name, url) VALUES ('default', '$SINK/hook')"
psql -c "CREATE TABLE soak_batches (k int PRIMARY KEY, n int NOT NULL, committed_at timestamptz NOT NULL DEFAULT now())"
WORKERS=$(psql -c "SHOW outbox_dispatcher.workers")

echo "outbox_dispatcher soak"
echo "  machine: $(nproc) cores; PostgreSQL $(pg_config --version | awk '{print $2}'); workers=$WORKERS" \
     "batch_size=$(psql -c 'SHOW outbox_dispatcher.batch_size') lease=$(psql -c 'SHOW outbox_dispatcher.lease')" \
     "max_attempts=$(psql -c 'SHOW outbox_dispatcher.max_attempts') fsync=$(psql -c 'SHOW fsync')"
echo "  $SOAK_N messages in transactions of $BATCH at $SOAK_RATE msg/s; sink: 5% answered 503," \
     "1% delayed 200 ms (seed $SOAK_SEED); crash at ~50%: $([ "$SOAK_CRASH" = 1 ] && echo yes || echo no);" \
     "hard timeout ${SOAK_TIMEOUT}s"

# ---------------------------------------------------------------- producer
# Runs in the background.  Batch k holds the messages (k-1)*1000+1 .. k*1000
# (payload n); it is due at base + (k - k0) * 1000 / SOAK_RATE, where base and
# k0 are reset after a reconnect so the pace stays steady instead of catching up.
producer() {
    set +e
    local nb=$(( (SOAK_N + BATCH - 1) / BATCH )) k=1 k0=1 base lo hi due wait_ms reconnects=0 c
    base=$(now_ms)
    while [ "$k" -le "$nb" ]; do
        due=$(( base + (k - k0) * BATCH * 1000 / SOAK_RATE ))
        wait_ms=$(( due - $(now_ms) ))
        [ "$wait_ms" -gt 0 ] && sleep "$(printf '%d.%03d' $((wait_ms / 1000)) $((wait_ms % 1000)))"
        lo=$(( (k - 1) * BATCH + 1 )); hi=$(( k * BATCH )); [ "$hi" -gt "$SOAK_N" ] && hi=$SOAK_N
        if psql -v ON_ERROR_STOP=1 -c "BEGIN;
              INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload)
              SELECT 'order', g::text, 'OrderCreated',
                     jsonb_build_object('n', g, 'batch', $k, 'amount', g % 1000, 'note', repeat('x', 200))
                FROM generate_series($lo, $hi) g;
              INSERT INTO soak_batches (k, n) VALUES ($k, $hi - $lo + 1);
              COMMIT;" >/dev/null 2>>"$WORK/producer.err"; then
            k=$((k + 1))
        else
            # the server went away (crash restart): wait for it, then find out
            # whether the batch in doubt committed
            reconnects=$((reconnects + 1))
            while :; do
                c=$(psql -c "SELECT count(*) FROM soak_batches WHERE k = $k" 2>/dev/null) && break
                sleep 0.2
            done
            [ "$c" = 1 ] && k=$((k + 1))
            base=$(now_ms); k0=$k
        fi
        echo "$((k - 1)) $reconnects" > "$WORK/producer.progress.tmp"
        mv "$WORK/producer.progress.tmp" "$WORK/producer.progress"
    done
    touch "$WORK/producer.done"
}

# ---------------------------------------------------------------- monitoring helpers
worker_pids() { psql -c "SELECT string_agg(pid::text, ' ' ORDER BY worker) FROM outbox.worker_stats WHERE pid IS NOT NULL AND pid > 0" 2>/dev/null || true; }
rss_of() {   # pid -> "VmRSS kB / RssAnon kB"
    if [ -r "/proc/$1/status" ]; then
        awk '/^VmRSS:/ {r=$2} /^RssAnon:/ {a=$2} END {printf "VmRSS %6d kB  RssAnon %6d kB", r, a}' "/proc/$1/status"
    else
        echo "(gone)"
    fi
}
RSS_LINES=()
sample_rss() {   # label pids...
    local label=$1; shift
    for p in "$@"; do RSS_LINES+=("$(printf '  %-36s pid %-7s %s' "$label" "$p" "$(rss_of "$p")")"); done
}
counts() {   # -> "committed done dead pending processing"
    psql -F ' ' -c "SELECT (SELECT coalesce(sum(n), 0) FROM soak_batches),
                           count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'dead'),
                           count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'processing')
                      FROM outbox.messages" 2>/dev/null || echo ""
}
sink_stat() { curl -sS --noproxy '*' "$SINK/_control/stats" | "$PY" -c "import json,sys; j=json.load(sys.stdin); print($1)"; }

# ---------------------------------------------------------------- run
# workers must be up before the first message (they start after recovery)
for _ in $(seq 1 100); do [ -n "$(worker_pids)" ] && [ "$(worker_pids | wc -w)" = "$WORKERS" ] && break; sleep 0.1; done
T0=$(now_ms)
producer &
PRODUCER_PID=$!

phase=0          # 0: before 10%; 1: sampled 10%; 2: crashed and back; 3: sampled 60%
PIDS_OLD=""; PIDS_NEW=""; KILLED=""; KILLED_IN_FLIGHT=""; CRASH_AT=""; BACK_AFTER=""
last_print=0
while :; do
    check_deadline "waiting for delivery"
    c=$(counts)
    if [ -z "$c" ]; then sleep 0.2; continue; fi
    read -r committed done dead pending processing <<<"$c"
    if [ "$phase" = 0 ] && [ "$done" -ge $((SOAK_N / 10)) ]; then
        PIDS_OLD=$(worker_pids)
        sample_rss "$([ "$SOAK_CRASH" = 1 ] && echo "pre-crash workers" || echo "workers") at 10%" $PIDS_OLD
        phase=1
        [ "$SOAK_CRASH" = 1 ] || PIDS_NEW=$PIDS_OLD
    fi
    if [ "$phase" = 1 ] && [ "$SOAK_CRASH" = 1 ] && [ "$done" -ge $((SOAK_N / 2)) ]; then
        sample_rss "pre-crash workers before kill (50%)" $PIDS_OLD
        # kill a worker while it has requests in flight (wait up to 10 s for one)
        victim=""
        for _ in $(seq 1 400); do
            victim=$(psql -F ' ' -c "SELECT pid, in_flight FROM outbox.worker_stats
                                      WHERE pid > 0 AND in_flight > 0 ORDER BY in_flight DESC LIMIT 1" 2>/dev/null || true)
            [ -n "$victim" ] && break
            sleep 0.025
        done
        [ -n "$victim" ] || victim="${PIDS_OLD%% *} 0"
        read -r KILLED KILLED_IN_FLIGHT <<<"$victim"
        kill -KILL "$KILLED"
        t_kill=$(now_ms)
        CRASH_AT=$done
        echo "  $(elapsed)s: $done done: SIGKILL worker pid $KILLED ($KILLED_IN_FLIGHT requests in flight)"
        # the postmaster terminates every backend, reinitializes, restarts the workers
        while :; do
            check_deadline "waiting for the restart after the crash"
            sleep 0.1
            pids=$(worker_pids)
            [ -n "$pids" ] && [ "$(echo "$pids" | wc -w)" = "$WORKERS" ] || continue
            [[ " $pids " == *" $KILLED "* ]] && continue
            break
        done
        BACK_AFTER=$(( $(now_ms) - t_kill ))
        PIDS_NEW=$pids
        sample_rss "post-crash workers after restart" $PIDS_NEW
        echo "  $(elapsed)s: server back after ${BACK_AFTER} ms, new workers: $PIDS_NEW"
        phase=2
        continue
    fi
    if [ "$phase" = 2 ] && [ "$done" -ge $((SOAK_N * 6 / 10)) ]; then
        sample_rss "post-crash workers at 60%" $PIDS_NEW
        phase=3
    fi
    if [ $(( $(date +%s) - last_print )) -ge 10 ]; then
        last_print=$(date +%s)
        printf '  %4ds: committed %7d  done %7d  pending %6d  processing %4d  dead %d  sink requests %d\n' \
            "$(elapsed)" "$committed" "$done" "$pending" "$processing" "$dead" "$(sink_stat 'j["total"]')"
    fi
    if [ -e "$WORK/producer.done" ] && [ "$committed" = "$SOAK_N" ] && [ "$pending" = 0 ] && [ "$processing" = 0 ]; then
        break
    fi
    if ! kill -0 "$PRODUCER_PID" 2>/dev/null && [ ! -e "$WORK/producer.done" ]; then
        die "producer exited early: $(tail -3 "$WORK/producer.err" 2>/dev/null)"
    fi
    sleep 1
done
T1=$(now_ms)
wait "$PRODUCER_PID" 2>/dev/null || true
PRODUCER_PID=""
[ "$phase" -ge 1 ] || PIDS_NEW=$(worker_pids)
sample_rss "$([ "$SOAK_CRASH" = 1 ] && echo "post-crash workers" || echo "workers") at 100%" $PIDS_NEW

# ---------------------------------------------------------------- invariant
psql -F ' ' -c "SELECT id, status, length(coalesce(last_error, '')) FROM outbox.messages" > "$WORK/rows.txt"
curl -sS --noproxy '*' "$SINK/_control/ids?path=/hook" > "$WORK/ids.json"
curl -sS --noproxy '*' "$SINK/_control/ids?path=/hook&ok=1" > "$WORK/ids_ok.json"
curl -sS --noproxy '*' "$SINK/_control/stats?path=/hook" > "$WORK/stats.json"
read -r reconnects < <(awk '{print $2}' "$WORK/producer.progress")
first_commit=$(psql -c "SELECT extract(epoch FROM min(committed_at)) FROM soak_batches")
last_commit=$(psql -c "SELECT extract(epoch FROM max(committed_at)) FROM soak_batches")
batches=$(psql -c "SELECT count(*) || ' batches, ' || sum(n) || ' messages' FROM soak_batches")
crashed=$(grep -c 'terminating any other active server processes' "$WORK/log" || true)

set +e
"$PY" - "$WORK" "$SOAK_N" "$T0" "$T1" "$first_commit" "$last_commit" <<'EOF'
import json, sys
work, n_expected, t0, t1 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
first_commit, last_commit = float(sys.argv[5]), float(sys.argv[6])
ids = json.load(open(work + "/ids.json"))
ok_ids = json.load(open(work + "/ids_ok.json"))
stats = json.load(open(work + "/stats.json"))
counts = {"done": 0, "dead": 0, "pending": 0, "processing": 0}
lost, dead_no_reason, stuck, db_ids = [], [], [], set()
for line in open(work + "/rows.txt"):
    i, status, errlen = line.split()
    db_ids.add(i)
    counts[status] = counts.get(status, 0) + 1
    if status == "done":
        if ids.get(i, 0) < 1 or ok_ids.get(i, 0) < 1:
            lost.append(i)
    elif status == "dead":
        if int(errlen) == 0:
            dead_no_reason.append(i)
    else:
        stuck.append(i)
extra = [k for k in ids if k not in db_ids]
messages = len(db_ids)
dup_all = sum(c - 1 for c in ids.values() if c > 1)
dup_ok = sum(c - 1 for c in ok_ids.values() if c > 1)
secs = (t1 - t0) / 1000.0
print()
print("result")
print("  messages:    %d committed (expected %d)" % (messages, n_expected))
print("  done:        %d" % counts["done"])
print("  dead:        %d" % counts["dead"])
print("  pending/processing left: %d / %d" % (counts["pending"], counts["processing"]))
print("  throughput:  %.0f msg/s overall (%d messages, first commit -> all settled in %.1f s);"
      " producer committed for %.1f s" % (messages / secs, messages, secs, last_commit - first_commit))
print("  sink:        %d requests, %s, %d random 503s, %d random delays" % (
    stats["total"], ", ".join("%s: %d" % kv for kv in sorted(stats["by_status"].items())),
    stats["random_failures"], stats["random_delays"]))
print("  duplicates:  %d 2xx answers beyond the first per id (%d ids); %d requests beyond the first per id (all statuses)"
      % (dup_ok, sum(1 for c in ok_ids.values() if c > 1), dup_all))
problems = []
if messages != n_expected:
    problems.append("%d messages committed, expected %d" % (messages, n_expected))
if lost:
    problems.append("%d done but never answered 2xx by the sink (e.g. %s)" % (len(lost), ", ".join(lost[:10])))
if counts["dead"]:
    problems.append("%d dead (none expected with max_attempts 12 and 5%% failures)" % counts["dead"])
if dead_no_reason:
    problems.append("%d dead without last_error" % len(dead_no_reason))
if stuck:
    problems.append("%d still pending/processing" % len(stuck))
if extra:
    problems.append("sink received %d ids never committed (e.g. %s)" % (len(extra), ", ".join(extra[:10])))
if problems:
    print("  invariant:   VIOLATED")
    for p in problems:
        print("    - " + p)
    sys.exit(1)
print("  invariant:   holds (every committed message done and received at least once; nothing dead, pending or processing)")
EOF
rc=$?
set -e

echo "  producer:    $batches; reconnects after the crash: $reconnects"
if [ "$SOAK_CRASH" = 1 ]; then
    echo "  crash:       worker pid $KILLED SIGKILLed with $KILLED_IN_FLIGHT requests in flight at ~$CRASH_AT done;" \
         "postmaster crash restarts: $crashed; workers back after $BACK_AFTER ms"
fi
psql -F ' ' -c "SELECT '  worker ' || worker || ' (pid ' || pid || '; counters since the last server (re)start): claimed ' || claimed || ', delivered ' || delivered
                    || ', retried ' || retried || ', dead ' || dead || ', reaped ' || reaped || ', lost leases ' || lost_leases
                    || ', http p50 <= ' || latency_p50_ms || ' ms, p99 <= ' || latency_p99_ms || ' ms'
                  FROM outbox.worker_stats"
echo "  worker memory (/proc/<pid>/status):"
printf '%s\n' "${RSS_LINES[@]}"
[ "$rc" = 0 ] || die "invariant violated"
echo "soak: ok"
