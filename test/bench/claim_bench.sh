#!/usr/bin/env bash
#
# claim_bench.sh — latency of one outbox.claim('bench', 100, '60 s') in a
# small queue (state A) and in a large one full of rows the claim must not
# look at (state B).  The contract says claim cost is proportional to the
# batch, not to retained done rows nor to future-scheduled rows: the target
# is B within 2x of A.
#
#   A) 2,500 ready rows (pending, available_at <= now()) and nothing else
#   B) 400,000 done + 50,000 future (available_at = now() + 1 day)
#      + 200,000 ready rows
#
# A and B live side by side in two databases (bench_a, bench_b) of one
# throwaway cluster, and their rollback loops run in alternating rounds, so
# that noise from whatever else runs on the machine hits both alike.
#
# Usage (root or postgres; as root it re-runs itself as postgres, since
# initdb refuses root):
#     test/bench/claim_bench.sh
# Environment:
#     BENCH_PORT       port of the throwaway cluster           (default 5498)
#     BENCH_PGBIN      PostgreSQL 15 binaries                  (default pg_config --bindir,
#                                                                else /usr/lib/postgresql/15/bin)
#     BENCH_ROUNDS     alternating A/B rounds                   (default 4)
#     BENCH_CHUNK      claims per rollback loop per round       (default 500)
#     BENCH_DRAIN_B    claims in the state-B drain loop         (default 1500 = 150,000 rows)
#     BENCH_SEED_ITER  executions of the seed article's query   (default 30)
#     BENCH_KEEP=1     keep the cluster directory (the server is stopped either way)
# Run time: about two minutes (2 CPUs).  The stale-generic-plan section alone takes ~30 s,
# most of it two claims that each scan the whole table under the cached plan.
#
# The throwaway cluster runs with fsync = off, full_page_writes = off and
# synchronous_commit = off.  That is a benchmark-only setting: it removes
# disk-flush noise from commits (only the drain loops commit), and it is never
# acceptable on a real server.  The dispatcher's own background workers are
# disabled (outbox_dispatcher.workers = 0, enabled = off) so that nothing but
# this script touches the rows.  Autovacuum stays on, with default settings,
# as in production.
#
# What is measured, and why two kinds of loop:
#
#   rollback loop  BEGIN; claim; ROLLBACK.  The queue is logically unchanged
#                  after each iteration, so every claim sees the same state:
#                  this is the steady-state cost of one claim in state A or B,
#                  the figure the A/B target is about.  It is not free of side
#                  effects: each iteration leaves 100 aborted row versions in
#                  the heap and in messages_pkey / messages_leased /
#                  messages_open (never in messages_ready: the new versions
#                  are 'processing').  In 2,500-row state A, 2,000 iterations
#                  would leave 80 dead versions per live row, so the loops run
#                  in chunks of BENCH_CHUNK with a VACUUM after each chunk.
#                  A rollback loop never commits: commit cost is excluded.
#   drain loop     claim (its own committed transaction), then mark_done of
#                  the 100 claimed rows in the following statement, as a
#                  worker does.  Done rows accumulate (B grows from 400,000 to
#                  550,000 done rows), and the messages_ready entries of every
#                  claimed row stay in the index, pointing at dead versions,
#                  until a VACUUM removes them: each claim walks over the
#                  entries of everything claimed since the last vacuum (cheaply
#                  once an earlier scan has marked them LP_DEAD, but one leaf
#                  page per ~400 of them).  That is the real cost of a busy
#                  queue, which a rollback loop never sees.  State A has only
#                  2,500 rows, so its drain loop is just 24 claims.
#
# Latency figures:
#   claim (server)  clock_timestamp() - statement_timestamp() at the end of the
#                   statement SELECT ... FROM outbox.claim(...), recorded for
#                   every iteration: parse + plan + reap + claim, no client
#                   round trip.  avg / p50 / p95 / max.
#   pgbench stmt    pgbench -r average latency of that statement (includes
#                   the client round trip).
#   txn p50/p95     pgbench --log per-script latency (BEGIN + claim + ROLLBACK
#                   + the bookkeeping INSERT, or claim + mark_done x100 +
#                   INSERT for the drain loops).
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SELF")/../.." && pwd)

