#!/usr/bin/env bash
#
# ab_bench.sh — two commits side by side: builds each in a git worktree of
# its own and runs `make bench`'s scenarios with RUNS=1, alternating
# A, B, A, B ... PAIRS times (default 3), installing each build before its
# run.  This machine's speed drifts within minutes (other tenants), so two
# benchmarks taken one after the other compare the drift as much as the
# code; alternating puts the drift on both sides.  Prints each run's
# scenario lines and machine-speed row, labelled; each run's results stay
# in OUT (default /tmp/od_ab.<pid>).  The tree you run it from is left as
# it is; run `make install` there afterwards to get your own build back.
#
# Usage (root):
#     test/bench/ab_bench.sh A B                 e.g. test/bench/ab_bench.sh 94a8793 HEAD
#     SCENARIOS=fresh,sustained PAIRS=3 test/bench/ab_bench.sh A B
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# = 2 ] || { echo "usage: $0 COMMIT_A COMMIT_B" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "ab_bench.sh: run as root" >&2; exit 1; }
PAIRS=${PAIRS:-3}
OUT=${OUT:-/tmp/od_ab.$$}
mkdir -p "$OUT"

declare -A TREE
for side in A B; do
    commit=$([ $side = A ] && echo "$1" || echo "$2")
    TREE[$side]="$OUT/tree_$side"
    git -C "$ROOT" worktree add --force --detach "${TREE[$side]}" "$commit" >/dev/null 2>&1 ||
        { echo "ab_bench.sh: cannot check out $commit" >&2; exit 1; }
    echo "$side = $(git -C "${TREE[$side]}" log --oneline -1)"
done
cleanup() {
    for side in A B; do git -C "$ROOT" worktree remove --force "${TREE[$side]}" 2>/dev/null || true; done
}
trap cleanup EXIT

for i in $(seq "$PAIRS"); do
    for side in A B; do
        make -C "${TREE[$side]}" -s -j2 >/dev/null 2>&1 && make -C "${TREE[$side]}" -s install >/dev/null 2>&1 ||
            { echo "ab_bench.sh: building $side failed" >&2; exit 1; }
        echo "== pair $i, $side"
        (cd "${TREE[$side]}" && SCENARIOS=${SCENARIOS:-fresh,sustained} RUNS=1 OUT_DIR="$OUT/${side}_$i" \
            ./test/bench/run_bench.sh 2>&1 | grep -E '^  [a-z]|^ {13}[A-Za-z]|machine speed')
    done
done
echo "results: $OUT/{A,B}_<pair>/results.md"
