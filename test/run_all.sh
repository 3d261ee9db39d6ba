#!/usr/bin/env bash
#
# Runs every test layer of outbox_dispatcher and ends with "N passed, N failed":
#   unit       GoogleTest binary for the pure C++ parts (src/core)
#   regress    pg_regress: test/regress/sql/*.sql against test/regress/expected/*.out (SQL API, errors)
#   isolation  isolationtester specs in test/isolation (races, SKIP LOCKED, fencing)
#   tap        PostgreSQL::Test::Cluster scripts in test/tap (dump/restore, workers)
#   monitoring promtool: docs/monitoring alert rules and their unit tests (test/monitoring)
#
# Run as root (CI, fresh machine): installs Debian packages, builds and
# installs the extension, then re-runs itself as the postgres user on a copy
# of the tree (initdb refuses root).  Run as any other user, it expects the
# extension to be installed already and only runs the tests.
#
# Environment: OD_TEST_PORT (default 54329) for the throwaway cluster used by
# pg_regress and isolation; OD_TEST_LAYERS (default "unit regress isolation tap
# monitoring");
# PG_MAJOR (default: the Debian release's; the matching server and
# pg_config are used; other majors run in a root file system, see
# test/pgversions.sh).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# the pg_config of the requested major, else the one on PATH
pick_pg_config() {
    if [ -n "${PG_MAJOR:-}" ] && [ -x "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" ]; then
        echo "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config"
    else
        command -v pg_config || echo /usr/lib/postgresql/15/bin/pg_config
    fi
}

if [ "$(id -u)" = 0 ] && [ -z "${OD_TEST_AS_POSTGRES:-}" ]; then
    "$ROOT/test/install_deps.sh" || { echo "installing the dependencies failed"; echo "0 passed, 1 failed"; exit 1; }
    PG_CONFIG=$(pick_pg_config)
    PGBIN=$("$PG_CONFIG" --bindir)
    make -C "$ROOT" -s -j2 PG_CONFIG="$PG_CONFIG" >/dev/null && make -C "$ROOT" -s install PG_CONFIG="$PG_CONFIG" >/dev/null ||
        { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }
    make -C "$ROOT" -s test/unit/unit_tests PG_CONFIG="$PG_CONFIG" >/dev/null ||
        { echo "unit test build failed"; echo "0 passed, 1 failed"; exit 1; }
    WORK=$(mktemp -d /tmp/outbox_tests.XXXXXX)
    tar -C "$ROOT" --exclude=.git -cf - . | tar -C "$WORK" -xf -
    chown -R postgres:postgres "$WORK"
    su postgres -s /bin/bash -c "cd '$WORK' && OD_TEST_AS_POSTGRES=1 OD_TEST_PORT='${OD_TEST_PORT:-}' OD_TEST_LAYERS='${OD_TEST_LAYERS:-}' OD_CROSS_DUMP='${OD_CROSS_DUMP:-}' PG_CONFIG='$PG_CONFIG' PATH='$PGBIN:$PATH' bash '$WORK/test/run_all.sh'"
    rc=$?
    [ $rc = 0 ] && rm -rf "$WORK" || echo "test artifacts kept in $WORK"
    exit $rc
fi

cd "$ROOT"
PG_CONFIG=${PG_CONFIG:-$(pick_pg_config)}
PGBIN=$("$PG_CONFIG" --bindir)
export PATH="$PGBIN:$PATH"
PORT=${OD_TEST_PORT:-54329}
LAYERS=${OD_TEST_LAYERS:-unit regress isolation tap monitoring}
PGXS_DIR=$(cd "$(dirname "$("$PG_CONFIG" --pgxs)")/../.." && pwd)
echo "== PostgreSQL $("$PG_CONFIG" --version | sed 's/^PostgreSQL //') ($PG_CONFIG)"
PG_REGRESS_BIN="$PGXS_DIR/src/test/regress/pg_regress"
PG_ISOLATION_BIN="$PGXS_DIR/src/test/isolation/pg_isolation_regress"
PERL_LIB="$PGXS_DIR/src/test/perl"

passed=0
failed=0
summary=()

count() {   # layer passed failed
    passed=$((passed + $2)); failed=$((failed + $3))
    summary+=("$(printf '%-10s %4d passed, %d failed' "$1" "$2" "$3")")
}

has_layer() { [[ " $LAYERS " == *" $1 "* ]]; }