if [ "$(id -u)" = 0 ]; then
    # initdb refuses root: re-run as postgres, passing the settings through,
    # from a copy the postgres user can read (the clone may be under /root).
    COPY=$(mktemp -d /tmp/od_claim_bench_src.XXXXXX)
    tar -C "$ROOT" --exclude=.git -cf - test | tar -C "$COPY" -xf -
    chown -R postgres "$COPY"
    SELF="$COPY/test/bench/claim_bench.sh"
    exec su postgres -s /bin/bash -c "cd /tmp && env \
        BENCH_PORT='${BENCH_PORT:-}' BENCH_PGBIN='${BENCH_PGBIN:-}' BENCH_ROUNDS='${BENCH_ROUNDS:-}' \
        BENCH_CHUNK='${BENCH_CHUNK:-}' BENCH_DRAIN_B='${BENCH_DRAIN_B:-}' \
        BENCH_SEED_ITER='${BENCH_SEED_ITER:-}' BENCH_KEEP='${BENCH_KEEP:-}' bash '$SELF'"
fi

PORT=${BENCH_PORT:-5498}
PGBIN=${BENCH_PGBIN:-$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)}
[ -x "$PGBIN/initdb" ] || PGBIN=/usr/lib/postgresql/15/bin
ROUNDS=${BENCH_ROUNDS:-4}
CHUNK=${BENCH_CHUNK:-500}
DRAIN_B=${BENCH_DRAIN_B:-1500}
SEED_ITER=${BENCH_SEED_ITER:-30}
export PATH="$PGBIN:$PATH"

TRANSITIONS="$ROOT/src/transitions.cpp"
[ -r "$TRANSITIONS" ] || { echo "cannot read $TRANSITIONS" >&2; exit 1; }

WORK=$(mktemp -d /tmp/claim_bench.XXXXXX)
DATA="$WORK/data"
cleanup() {
    if [ -f "$DATA/postmaster.pid" ]; then
        pg_ctl -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ -n "${BENCH_KEEP:-}" ]; then
        echo "cluster directory kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

T0=$(date +%s)
section() { printf '\n=== %s  [t+%ss]\n' "$*" "$(( $(date +%s) - T0 ))"; }

# ------------------------------------------------------------------ cluster
section "throwaway cluster on port $PORT in $WORK"
echo "machine: $(nproc) CPUs, $(uptime | sed 's/.*load/load/')"
initdb -D "$DATA" -A trust -U postgres --no-sync >/dev/null
cat >> "$DATA/postgresql.conf" <<EOF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$WORK'
shared_preload_libraries = 'outbox_dispatcher'
# benchmark only -- never on a real server: no durability
fsync = off
full_page_writes = off
synchronous_commit = off
shared_buffers = 512MB
max_wal_size = 4GB
# nothing but this script may touch the rows under test
outbox_dispatcher.workers = 0
outbox_dispatcher.enabled = off
EOF
pg_ctl -D "$DATA" -l "$WORK/server.log" -w start >/dev/null || { cat "$WORK/server.log"; exit 1; }
export PGHOST="$WORK" PGPORT="$PORT" PGUSER=postgres

psql_q() { local db=$1; shift; psql -X -q -v ON_ERROR_STOP=1 -d "$db" "$@"; }
for db in bench_a bench_b bench_c; do
    createdb "$db"
    psql_q "$db" <<'EOF'
CREATE EXTENSION outbox_dispatcher;
INSERT INTO outbox.endpoints (name, url) VALUES ('default', 'http://127.0.0.1:9/bench');
-- one row per measured claim, written by the pgbench scripts
CREATE UNLOGGED TABLE public.bench_lat (run text NOT NULL, n int NOT NULL, us bigint NOT NULL,
                                        seq bigserial);
EOF
done
echo "postgres $(psql_q bench_a -Atc 'SHOW server_version')," \
     "outbox_dispatcher $(psql_q bench_a -Atc "SELECT extversion FROM pg_extension WHERE extname = 'outbox_dispatcher'")"

# ------------------------------------------------------------------ the SQL under test
# SQL_CLAIM exactly as src/transitions.cpp prepares it for SPI.
extract_sql() {
    perl -0777 -ne '
        if (/\b'"$1"'\s*=\s*(.*?);\s*\n/s) {
            my ($b, $s) = ($1, "");
            while ($b =~ /"((?:[^"\\]|\\.)*)"/g) { $s .= $1 }
            $s =~ s/\\"/"/g; $s =~ s/\\\\/\\/g;
            print $s;
        }' "$TRANSITIONS"
}
CLAIM_SQL=$(extract_sql SQL_CLAIM)
[ -n "$CLAIM_SQL" ] || { echo "SQL_CLAIM not found in $TRANSITIONS" >&2; exit 1; }
# the same text with the parameters as literals, as claim('bench', 100, '60 s') binds them
CLAIM_SQL_LIT=$(printf '%s' "$CLAIM_SQL" | sed -e "s/\\\$1/'bench'::text/g" -e 's/\$2/100/g' \
                                                -e "s/\\\$3/interval '60 s'/g" -e 's/\$4/12/g' \
                                                -e 's/\$5/NULL::text[]/g' -e 's/\$6/NULL::integer[]/g')

