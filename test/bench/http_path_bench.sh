#!/usr/bin/env bash
#
# http_path_bench.sh — the cost of the dispatcher's HTTP path alone (request
# headers, signatures, libcurl) per delivery, without PostgreSQL: builds
# test/bench/http_path (from src/core), starts one nginx worker answering
# `return 200` over keep-alive on loopback, and runs RUNS (3) times
# N (20,000) signed deliveries of ~250 bytes, BATCH (100) at a time,
# printing requests/s and CPU microseconds per request of the sending
# process; each run once through the engine as the workers use it (MODE
# engine: plain http:// over its own HTTP/1.1 transport), once through the
# engine with every request a libcurl transfer (MODE curl: what https://
# and proxied requests cost) and once as MODE framing (the same requests
# written and read by src/core/http1.cpp over plain sockets opened first:
# the floor of the own transport).  CALLGRIND=1 adds one run of each under valgrind
# --tool=callgrind (N_CALLGRIND, 5,000 deliveries): instructions per
# request, which other work on the machine does not move, and the top
# functions.
#
# Usage: test/bench/http_path_bench.sh   (installs nginx and valgrind if missing, as root)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RUNS=${RUNS:-3}
N=${N:-20000}
BATCH=${BATCH:-100}
N_CALLGRIND=${N_CALLGRIND:-5000}
PORT=${NGINX_PORT:-18282}

if ! command -v nginx >/dev/null || { [ "${CALLGRIND:-0}" = 1 ] && ! command -v valgrind >/dev/null; }; then
    [ "$(id -u)" = 0 ] || { echo "http_path_bench: needs nginx (and valgrind for CALLGRIND=1): run as root once" >&2; exit 1; }
    apt-get install -y -q nginx-light valgrind >/dev/null
fi
WORK=$(mktemp -d /tmp/od_http_bench.XXXXXX)
cleanup() {
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

g++ -std=c++17 -O2 -g -I"$ROOT/src" -o "$WORK/http_path" "$ROOT/test/bench/http_path.cpp" \
    $(ls "$ROOT"/src/core/*.cpp) -lcurl -lcrypto

. "$ROOT/test/bench/nginx_sink.sh"
start_nginx "$WORK" "$PORT"

echo "http_path: $N signed deliveries, batch $BATCH, $(nproc) cores, $(curl-config --version 2>/dev/null || echo libcurl)"
for i in $(seq "$RUNS"); do
    for mode in engine curl framing; do
        "$WORK/http_path" "http://127.0.0.1:$PORT/hook" "$N" "$BATCH" "$mode"
    done
done
if [ "${CALLGRIND:-0}" = 1 ]; then
    for mode in engine curl framing; do
        valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$mode.out" "$WORK/http_path" \
            "http://127.0.0.1:$PORT/hook" "$N_CALLGRIND" "$BATCH" "$mode" 2>"$WORK/cg.$mode.log" | sed 's/^/callgrind run: /'
        total=$(sed -n 's/^==[0-9]*== Collected : //p' "$WORK/cg.$mode.log")
        echo "$mode: instructions per request: $(( total / N_CALLGRIND )) (callgrind, $N_CALLGRIND requests, setup included)"
        callgrind_annotate --inclusive=no "$WORK/cg.$mode.out" 2>/dev/null | sed -n '/^Ir/,$p' | sed -n '3,22p' | cut -c1-140
    done
fi
