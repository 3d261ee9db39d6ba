#!/usr/bin/env bash
# Installs the Debian 12 packages needed to build, test, benchmark and demo
# outbox_dispatcher.  Idempotent: does nothing when everything is present.
set -euo pipefail

PKGS=(g++ make pkg-config
      postgresql-15 postgresql-server-dev-15 postgresql-client-15
      libcurl4-openssl-dev libssl-dev libgtest-dev googletest
      libipc-run-perl perl
      nginx-light python3 curl bc)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "missing packages: ${missing[*]} (run as root to install them)" >&2
        exit 1
    fi
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