# Candidate fix, tried here only: the UPDATE reaches the picked rows through the primary key
# whatever the row estimate, instead of joining the CTE (see the stale-generic-plan section).
CLAIM_SQL_ALT=$(printf '%s' "$CLAIM_SQL" |
                sed 's/FROM picked WHERE o\.id = picked\.id/WHERE o.id = ANY (ARRAY(SELECT id FROM picked))/')
[ "$CLAIM_SQL_ALT" != "$CLAIM_SQL" ] || echo "note: SQL_CLAIM already reaches the picked rows through ANY(ARRAY(...)); the variant is the same statement" >&2

# Section 3.2 of the seed article (outbox-dispatcher-lease-fencing.ja.md), with the table
# renamed to outbox.messages; max_attempts 12, batch 100, lease 60 s, owner 'bench'.
SEED_SQL="WITH picked AS (
    SELECT id
      FROM outbox.messages
     WHERE (status = 'pending'    AND available_at <= now())
        OR (status = 'processing' AND lease_until  <  now()
            AND attempts < 12)
     ORDER BY id
     LIMIT 100
       FOR UPDATE SKIP LOCKED
)
UPDATE outbox.messages AS o
   SET status        = 'processing',
       lease_owner   = 'bench',
       lease_until   = now() + interval '60 s',
       lease_version = o.lease_version + 1,
       attempts      = o.attempts + 1
  FROM picked
 WHERE o.id = picked.id
RETURNING o.id, o.lease_version, o.attempts, o.aggregate_id, o.event_type, o.payload"

ELAPSED="(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1e6)::bigint AS us"

# rollback loop: steady state, nothing committed but the latency row
cat > "$WORK/rollback.sql" <<EOF
BEGIN;
SELECT count(*) AS n, $ELAPSED FROM outbox.claim('bench', 100, '60 s') \gset
ROLLBACK;
INSERT INTO public.bench_lat (run, n, us) VALUES (current_setting('bench.run'), :n, :us);
EOF
# drain loop: the claim commits, then the claimed rows are marked done (fenced) in the next statement
cat > "$WORK/drain.sql" <<EOF
SELECT count(*) AS n, coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_version), '{}') AS vers, $ELAPSED FROM outbox.claim('bench', 100, '60 s') \gset
SELECT count(*) FILTER (WHERE outbox.mark_done(u.i, u.v)) AS marked
  FROM unnest(':ids'::bigint[], ':vers'::bigint[]) AS u(i, v) \gset
INSERT INTO public.bench_lat (run, n, us) VALUES (current_setting('bench.run'), :n, :us);
EOF
# bare statements (no function call, no reap), rolled back: seed article vs SQL_CLAIM
bare_script() {  # file sql
    { echo "BEGIN;"
      printf 'WITH claimed AS (%s) SELECT count(*) AS n, %s FROM claimed \\gset\n' \
             "$(printf '%s' "$2" | tr '\n' ' ')" "$ELAPSED"
      echo "ROLLBACK;"
      echo "INSERT INTO public.bench_lat (run, n, us) VALUES (current_setting('bench.run'), :n, :us);"
    } > "$1"
}
bare_script "$WORK/bare_claim.sql" "$CLAIM_SQL_LIT"
bare_script "$WORK/seed_claim.sql" "$SEED_SQL"

# ------------------------------------------------------------------ helpers
show_state() {  # db
    psql_q "$1" -P footer=off -c "
SELECT current_database() AS db,
       count(*) FILTER (WHERE status = 'pending' AND available_at <= now()) AS ready,
       count(*) FILTER (WHERE status = 'pending' AND available_at >  now()) AS future,
       count(*) FILTER (WHERE status = 'processing')                        AS processing,
       count(*) FILTER (WHERE status = 'done')                              AS done,
       count(*) FILTER (WHERE status = 'dead')                              AS dead,
       count(*)                                                             AS total,
       pg_size_pretty(pg_relation_size('outbox.messages'))                  AS heap,
       pg_size_pretty(pg_relation_size('outbox.messages_ready'))            AS ready_idx
  FROM outbox.messages"
}
vacuum() { psql_q "$1" -c "VACUUM ${2:-} outbox.messages"; }