# ------------------------------------------------------------------ unit
if has_layer unit; then
    echo "== unit (GoogleTest)"
    [ -x test/unit/unit_tests ] || make -s test/unit/unit_tests PG_CONFIG="$PG_CONFIG" >/dev/null
    ./test/unit/unit_tests --gtest_color=no > unit.log 2>&1
    rc=$?
    p=$(grep -c '^\[       OK \]' unit.log)
    f=$(grep -c '^\[  FAILED  \] [A-Za-z].*\.' unit.log)
    f=$(( f / 2 ))   # gtest lists each failed test twice (at run time and in the summary)
    [ $rc != 0 ] && [ "$f" = 0 ] && f=1
    [ "$f" != 0 ] && cat unit.log
    echo "   $p passed, $f failed"
    count unit "$p" "$f"
fi

# ------------------------------------------------------------------ throwaway cluster
CLUSTER=""
stop_cluster() { [ -n "$CLUSTER" ] && pg_ctl -D "$CLUSTER/data" -m immediate -w stop >/dev/null 2>&1; }
trap stop_cluster EXIT

if has_layer regress || has_layer isolation; then
    CLUSTER=$(mktemp -d /tmp/outbox_cluster.XXXXXX)
    initdb -D "$CLUSTER/data" -A trust -U postgres >/dev/null || exit 1
    cat >> "$CLUSTER/data/postgresql.conf" <<EOC
shared_preload_libraries = 'outbox_dispatcher'
port = $PORT
listen_addresses = ''
unix_socket_directories = '$CLUSTER'
fsync = off
max_prepared_transactions = 10
EOC
    pg_ctl -D "$CLUSTER/data" -l "$CLUSTER/log" -w start >/dev/null || { cat "$CLUSTER/log"; exit 1; }
fi

run_pg_regress() {  # layer bin outdir inputdir tests...
    local layer=$1 bin=$2 out=$3 in=$4; shift 4
    rm -rf "$out"; mkdir -p "$out"
    local rc p f
    "$bin" --host="$CLUSTER" --port="$PORT" --bindir="$PGBIN" --inputdir="$in" --outputdir="$out" \
        "$@" > "$out/run.log" 2>&1
    rc=$?
    cat "$out/run.log"
    # PostgreSQL 15: "test name ... ok"; 16 and later: TAP-style "ok 1 - name" / "not ok 2 - name"
    p=$(grep -cE '\.\.\. ok( |$)|^ok [0-9]+ ' "$out/run.log")
    f=$(grep -cE '\.\.\. FAILED|^not ok [0-9]+ ' "$out/run.log")
    [ $rc != 0 ] && [ "$f" = 0 ] && f=1   # pg_regress itself failed (e.g. aborted)
    [ "$f" != 0 ] && [ -f "$out/regression.diffs" ] && cat "$out/regression.diffs"
    count "$layer" "$p" "$f"
}

if has_layer regress; then
    echo "== regress (pg_regress)"
    tests=$(make -s print-regress PG_CONFIG="$PG_CONFIG")
    run_pg_regress regress "$PG_REGRESS_BIN" "$ROOT/results" "$ROOT/test/regress" --dbname=contrib_regression $tests
fi

if has_layer isolation; then
    echo "== isolation (isolationtester)"
    specs=$(grep -v '^\s*#' test/isolation/specs.list | xargs)
    run_pg_regress isolation "$PG_ISOLATION_BIN" "$ROOT/output_iso" "$ROOT/test/isolation" \
        --dbname=isolation_regression $specs
fi

stop_cluster; CLUSTER=""

