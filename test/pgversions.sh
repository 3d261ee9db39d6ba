#!/usr/bin/env bash
#
# pgversions.sh MAJOR — run the whole test suite (test/run_all.sh) on
# PostgreSQL MAJOR inside a Debian root file system made with debootstrap:
#
#   15   Debian 12 bookworm: the machine itself (no root file system needed)
#   17   Debian 13 trixie
#   18   Debian unstable (sid)
#
# The root file system is built once and cached in $OD_ROOTFS_CACHE
# (default /var/cache/outbox_dispatcher/rootfs/<suite>), never in the
# repository; later runs reuse it (apt-get refreshes its packages).  Inside
# it, /proc, /dev, /dev/pts and a tmpfs on /dev/shm are mounted for the
# duration of the run and unmounted afterwards.  A copy of the working tree
# (without .git) is built and tested there by test/run_all.sh, which ends
# with "N passed, N failed" like on the machine itself.
#
# Run as root.  Environment: OD_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# OD_ROOTFS_CACHE, OD_TEST_LAYERS (passed on).
set -uo pipefail

MAJOR=${1:-}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MIRROR=${OD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${OD_ROOTFS_CACHE:-/var/cache/outbox_dispatcher/rootfs}

case "$MAJOR" in
    15) exec env PG_MAJOR=15 "$ROOT/test/run_all.sh" ;;
    17) SUITE=trixie ;;
    18) SUITE=sid ;;
    *)  echo "usage: $0 15|17|18" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
    echo "pgversions.sh: run as root (debootstrap and chroot need it)" >&2
    exit 2
fi

FS="$CACHE/$SUITE"
# unstable's Release file on the mirror may be past its Valid-Until date
APT_OPTS=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -o Dpkg::Use-Pty=0)

mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -l "${mounted[$i]}" 2>/dev/null
    done
    mounted=()
}
trap cleanup EXIT

mount_into() {  # type|bind source target [options]
    local kind=$1 src=$2 dst=$3
    mkdir -p "$dst"
    if [ "$kind" = bind ]; then
        mount --bind "$src" "$dst" || return 1
    else
        mount -t "$kind" "$src" "$dst" ${4:+-o "$4"} || return 1
    fi
    mounted+=("$dst")
}

# ------------------------------------------------------------------ the root file system
if [ ! -f "$FS/.od-ready" ]; then
    if ! command -v debootstrap >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } ||
            { echo "pgversions.sh: cannot install debootstrap"; echo "0 passed, 1 failed"; exit 1; }
    fi
    echo "== building a Debian $SUITE root file system in $FS (once; cached)"
    rm -rf "$FS.tmp"
    mkdir -p "$CACHE"
    if ! debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$FS.tmp" "$MIRROR" > "$CACHE/$SUITE.debootstrap.log" 2>&1; then
        tail -n 30 "$CACHE/$SUITE.debootstrap.log"
        echo "pgversions.sh: debootstrap $SUITE failed"
        echo "0 passed, 1 failed"
        exit 1
    fi
    # services must not start inside the root file system when packages are installed
    printf '#!/bin/sh\nexit 101\n' > "$FS.tmp/usr/sbin/policy-rc.d"
    chmod +x "$FS.tmp/usr/sbin/policy-rc.d"
    printf 'deb %s %s main\n' "$MIRROR" "$SUITE" > "$FS.tmp/etc/apt/sources.list"
    rm -rf "$FS"
    mv "$FS.tmp" "$FS"
    touch "$FS/.od-ready"
fi
cp -L /etc/resolv.conf "$FS/etc/resolv.conf" 2>/dev/null || true

mount_into proc proc "$FS/proc" || { echo "0 passed, 1 failed"; exit 1; }
mount_into bind /dev "$FS/dev" || { echo "0 passed, 1 failed"; exit 1; }
mount_into bind /dev/pts "$FS/dev/pts" || { echo "0 passed, 1 failed"; exit 1; }
mount_into tmpfs tmpfs "$FS/dev/shm" "mode=1777" || { echo "0 passed, 1 failed"; exit 1; }

# ------------------------------------------------------------------ the tree, built and tested inside
rm -rf "$FS/tmp/outbox_src"
mkdir -p "$FS/tmp/outbox_src"
tar -C "$ROOT" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude=test/unit/unit_tests \
    --exclude=results --exclude=tmp_check --exclude=output_iso -cf - . | tar -C "$FS/tmp/outbox_src" -xf -

# a dump taken by the PostgreSQL 15 run of the same test_all_versions.sh, if any
if [ -n "${OD_CROSS_DUMP_DIR:-}" ] && [ -f "$OD_CROSS_DUMP_DIR/pg15.dump" ]; then
    mkdir -p "$FS/tmp/outbox_src/test/cross_dump"
    cp "$OD_CROSS_DUMP_DIR/pg15.dump" "$OD_CROSS_DUMP_DIR/pg15.dump.expected" "$FS/tmp/outbox_src/test/cross_dump/"
fi

echo "== PostgreSQL $MAJOR on Debian $SUITE (chroot $FS)"
chroot "$FS" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive CI="${CI:-}" \
    PG_MAJOR="$MAJOR" OD_APT_OPTS="${APT_OPTS[*]}" OD_TEST_LAYERS="${OD_TEST_LAYERS:-}" \
    bash /tmp/outbox_src/test/run_all.sh
rc=$?
cleanup
exit $rc
