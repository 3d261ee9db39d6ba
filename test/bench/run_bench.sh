#!/usr/bin/env bash
#
# run_bench.sh — `make bench`: every performance scenario, 3 runs each
# (test/bench/bench.py).  Installs what it needs (as root), builds and
# installs the extension, runs the scenarios as the postgres user on
# throwaway clusters and a throwaway nginx, and writes results.md,
# results.json and plot.png into bench-results/ of the source tree.
#
#   make bench                 every scenario
#   SCENARIOS=fresh,idle RUNS=1 make bench
#   SCENARIOS=fanout,attempt_log N_FANOUT=10000 N_ATTEMPT=50000 make bench
#   SCENARIOS=scaling SCALE_WORKERS=2 SCALE_BATCHES=100,200,500 make bench
#                              the scaling scenario for other workers / batch sizes
#   BENCH_CONF="outbox_dispatcher.attempt_log=off" SCENARIOS=sustained make bench
#                              the same with a setting changed on every cluster
#   make bench-readme          put bench-results/results.md into the README
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT_DIR=${OUT_DIR:-$ROOT/bench-results}

if [ "$(id -u)" != 0 ]; then
    echo "run_bench.sh: run as root (it installs packages and switches to the postgres user)" >&2
    exit 1
fi
"$ROOT/test/install_deps.sh" >/dev/null
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-matplotlib >/dev/null
fi
make -C "$ROOT" -s >/dev/null && make -C "$ROOT" -s install >/dev/null

WORK=$(mktemp -d /tmp/od_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# a copy the postgres user can read (the clone may be under /root)
mkdir -p "$WORK/src"
tar -C "$ROOT" --exclude=.git --exclude=bench-results -cf - test outbox_dispatcher.control | tar -C "$WORK/src" -xf -
chown -R postgres "$WORK"
# the settings given (bench.py has the defaults and the list of scenarios)
PASS=()
for v in RUNS SCENARIOS N N_BACKLOG N_RETAINED N_REPL N_FANOUT N_ATTEMPT SUSTAIN_S SUSTAIN_PAIRS SUSTAIN_TPS \
    ACCRUE_S ACCRUE_TPS IDLE_M BENCH_CONF SCALE_WORKERS SCALE_BATCHES; do
    [ -n "${!v+set}" ] && PASS+=("$v=$(printf '%q' "${!v}")")
done
su postgres -s /bin/bash -c "cd '$WORK' && env OD_BENCH_WORK='$WORK' OD_BENCH_SRC='$WORK/src' OUT='$WORK/out' \
    ${PASS[*]} PATH='$(pg_config --bindir):/usr/sbin:/usr/bin:/bin' /usr/bin/python3 '$WORK/src/test/bench/bench.py'"
mkdir -p "$OUT_DIR"
cp "$WORK"/out/* "$OUT_DIR"/
echo "results: $OUT_DIR/results.md, $OUT_DIR/plot.png"
