#!/usr/bin/env bash
#
# valgrind_tap.sh — run TAP test(s) with every PostgreSQL server process under
# valgrind memcheck, then report the errors that involve our code.
#
#   test/sanitize/valgrind_tap.sh [test/tap/011_wire.pl ...]   (default: 011_wire.pl)
#
# How: a private bin directory is put first in PATH.  It holds symlinks to
# the real PostgreSQL binaries (initdb resolves its symlink and bootstraps
# with the real postgres, at full speed), a copy of pg_ctl (a copy, so that
# pg_ctl looks for postgres next to itself) and a `postgres` wrapper that
# answers -V directly and otherwise execs
#
#   valgrind --tool=memcheck --trace-children=yes --leak-check=no
#            --track-origins=yes --error-limit=no --num-callers=40
#            --log-file=<out>/vg.%p.log /usr/lib/postgresql/15/bin/postgres ...
#
# Every backend and background worker is forked from the postmaster and so
# runs under memcheck too (one log file per process).  --leak-check=no:
# PostgreSQL frees memory contexts wholesale at exit, so leak reports would
# be noise.  Debian's PostgreSQL is not built with USE_VALGRIND and its
# binary is stripped: palloc'd chunks are not tracked individually and
# postgres frames show as ???, so postgres itself produces some noise
# (uninitialised padding written to WAL / sockets).  The summary keeps only
# error blocks with a frame in outbox_dispatcher.so or libcurl, which is
# where invalid reads/writes and uses of uninitialised values in our code
# (and in what we hand to libcurl) would show.
#
# Root: installs the extension (make install), copies the tree to /tmp and
# re-runs itself as postgres, like test/run_all.sh.  Exit status 1 when an
# error block involves outbox_dispatcher.so or libcurl, or the test fails.
# Not part of CI (a run takes minutes).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=(test/tap/011_wire.pl)

if [ "$(id -u)" = 0 ]; then
    make -C "$ROOT" -s >/dev/null && make -C "$ROOT" -s install >/dev/null || { echo "build failed"; exit 1; }
    WORK=$(mktemp -d /tmp/od_valgrind.XXXXXX)
    tar -C "$ROOT" --exclude=.git -cf - . | tar -C "$WORK" -xf -
    chown -R postgres:postgres "$WORK"
    exec su postgres -s /bin/bash -c "cd '$WORK' && bash test/sanitize/valgrind_tap.sh ${TESTS[*]}"
fi