# ------------------------------------------------------------------ TAP
if has_layer tap; then
    echo "== tap (PostgreSQL::Test::Cluster)"
    export PG_REGRESS="$PG_REGRESS_BIN"
    p=0; f=0
    # the tests' HTTP sink first: its scripted modes, control API and recorded fields
    mkdir -p tmp_check
    if bash test/sink/selftest.sh > tmp_check/sink_selftest.log 2>&1; then
        p=$((p + 1)); echo "   test/sink/selftest.sh: ok"
    else
        f=$((f + 1)); echo "   test/sink/selftest.sh: FAILED"; cat tmp_check/sink_selftest.log
    fi
    for t in test/tap/*.pl; do
        [ -e "$t" ] || continue
        log="tmp_check/$(basename "$t" .pl).log"
        mkdir -p tmp_check
        perl -I "$PERL_LIB" -I test/tap "$t" > "$log" 2>&1
        rc=$?
        tp=$(grep -cE '^ok [0-9]+' "$log")
        tf=$(grep -E '^not ok [0-9]+' "$log" | grep -cv '# TODO')   # TODO tests are expected to fail
        [ $rc != 0 ] && [ "$tf" = 0 ] && tf=1
        echo "   $t: $tp passed, $tf failed"
        [ "$tf" != 0 ] && { tail -n 60 "$log"; ls tmp_check/log 2>/dev/null; }
        p=$((p + tp)); f=$((f + tf))
    done
    count tap "$p" "$f"
fi

# ------------------------------------------------------------------ monitoring
# promtool on docs/monitoring/: the alert rules load (check rules); every
# alert has a test case that fires and one with "exp_alerts: []"; each test
# of test/monitoring/outbox_alerts_test.yml passes (test rules), one result
# per test: the file is cut at its "  - name:" lines into one file per test
# (promtool 2.42, bookworm's, has no --run).  The exporter queries are
# checked by test/tap/064_exporter.pl (tap layer).
if has_layer monitoring; then
    echo "== monitoring (promtool)"
    p=0; f=0
    mon_dir="$ROOT/tmp_check/monitoring"
    rm -rf "$mon_dir"; mkdir -p "$mon_dir"
    mon_result() {  # rc what [log]
        if [ "$1" = 0 ]; then
            p=$((p + 1)); echo "   ok: $2"
        else
            f=$((f + 1)); echo "   FAILED: $2"
            [ -n "${3:-}" ] && sed 's/^/      /' "$3"
        fi
    }
    mon_rules=docs/monitoring/outbox_alerts.rules.yml
    mon_tests=test/monitoring/outbox_alerts_test.yml
    if ! command -v promtool >/dev/null; then
        mon_result 1 "promtool not found (Debian: prometheus on bookworm, promtool from trixie on; test/install_deps.sh)"
    else
        echo "   $(promtool --version 2>&1 | head -n 1)"
        promtool check rules "$mon_rules" > "$mon_dir/check_rules.log" 2>&1
        mon_result $? "promtool check rules $mon_rules" "$mon_dir/check_rules.log"

        # every alert: a case that fires, a case that does not
        awk 'FNR == NR { if ($1 == "-" && $2 == "alert:") alerts[++n] = $3; next }
             $1 == "alertname:" { cur = $2 }
             $1 == "exp_alerts:" { if ($2 == "[]") quiet[cur] = 1; else fires[cur] = 1 }
             END {
                 bad = (n == 0)
                 if (n == 0) print "no alert found in the rules file"
                 for (i = 1; i <= n; i++) {
                     if (!(alerts[i] in fires)) { print alerts[i] ": no test case where it fires"; bad = 1 }
                     if (!(alerts[i] in quiet)) { print alerts[i] ": no test case where it must not fire"; bad = 1 }
                 }
                 exit bad
             }' "$mon_rules" "$mon_tests" > "$mon_dir/coverage.log" 2>&1
        mon_result $? "every alert of $mon_rules has a firing and a quiet test case" "$mon_dir/coverage.log"

        # one file per test: the header (rule_files made absolute) and the test
        mon_base=$(cd "$(dirname "$mon_tests")" && pwd)
        awk -v dir="$mon_dir" -v base="$mon_base" '
            /^[^ #]/ { section = $1 }
            !started && section == "rule_files:" && /^  - / && $2 !~ /^\// { sub(/- /, "- " base "/") }
            /^  - name: / && section == "tests:" {
                started = 1; n++; file = sprintf("%s/test_%02d.yml", dir, n)
                name = $0; sub(/^  - name: */, "", name); gsub(/^["\047]|["\047]$/, "", name)
                print name > (dir "/test_" sprintf("%02d", n) ".name")
                printf "%s%s", header, comments > file
                comments = ""
            }
            !started { header = header $0 "\n"; next }
            /^ *#/ || /^ *$/ { comments = comments $0 "\n"; next }   # goes with what follows
            { printf "%s", comments > file; comments = ""; print > file }
        ' "$mon_tests"
        mon_n=0
        for t in "$mon_dir"/test_*.yml; do
            [ -e "$t" ] || continue
            mon_n=$((mon_n + 1))
            promtool test rules "$t" > "${t%.yml}.log" 2>&1
            mon_result $? "promtool test rules: $(cat "${t%.yml}.name")" "${t%.yml}.log"
        done
        [ "$mon_n" = 0 ] && mon_result 1 "no test found in $mon_tests"
    fi
    count monitoring "$p" "$f"
fi

echo
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