# loop <db> <run> <script> <pgbench args...>: one pgbench session; rows go to <db>.bench_lat,
# the pgbench output and per-transaction log to $WORK (several calls per run accumulate)
declare -A NCALLS
loop() {
    local db=$1 run=$2 script=$3; shift 3
    local i=$(( ${NCALLS[$run]:-0} + 1 ))
    NCALLS[$run]=$i
    PGOPTIONS="-c bench.run=$run ${LOOP_PGOPTIONS:-}" \
        pgbench -n -M simple -c 1 -r --log --log-prefix="$WORK/log_${run}_$i" -f "$script" "$@" "$db" \
        > "$WORK/pgbench_${run}_$i.out" 2>&1 || { cat "$WORK/pgbench_${run}_$i.out"; exit 1; }
}

# summarize <db> <run>: one line of the result table; sets AVG/P50/P95[run]
declare -A AVG P50 P95
summarize() {
    local db=$1 run=$2 stmt p cnt rows avg p50 p95 max
    # pgbench -r: mean over the sessions of the claim statement's average latency
    stmt=$(cat "$WORK"/pgbench_"$run"_[0-9]*.out |
           awk '/SELECT count\(\*\) AS n,|WITH claimed AS/ { s += $1; n++ } END { if (n) printf "%.3f", s / n; else print "-" }')
    # pgbench --log: client_id transaction_no latency_us script_no epoch epoch_us
    p=$(cat "$WORK"/log_"$run"_[0-9]* | awk '{ print $3 }' | sort -n |
        awk '{ a[NR] = $1 } END { if (NR == 0) { print "- -"; exit }
              i50 = int(0.50 * NR + 0.999999); i95 = int(0.95 * NR + 0.999999);
              printf "%.3f %.3f", a[i50] / 1000, a[i95] / 1000 }')
    read -r cnt rows avg p50 p95 max < <(psql_q "$db" -At -F ' ' -c "
        SELECT count(*), round(avg(n), 1),
               round(avg(us) / 1000.0, 3),
               round((percentile_cont(0.5)  WITHIN GROUP (ORDER BY us) / 1000.0)::numeric, 3),
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY us) / 1000.0)::numeric, 3),
               round(max(us) / 1000.0, 3)
          FROM public.bench_lat WHERE run = '$run'")
    AVG[$run]=$avg; P50[$run]=$p50; P95[$run]=$p95
    # shellcheck disable=SC2086
    printf '%-20s %6s %6s | %8s %8s %8s %8s | %8s | %8s %8s\n' \
           "$run" "$cnt" "$rows" "$avg" "$p50" "$p95" "$max" "$stmt" $p | tee -a "$WORK/summary.txt"
}
table_header() {
    printf '%-20s %6s %6s | %-35s | %8s | %-17s\n' "" "" "rows/" "claim statement, server side (ms)" \
           "pgbench" "txn, pgbench log"
    printf '%-20s %6s %6s | %8s %8s %8s %8s | %8s | %8s %8s\n' \
           "run" "claims" "claim" "avg" "p50" "p95" "max" "stmt avg" "p50" "p95"
}
# trend <db> <run>: claim latency by tenths of the run, in execution order
trend() {
    psql_q "$1" -At -c "
        SELECT string_agg(to_char(a, 'FM990.000'), ' ' ORDER BY t)
          FROM (SELECT t, avg(us) / 1000.0 AS a
                  FROM (SELECT us, ntile(10) OVER (ORDER BY seq) AS t
                          FROM public.bench_lat WHERE run = '$2') s GROUP BY t) x" |
    sed "s/^/  $2: avg ms by tenths of the run: /"
}
ratio() { awk -v b="$1" -v a="$2" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "n/a" }'; }

# ------------------------------------------------------------------ populate
section "populating state A (bench_a) and state B (bench_b)"
psql_q bench_a <<'EOF'
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)
SELECT 'order', (g % 500)::text, 'order.created', jsonb_build_object('order', g, 'amount', g % 977),
       now() - interval '1 hour' + g * interval '1 s', now() - interval '1 hour' + g * interval '1 s'
  FROM generate_series(1, 2500) AS g;
EOF
# done rows are the oldest (lowest ids), as a retained history is; then the ready
# rows; the future-scheduled rows are the newest.
psql_q bench_b <<'EOF'
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, created_at,
                             status, available_at, attempts, lease_version, done_at, last_http_status)
SELECT 'order', (g % 50000)::text, 'order.created', jsonb_build_object('order', g, 'amount', g % 977),
       now() - interval '3 days' + g * interval '500 ms',
       'done', now() - interval '3 days' + g * interval '500 ms', 1, 1,
       now() - interval '3 days' + g * interval '500 ms' + interval '1 s', 200
  FROM generate_series(1, 400000) AS g;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)
