#!/usr/bin/env bash
# One command to see Proof work: creates .venv with the server extras, then runs `proof demo`
# on the embedded default (SQLite in .data/, in-process tasks). The link it prints opens the
# console's incidents page (the simulated fleet's verdicts) after sign-in. Extra arguments pass through:
#   bash scripts/demo.sh --port 8080
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh server
exec .venv/bin/proof demo "$@"