cd "$ROOT"
REAL=$(pg_config --bindir)
PGXS_DIR=$(cd "$(dirname "$(pg_config --pgxs)")/../.." && pwd)
OUT="$ROOT/tmp_check/valgrind"
VGBIN="$ROOT/tmp_check/vgbin"
rm -rf "$OUT" "$VGBIN"; mkdir -p "$OUT" "$VGBIN"
for f in "$REAL"/*; do ln -s "$f" "$VGBIN/$(basename "$f")"; done
rm "$VGBIN/pg_ctl" "$VGBIN/postgres"
cp "$REAL/pg_ctl" "$VGBIN/pg_ctl"
cat > "$VGBIN/postgres" <<EOW
#!/bin/sh
case "\$1" in -V|--version|--describe-config|-C) exec "$REAL/postgres" "\$@";; esac
exec valgrind --tool=memcheck --trace-children=yes --leak-check=no --track-origins=yes \\
    --error-limit=no --num-callers=40 --log-file="$OUT/vg.%p.log" "$REAL/postgres" "\$@"
EOW
chmod +x "$VGBIN/postgres"

export PATH="$VGBIN:$PATH"
export PG_REGRESS="$PGXS_DIR/src/test/regress/pg_regress"
export PGCTLTIMEOUT=600 PG_TEST_TIMEOUT_DEFAULT=600
rc=0
for t in "${TESTS[@]}"; do
    log="tmp_check/$(basename "$t" .pl).valgrind.log"
    echo "== $t under valgrind (test output: $log)"
    start=$(date +%s)
    perl -I "$PGXS_DIR/src/test/perl" -I test/tap "$t" > "$log" 2>&1
    trc=$?
    echo "   exit $trc, $(grep -cE '^ok [0-9]+' "$log") ok, $(grep -cE '^not ok [0-9]+' "$log") not ok, $(( $(date +%s) - start )) s"
    grep -E '^not ok' "$log" | head -20
    [ $trc = 0 ] || rc=1
done

# ---------------------------------------------------------------- summary
# An error block is "ours" when, walking its stack from the innermost frame,
# a frame in our sources (src/, built with -g) or in libcurl/OpenSSL comes
# before any frame of the postgres binary.  Errors topped by postgres code
# but called from ours are listed separately for review (most are
# PostgreSQL's own padding noise, e.g. the relcache init file written while a
# worker connects).
/usr/bin/python3 - "$OUT" "$ROOT/src" <<'EOP'
import glob, os, re, sys
out, src = sys.argv[1], sys.argv[2]
our_files = set(os.path.basename(f) for f in glob.glob(src + "/*.[ch]*") + glob.glob(src + "/core/*.[ch]*"))
frame_re = re.compile(r"(?:at|by) 0x[0-9A-Fa-f]+: (.*)$")
loc_re = re.compile(r"\(([^():]+):(\d+)\)$")

def kind(frame):
    m = loc_re.search(frame)
    if m and m.group(1) in our_files:
        return "ours"
    if "outbox_dispatcher.so" in frame:
        return "ours"
    if re.search(r"lib(curl|ssl|crypto|nghttp2|ssh2|psl|idn2)[.-]", frame):
        return "lib"
    if "/bin/postgres)" in frame:
        return "pg"
    return "other"

procs = 0; total = 0; ours = []; via = {}; kinds = {}
for path in sorted(glob.glob(os.path.join(out, "vg.*.log"))):
    procs += 1
    blocks, cur = [], []
    for line in open(path, errors="replace"):
        m = re.match(r"==\d+== ?(.*)", line.rstrip("\n"))
        if not m:
            continue
        if m.group(1) == "":
            if cur:
                blocks.append(cur); cur = []
        else:
            cur.append(m.group(1))
    if cur:
        blocks.append(cur)
    for b in blocks:
        head = b[0]
        if not re.match(r"(Invalid|Conditional|Use of uninitialised|Syscall param|Mismatched|Source and destination|Argument)", head):
            continue
        total += 1
        kinds[head] = kinds.get(head, 0) + 1
        frames = []
        for l in b[1:]:
            fm = frame_re.search(l)
            if not fm:
                break              # end of the primary stack ("Address ...", "Uninitialised value was created ...")
            frames.append(fm.group(1))
        verdict = None
        for f in frames:
            k = kind(f)
            if k in ("ours", "lib"):
                verdict = "ours"; break
            if k == "pg":
                verdict = "pg"; break
        if verdict == "ours":
            ours.append((os.path.basename(path), b))
        elif any(kind(f) == "ours" for f in frames):
            pgf = next((f for f in frames if kind(f) == "pg" and not f.startswith("???")), "?")
            of = next(f for f in frames if kind(f) == "ours")
            key = "%s | %s | called from %s" % (head, pgf, of)
            via[key] = via.get(key, 0) + 1
print("valgrind: %d process logs, %d error contexts in total (all processes, postgres noise included)" % (procs, total))
for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:10]:
    print("   %5d  %s" % (n, k))
print("postgres-topped errors on a stack through our code (review; PostgreSQL noise unless stated):")
for k, n in sorted(via.items(), key=lambda kv: -kv[1]):
    print("   %5d  %s" % (n, k))
print("errors in outbox_dispatcher code or libcurl/OpenSSL: %d" % len(ours))
for name, b in ours[:20]:
    print("--- %s" % name)
    print("\n".join("   " + l for l in b[:30]))
sys.exit(1 if ours else 0)
EOP
[ $? = 0 ] || rc=1
echo "per-process logs: $OUT"
exit $rc