SELECT 'order', (g % 50000)::text, 'order.created', jsonb_build_object('order', g, 'amount', g % 977),
       now() - interval '10 hours' + g * interval '100 ms', now() - interval '10 hours' + g * interval '100 ms'
  FROM generate_series(1, 200000) AS g;
INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)
SELECT 'order', (g % 50000)::text, 'order.reminder', jsonb_build_object('order', g),
       now(), now() + interval '1 day'
  FROM generate_series(1, 50000) AS g;
EOF
vacuum bench_a ANALYZE
vacuum bench_b ANALYZE
show_state bench_a
show_state bench_b

# ------------------------------------------------------------------ plans in state B
section "state B: EXPLAIN (ANALYZE, BUFFERS) of SQL_CLAIM from src/transitions.cpp, rolled back"
cat > "$WORK/explain.sql" <<EOF
PREPARE claim_stmt(text, integer, interval, integer, text[], integer[]) AS $CLAIM_SQL;
BEGIN;
SET LOCAL plan_cache_mode = force_custom_plan;
\\echo '--- custom plan: EXECUTE claim_stmt(''bench'', 100, ''60 s'', 12)'
EXPLAIN (ANALYZE, BUFFERS) EXECUTE claim_stmt('bench', 100, '60 s', 12, NULL, NULL);
ROLLBACK;
BEGIN;
SET LOCAL plan_cache_mode = force_generic_plan;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE claim_stmt('bench', 100, '60 s', 12, NULL, NULL) \\g $WORK/generic.txt
ROLLBACK;
EOF
psql_q bench_b -P pager=off -f "$WORK/explain.sql"
echo "--- generic plan of the same statement (what the plan cache could switch to), main nodes:"
grep -E 'Update on|CTE picked|Index Scan|Seq Scan|Sort|Hash|Planning Time|Execution Time' "$WORK/generic.txt" |
    sed 's/^/  /'

section "state B: which plan the SPI statement inside claim() uses (auto_explain, 7th call in a session)"
# SPI plans are kept per backend (SPI_keepplan): custom plans for the first 5 executions,
# then the generic plan if its estimated cost is not above the average custom plan's.
psql_q bench_b -P pager=off > "$WORK/auto_explain.txt" 2>&1 <<'EOF'
LOAD 'auto_explain';
SET auto_explain.log_min_duration = -1;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
BEGIN;
SELECT count(*) FROM outbox.claim('bench', 100, '60 s');
SELECT count(*) FROM outbox.claim('bench', 100, '60 s');
SELECT count(*) FROM outbox.claim('bench', 100, '60 s');
SELECT count(*) FROM outbox.claim('bench', 100, '60 s');
SELECT count(*) FROM outbox.claim('bench', 100, '60 s');
SELECT count(*) FROM outbox.claim('bench', 100, '60 s');
SET auto_explain.log_min_duration = 0;
SELECT count(*) FROM outbox.claim('bench', 100, '60 s');
ROLLBACK;
EOF
# look at plan lines only (the Query Text line shows $n either way)
if grep -E '^ +(->|Filter)' "$WORK/auto_explain.txt" | grep -q 'attempts < \$4'; then
    echo "  the 7th claim() ran the GENERIC plan of SQL_CLAIM (parameters shown as \$n)"
elif grep -E '^ +(->|Filter)' "$WORK/auto_explain.txt" | grep -q 'attempts < 12'; then
    echo "  the 7th claim() ran a CUSTOM plan of SQL_CLAIM (parameters bound as constants): the"
    echo "  generic plan's estimate (LIMIT \$2 taken as 10% of the rows) costs far more than the"
    echo "  custom plans, so the plan cache re-plans SQL_CLAIM on every call"
else
    echo "  could not tell which plan SQL_CLAIM used; auto_explain output:"; cat "$WORK/auto_explain.txt"
fi
awk '/duration:/ { d = $0 } /Query Text: WITH picked AS/ { sub(/^.*duration:/, "duration:", d); print "  SQL_CLAIM inside claim(): " d }' \
    "$WORK/auto_explain.txt"

section "state B: seed article's CLAIM_SQL (section 3.2: OR of pending/expired, ORDER BY id), rolled back"
psql_q bench_b -P pager=off <<EOF
BEGIN;
EXPLAIN (ANALYZE, BUFFERS) $SEED_SQL;
ROLLBACK;
EOF

