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
#
# FORMAT=pyinstaller builds instead a PyInstaller one-file executable, dist/proof-agent, that
# carries Python itself: nothing but the NVIDIA driver is needed on the node (the Helm chart's
# image and nodes without Python 3.11). It unpacks into $TMPDIR at each start (~1 s) and finds
# the node's bcc (python3-bpfcc) at run time (agent/__main__.py). Build it on the
# oldest glibc the nodes run (it needs at least the build machine's).
#   FORMAT=pyinstaller bash packaging/build-agent.sh          # from this interpreter's packages
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
FORMAT="${FORMAT:-shiv}"
DEPS_FROM="${DEPS_FROM:-pypi}"

if [ "$FORMAT" = pyinstaller ]; then
  OUT="${OUT:-dist/proof-agent}"
  if ! "$PYTHON" -m PyInstaller --version >/dev/null 2>&1; then
    echo "build-agent: PyInstaller is not installed for $PYTHON (pip install pyinstaller; it is in the [dev] extra)" >&2
    exit 1
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # The agent's packages and its runtime requirements as this interpreter has them; never Django
  # (refused below, and agent_deps.FORBIDDEN). Subcommands and the transport are imported by
  # name at run time, hence --collect-submodules; tests are left out.
  excludes=()
  # Never the server's frameworks; nor build-time tools something may drag in (the protobuf
  # compiler, setuptools, Tk).
  for forbidden in django celery psycopg channels rest_framework daphne grpc_tools setuptools tkinter; do
    excludes+=(--exclude-module "$forbidden")
  done
  mapfile -t hidden < <("$PYTHON" - <<'PY'
import pkgutil, importlib
for root in ("agent", "contract", "simulator"):
    pkg = importlib.import_module(root)
    for mod in pkgutil.walk_packages(pkg.__path__, root + "."):
        if ".tests" not in mod.name:
            print("--hidden-import=" + mod.name)
PY
)
  "$PYTHON" -m PyInstaller --onefile --noconfirm --clean --log-level WARN \
    --name "$(basename "$OUT")" --distpath "$(dirname "$OUT")" \
    --workpath "$work/build" --specpath "$work" --paths "$PWD" \
    "${hidden[@]}" --hidden-import pynvml --hidden-import prometheus_client \
    --exclude-module pytest --exclude-module agent.tests "${excludes[@]}" agent/__main__.py
  contents="$("$PYTHON" -m PyInstaller.utils.cliutils.archive_viewer --recursive --brief "$OUT")"
  for forbidden in django celery psycopg; do
    if grep -qE "(^|[^A-Za-z0-9_])$forbidden([./]|\$)" <<<"$contents"; then
      echo "build-agent: $forbidden ended up in the executable; refusing" >&2
      exit 1
    fi
  done
  chmod 0755 "$OUT"
  echo "built $OUT ($(du -h "$OUT" | cut -f1))"
  exit 0
fi
OUT="${OUT:-dist/proof-agent.pyz}"

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
