#!/usr/bin/env bash
# Creates .venv (if missing) and installs Proof into it with the given extras, comma-separated
# (default: dev; scripts/test.sh passes dev,workloads, scripts/demo.sh server). The explain extra
# is always added: live and offline verdicts get the local model's explanation (docs/investigations.md).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev},explain"  # explain: the investigation agent's local model (pyproject.toml)
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
.venv/bin/pip install -q -e ".[$extras]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import proof_web, agent" >/dev/null