# ------------------------------------------------------------------ rollback loops
section "rollback loops: $ROUNDS rounds of A, B, B with a forced generic plan ($CHUNK claims each, VACUUM between)"
for r in $(seq 1 "$ROUNDS"); do
    loop bench_a A_rollback "$WORK/rollback.sql" -t "$CHUNK";  vacuum bench_a
    loop bench_b B_rollback "$WORK/rollback.sql" -t "$CHUNK";  vacuum bench_b
    LOOP_PGOPTIONS="-c plan_cache_mode=force_generic_plan" \
        loop bench_b B_rollback_generic "$WORK/rollback.sql" -t "$CHUNK";  vacuum bench_b
    echo "  round $r done [t+$(( $(date +%s) - T0 ))s]"
done

section "state B: bare statements, rolled back: SQL_CLAIM with literal parameters vs the seed article's CLAIM_SQL"
loop bench_b B_bare_SQL_CLAIM "$WORK/bare_claim.sql" -t "$CHUNK";  vacuum bench_b
loop bench_b B_seed_CLAIM_SQL "$WORK/seed_claim.sql" -t "$SEED_ITER";  vacuum bench_b ANALYZE
show_state bench_b

# ------------------------------------------------------------------ drain loops
section "drain loops: claim + mark_done; A 24 claims, B $DRAIN_B claims (autovacuum on, defaults)"
loop bench_a A_drain "$WORK/drain.sql" -t 24
loop bench_b B_drain "$WORK/drain.sql" -t "$DRAIN_B"
trend bench_b B_drain
show_state bench_a
show_state bench_b
psql_q bench_b -At -c "
    SELECT '  outbox.messages in bench_b: ' || n_dead_tup || ' dead tuples now, '
           || autovacuum_count || ' autovacuum run(s) during the benchmark'
      FROM pg_stat_user_tables WHERE relid = 'outbox.messages'::regclass"

section "state B after the drain loop, before any manual VACUUM: the claim's walk over messages_ready"
cat > "$WORK/explain2.sql" <<EOF
PREPARE claim_stmt(text, integer, interval, integer, text[], integer[]) AS $CLAIM_SQL;
BEGIN;
SET LOCAL plan_cache_mode = force_custom_plan;
EXPLAIN (ANALYZE, BUFFERS) EXECUTE claim_stmt('bench', 100, '60 s', 12, NULL, NULL) \\g $WORK/after_drain.txt
ROLLBACK;
EOF
psql_q bench_b -f "$WORK/explain2.sql"
grep -A3 'Index Scan using messages_ready' "$WORK/after_drain.txt" | grep -E 'Index Scan|Buffers' | sed 's/^ */  /'
grep -E 'Execution Time' "$WORK/after_drain.txt" | sed 's/^ */  /'
vacuum bench_b
psql_q bench_b -f "$WORK/explain2.sql"
echo "  after VACUUM outbox.messages:"
grep -A3 'Index Scan using messages_ready' "$WORK/after_drain.txt" | grep -E 'Index Scan|Buffers' | sed 's/^ */  /'
grep -E 'Execution Time' "$WORK/after_drain.txt" | sed 's/^ */  /'

# ------------------------------------------------------------------ stale generic plan
section "stale generic plan: plans cached on an empty queue, then 400,000 done + 2,500 ready rows arrive"
# claim() keeps its SPI plans for the life of the backend (SPI_keepplan); a worker polls
# (claims) every poll_interval even when the queue is empty.  After 5 custom plans the
# plan cache compares costs; on an empty or small table the generic plan wins and stays
# cached until something invalidates it (ANALYZE or VACUUM of the table, DDL).  Built on
# an empty table it is all Seq Scans (+ Sort for the ready arm), and its UPDATE joins the
# picked ids to a Seq Scan of outbox.messages with a Nested Loop + Join Filter, i.e. every
# row of the table compared with every picked id (built on a small table it is a Hash
# Join over a Seq Scan; LIMIT $2 is estimated at 10% of the rows, not at the batch).
# Custom plans do not have the problem: the planner scales the row estimate to the
# table's current size even before ANALYZE.  Autovacuum is off on this table so that the
# window (normally until the next autovacuum/autoanalyze) stays open for the measurement.  PREPAREd statements go through the same plan cache as
# SPI plans, so SQL_CLAIM and two candidate fixes are measured the same way:
#   ANY(ARRAY)     UPDATE ... WHERE o.id = ANY (ARRAY(SELECT id FROM picked)) instead of the join
#   forced custom  plan_cache_mode = force_custom_plan, i.e. what SPI_prepare_cursor(...,
#                  CURSOR_OPT_CUSTOM_PLAN) would do for the SPI statement
cat > "$WORK/stale.sql" <<EOF
\set ON_ERROR_STOP 1
ALTER TABLE outbox.messages SET (autovacuum_enabled = off);
VACUUM ANALYZE outbox.messages;
PREPARE cur(text, integer, interval, integer, text[], integer[]) AS $CLAIM_SQL;
PREPARE alt(text, integer, interval, integer, text[], integer[]) AS $CLAIM_SQL_ALT;
LOAD 'auto_explain';
SET auto_explain.log_min_duration = -1;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_analyze = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
\o /dev/null
$(for i in 1 2 3 4 5 6; do
    echo "BEGIN; SELECT count(*) FROM outbox.claim('bench', 100, '60 s'); ROLLBACK;"
    echo "BEGIN; EXECUTE cur('bench', 100, '60 s', 12, NULL, NULL); ROLLBACK;"
    echo "BEGIN; EXECUTE alt('bench', 100, '60 s', 12, NULL, NULL); ROLLBACK;"
  done)
