#!/usr/bin/env bash
#
# test_all_versions.sh — the whole suite (test/run_all.sh) on every supported
# PostgreSQL major: 15 on this Debian 12 machine, 17 and 18 in Debian trixie
# and unstable root file systems (test/pgversions.sh).  Prints each run's
# output, then one summary line per major, then the sum as the last line:
# "N passed, N failed".  PG_MAJOR=N runs one major only.  Run as root
# (`make test-all`, `.ci/run`).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAJORS=${PG_MAJOR:-15 17 18}

# a dump taken by the PostgreSQL 15 run is restored by the others (056_dump_across_versions.pl)
CROSS=$(mktemp -d /tmp/outbox_cross.XXXXXX)
chmod 777 "$CROSS"
trap 'rm -rf "$CROSS"' EXIT
export OD_CROSS_DUMP_DIR=$CROSS

total_p=0
total_f=0
lines=()
for m in $MAJORS; do
    log=$(mktemp /tmp/outbox_pg$m.XXXXXX.log)
    start=$(date +%s)
    if [ "$m" = 15 ]; then
        PG_MAJOR=15 OD_CROSS_DUMP="$CROSS/pg15.dump" "$ROOT/test/run_all.sh" 2>&1 | tee "$log"
    else
        "$ROOT/test/pgversions.sh" "$m" 2>&1 | tee "$log"
    fi
    rc=${PIPESTATUS[0]}
    secs=$(( $(date +%s) - start ))
    last=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    p=0; f=1
    if [ -n "$last" ]; then
        p=${last%% passed*}
        f=${last#*passed, }; f=${f%% failed*}
    fi
    [ "$rc" != 0 ] && [ "$f" = 0 ] && f=1      # the run failed without saying what
    total_p=$((total_p + p)); total_f=$((total_f + f))
    lines+=("$(printf 'PostgreSQL %-3s %5d passed, %d failed  (%d s)' "$m" "$p" "$f" "$secs")")
    rm -f "$log"
done

echo
echo "== per PostgreSQL version"
printf '%s\n' "${lines[@]}"
echo "$total_p passed, $total_f failed"
[ "$total_f" = 0 ] && [ "$total_p" -gt 0 ]
