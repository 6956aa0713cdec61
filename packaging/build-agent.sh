#!/usr/bin/env bash
# Build the node agent as one self-contained executable file: dist/proof-agent.pyz.
#
#   bash packaging/build-agent.sh                 # dependencies from PyPI (binary wheels)
#   DEPS_FROM=venv bash packaging/build-agent.sh  # offline: copy them from this interpreter
#   OUT=/tmp/proof-agent.pyz PYTHON=.venv/bin/python bash packaging/build-agent.sh
#
# Format: a shiv zipapp (PEP 441). It holds the `agent`, `contract` and `simulator` packages and its runtime requirements
# (pyproject base dependencies + the [agent] extra: numpy, grpcio, protobuf, nvidia-ml-py,
# prometheus-client) — never Django. Compiled extensions (numpy, grpcio) cannot be imported
# from inside a zip, so on first start shiv unpacks the file once into ~/.shiv/ (or
# $SHIV_ROOT; the systemd unit uses /var/lib/proof-agent/shiv) and reuses it after that.
# Binary wheels are for the Python version and platform of the build: build with the same
# Python minor version as the nodes run (3.11+, x86_64 or aarch64 Linux).
# eBPF uses the system's bcc package (python3-bpfcc), which the agent finds at run time; it is
# not bundled (it must match the node's kernel and LLVM).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-dist/proof-agent.pyz}"
DEPS_FROM="${DEPS_FROM:-pypi}"

if ! "$PYTHON" -m shiv --version >/dev/null 2>&1; then
  echo "build-agent: shiv is not installed for $PYTHON (pip install shiv; it is in the [dev] extra)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
site="$work/site"
mkdir -p "$site"

case "$DEPS_FROM" in
  pypi)
    mapfile -t reqs < <("$PYTHON" packaging/agent_deps.py list)
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
      --target "$site" "${reqs[@]}"
    ;;
  venv)
    "$PYTHON" packaging/agent_deps.py copy "$site"
    ;;
  *)
    echo "build-agent: DEPS_FROM must be pypi or venv, got '$DEPS_FROM'" >&2
    exit 2
    ;;
esac

# The packages a node runs (the agent, the contract below it, the simulator its sim backend
# uses), without their tests (and their fixture data) or bytecode.
for pkg in agent contract simulator; do
  mkdir -p "$site/$pkg"
  (cd "$pkg" && find . -type f \
     -not -path "./tests/*" -not -path "*/tests/*" -not -path "*/__pycache__/*" -not -name "*.pyc" \
     -print0 | while IFS= read -r -d '' f; do
       mkdir -p "$site/$pkg/$(dirname "$f")"
       cp "$f" "$site/$pkg/$f"
     done)
done
for forbidden in django celery psycopg; do
  if [ -e "$site/$forbidden" ]; then
    echo "build-agent: $forbidden ended up in the executable; refusing" >&2
    exit 1
  fi
done

mkdir -p "$(dirname "$OUT")"
"$PYTHON" -m shiv --site-packages "$site" --entry-point agent.cli:main \
  --python "/usr/bin/env python3" --compressed --reproducible --output-file "$OUT"
chmod 0755 "$OUT"
echo "built $OUT ($(du -h "$OUT" | cut -f1))"