\o
$(for stage in "empty table, 7th execution (plans now cached)" \
               "402,500 rows, no ANALYZE yet: cached plans still in use" \
               "402,500 rows after ANALYZE (cached plans invalidated)"; do
    case $stage in
        402,500\ rows,\ no*)
            echo "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, created_at,"
            echo "                             status, available_at, attempts, lease_version, done_at, last_http_status)"
            echo "SELECT 'order', (g % 50000)::text, 'order.created', jsonb_build_object('order', g, 'amount', g % 977),"
            echo "       now() - interval '3 days' + g * interval '500 ms',"
            echo "       'done', now() - interval '3 days' + g * interval '500 ms', 1, 1,"
            echo "       now() - interval '3 days' + g * interval '500 ms' + interval '1 s', 200"
            echo "  FROM generate_series(1, 400000) AS g;"
            echo "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)"
            echo "SELECT 'order', (g % 500)::text, 'order.created', jsonb_build_object('order', g, 'amount', g % 977),"
            echo "       now() - interval '1 hour' + g * interval '1 s', now() - interval '1 hour' + g * interval '1 s'"
            echo "  FROM generate_series(1, 2500) AS g;" ;;
        *after\ ANALYZE*) echo "ANALYZE outbox.messages;" ;;
    esac
    echo "\\echo '### $stage'"
    echo "SET auto_explain.log_min_duration = 0;"
    echo "BEGIN; SELECT count(*) AS n, $ELAPSED FROM outbox.claim('bench', 100, '60 s') \\gset"
    echo "ROLLBACK;"
    echo "SET auto_explain.log_min_duration = -1;"
    echo "\\echo '### claim()' :us :n"
    echo "\\echo '### PREPAREd SQL_CLAIM'"
    echo "BEGIN; EXPLAIN (ANALYZE, COSTS OFF) EXECUTE cur('bench', 100, '60 s', 12, NULL, NULL); ROLLBACK;"
    echo "\\echo '### PREPAREd SQL_CLAIM with ANY(ARRAY)'"
    echo "BEGIN; EXPLAIN (ANALYZE, COSTS OFF) EXECUTE alt('bench', 100, '60 s', 12, NULL, NULL); ROLLBACK;"
    echo "\\echo '### PREPAREd SQL_CLAIM, forced custom'"
    echo "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan;"
    echo "EXPLAIN (ANALYZE, COSTS OFF) EXECUTE cur('bench', 100, '60 s', 12, NULL, NULL); ROLLBACK;"
  done)
