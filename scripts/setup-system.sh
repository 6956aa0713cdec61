#!/usr/bin/env bash
# Installs the Debian packages Proof's tests need and starts PostgreSQL and Redis if they are
# not already running. Idempotent; run as root (CI and the dev machines are root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

packages=$(sed -e 's/#.*//' -e '/^\s*$/d' "$here/debian-packages.txt" | awk '{print $1}')
missing=()
for pkg in $packages; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-system: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

for hook in "$here"/setup-system.d/*.sh; do
  [ -e "$hook" ] || continue
  bash "$hook"
done

if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "setup-system: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "setup-system: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
