#!/usr/bin/env bash
# Regenerate contract/wire/ from proto/*.proto with grpcio-tools (the version pinned in the dev
# extra of pyproject.toml). contract/wire/tests/test_generated.py fails when the committed files
# differ from what this produces, so run it after every .proto change and commit the result.
#   bash scripts/gen-proto.sh [OUTPUT_DIR]   (default: contract/wire)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-contract/wire}"
python="${PYTHON:-.venv/bin/python}"
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I proto --python_out="$out" \
  --grpc_python_out="$out" proto/ingest.proto
# protoc writes a top-level import; the generated modules live in the contract.wire package.
sed -i 's/^import ingest_pb2 as /from contract.wire import ingest_pb2 as /' "$out/ingest_pb2_grpc.py"