EOF
psql_q bench_c -P pager=off -f "$WORK/stale.sql" > "$WORK/stale.out" 2>&1 || { cat "$WORK/stale.out"; exit 1; }
# condensed: for SQL_CLAIM inside claim() (auto_explain) and each EXPLAIN EXECUTE: generic or
# custom plan, how the ready arm and the UPDATE reach the rows, and the time
printf '    %-38s %-8s %-28s %-26s %s\n' "statement" "plan" "ready arm" "UPDATE finds the rows by" "time"
awk '
  function flush() {
      if (what != "") {
          if (pkey)          upd = "Index Scan messages_pkey"
          else if (jfilter)  upd = "Nested Loop over Seq Scan"
          else if (hcond)    upd = "Hash Join over Seq Scan"
          else if (seq)      upd = "Seq Scan, id = ANY filter"
          else               upd = "?"
          printf "    %-38s %-8s %-28s %-26s %s\n", what, kind, ready, upd, t
      }
      what = ""; kind = "custom"; ready = "?"; t = ""; pkey = jfilter = hcond = seq = 0
  }
  /^### claim\(\)/     { flush(); printf "    %-38s %-8s %-28s %-26s %.3f ms (%s rows)\n", "claim(), whole call", "", "", "", $3 / 1000.0, $4; next }
  /^### PREPAREd/      { flush(); what = $0; sub(/^### /, "", what); next }
  /^### /              { flush(); sub(/^### /, ""); print "  " $0; next }
  /Query Text: WITH picked AS/ { flush(); what = "SQL_CLAIM inside claim()"; next }
  /Query Text:/        { if (what ~ /inside/) flush(); next }
  /duration: /         { d = $0; sub(/^.*duration: /, "", d); sub(/ ms.*$/, " ms", d); dur = d }
  /(Filter|Cond).*\$[0-9]/ { kind = "GENERIC" }
  /Index Scan using messages_ready/ { ready = "Index Scan messages_ready" }
  /Seq Scan on messages m_1/        { ready = "Seq Scan + Sort" }
  /Seq Scan on messages o/          { seq = 1 }
  /Join Filter: \(o\.id = picked\.id\)/ { jfilter = 1 }
  /Hash Cond: .*(o\.id = picked\.id|picked\.id = o\.id)/ { hcond = 1 }
  /Index Scan using messages_pkey on messages o/ { pkey = 1 }
  /Update on messages o/ && what ~ /inside/ { t = dur }
  /Execution Time/     { t = $3 " ms" }
  END { flush() }
' "$WORK/stale.out" | tee "$WORK/stale_summary.txt"

# ------------------------------------------------------------------ summary
section "summary"
echo "state A: 2,500 ready rows | state B: 400,000 done + 50,000 future + 200,000 ready rows"
echo "(B_drain claims 150,000 of the ready rows, ending with 550,000 done)"
: > "$WORK/summary.txt"
table_header
summarize bench_a A_rollback
summarize bench_b B_rollback
summarize bench_b B_rollback_generic
summarize bench_b B_bare_SQL_CLAIM
summarize bench_b B_seed_CLAIM_SQL
summarize bench_a A_drain
summarize bench_b B_drain
echo
r_avg=$(ratio "${AVG[B_rollback]}" "${AVG[A_rollback]}")
r_p50=$(ratio "${P50[B_rollback]}" "${P50[A_rollback]}")
r_p95=$(ratio "${P95[B_rollback]}" "${P95[A_rollback]}")
printf 'B/A claim latency, rollback loops (steady state): avg %s, p50 %s, p95 %s\n' "$r_avg" "$r_p50" "$r_p95"
printf 'B/A claim latency, drain loops:                   avg %s, p50 %s, p95 %s\n' \
       "$(ratio "${AVG[B_drain]}" "${AVG[A_drain]}")" "$(ratio "${P50[B_drain]}" "${P50[A_drain]}")" \
       "$(ratio "${P95[B_drain]}" "${P95[A_drain]}")"
printf 'state B, forced generic / default (custom) plan, rollback loops: avg %s, p50 %s\n' \
       "$(ratio "${AVG[B_rollback_generic]}" "${AVG[B_rollback]}")" \
       "$(ratio "${P50[B_rollback_generic]}" "${P50[B_rollback]}")"
printf 'state B, seed CLAIM_SQL / SQL_CLAIM (bare statements): avg %s, p50 %s\n' \
       "$(ratio "${AVG[B_seed_CLAIM_SQL]}" "${AVG[B_bare_SQL_CLAIM]}")" \
       "$(ratio "${P50[B_seed_CLAIM_SQL]}" "${P50[B_bare_SQL_CLAIM]}")"
stale=$(awk '/claim\(\), whole call/ { print $4 }' "$WORK/stale_summary.txt" | xargs)
set -- $stale
printf 'stale generic plan (cached on an empty table), claim() whole call: empty %s ms; 402,500 rows before ANALYZE %s ms; after ANALYZE %s ms\n' \
       "${1:-?}" "${2:-?}" "${3:-?}"
if awk -v a="$r_avg" -v p="$r_p50" 'BEGIN { exit !(a != "n/a" && a <= 2.0 && p <= 2.0) }'; then
    echo "target (B within 2x of A, rollback loops, avg and p50): MET"
else
    echo "target (B within 2x of A, rollback loops, avg and p50): NOT MET"
fi
echo "machine at the end: $(uptime | sed 's/.*load/load/')"
echo "total run time: $(( $(date +%s) - T0 ))s"
