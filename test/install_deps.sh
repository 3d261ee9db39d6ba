#!/usr/bin/env bash
# Installs the Debian packages needed to build, test, benchmark and demo
# outbox_dispatcher.  Idempotent: does nothing when everything is present.
#
# PG_MAJOR selects the PostgreSQL major (default: the one of this Debian
# release: 15 on bookworm, 17 on trixie, 18 on unstable).  OD_APT_OPTS adds
# options to apt-get (test/pgversions.sh passes
# -o Acquire::Check-Valid-Until=false for unstable).
set -euo pipefail

if [ -z "${PG_MAJOR:-}" ]; then
    codename=$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")
    case "$codename" in
        trixie) PG_MAJOR=17 ;;
        sid|forky) PG_MAJOR=18 ;;
        *) PG_MAJOR=15 ;;
    esac
fi
read -r -a APT_OPTS <<< "${OD_APT_OPTS:-}"

PKGS=(g++ make pkg-config git ca-certificates procps
      postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-client-$PG_MAJOR
      libcurl4-openssl-dev libssl-dev libgtest-dev googletest
      libipc-run-perl perl
      python3 curl bc openssl
      prometheus-postgres-exporter)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PKGS[@]}"; do
    installed "$p" || missing+=("$p")
done
# the benchmark's and demo's HTTP endpoint: nginx-light where the release still has it
installed nginx-light || installed nginx || missing+=(nginx-light)
# promtool (the monitoring layer, 064_exporter.pl): its own package from trixie on
# (83-93 MiB installed); bookworm has it only in prometheus (94 MiB, and 222 MiB of
# web-UI JavaScript it depends on).  The prometheus and exporter services do not
# start where policy-rc.d forbids it (containers, test/pgversions.sh's root file
# systems); elsewhere they start on :9090 and :9187.  064_exporter.pl runs its own.
installed promtool || installed prometheus || missing+=(promtool)

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "missing packages: ${missing[*]} (run as root to install them)" >&2
        exit 1
    fi
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get "${APT_OPTS[@]}" update -qq
    if [[ " ${missing[*]} " == *" nginx-light "* ]] && ! apt-cache show nginx-light >/dev/null 2>&1; then
        missing=("${missing[@]/nginx-light/nginx}")
    fi
    if [[ " ${missing[*]} " == *" promtool "* ]] && ! apt-cache show promtool >/dev/null 2>&1; then
        missing=("${missing[@]/promtool/prometheus}")
    fi
    apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node.js and the official Standard Webhooks / CloudEvents SDKs for the
# conformance receiver (test/conformance, test/tap/065_conformance.pl).  In a
# root file system (test/pgversions.sh) node_modules arrives with the tree, so
# only nodejs is installed there.
CONFORMANCE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/conformance
apt_install() {
    if [ "$(id -u)" != 0 ]; then
        echo "missing: $* (run as root to install)" >&2
        exit 1
    fi
    echo "installing: $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get "${APT_OPTS[@]}" update -qq
    apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "$@" >/dev/null
}
command -v node >/dev/null 2>&1 || apt_install nodejs
if [ ! -d "$CONFORMANCE/node_modules" ]; then
    command -v npm >/dev/null 2>&1 || apt_install npm
    echo "installing: test/conformance/node_modules (npm ci)"
    npm ci --prefix "$CONFORMANCE" --no-audit --no-fund >/dev/null
fi
