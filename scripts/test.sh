#!/usr/bin/env bash
# The whole test suite, against real PostgreSQL (with row-level security) and Redis:
# system packages, services, virtualenv, database roles, then lint, types and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-system.sh
bash scripts/venv.sh dev,workloads  # workloads: torch, transformers, lightning (workloads/)

export DATABASE_URL="${DATABASE_URL:-postgres://proof_app:proof_app@127.0.0.1:5432/proof}"
export DATABASE_OWNER_URL="${DATABASE_OWNER_URL:-postgres://proof_owner:proof_owner@127.0.0.1:5432/proof}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export PROOF_ENV=test
.venv/bin/proof setup-db

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== lint-imports (package boundaries: [tool.importlinter] in pyproject.toml)"
.venv/bin/lint-imports
echo "== mypy"
.venv/bin/mypy .
echo "== pip-audit (known vulnerabilities of the installed dependencies; unreachable service: said, not failed)"
bash scripts/pip-audit.sh
echo "== makemigrations --check (the models and their migrations agree)"
.venv/bin/python manage.py makemigrations --check --dry-run
echo "== manage.py check --deploy (production settings)"
PROOF_ENV=production PROOF_DEBUG=0 PROOF_ALLOWED_HOSTS=proof.example.com \
  PROOF_SECRET_KEY="ci-$(head -c 48 /dev/urandom | base64 | tr -d '/+=' | head -c 60)" \
  .venv/bin/python manage.py check --deploy --fail-level WARNING
echo "== pytest"
set +e
.venv/bin/pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
