#!/usr/bin/env bash
# Regenerate contract/wire/ from proto/*.proto with grpcio-tools (the version pinned in the dev
# extra of pyproject.toml). contract/wire/tests/test_generated.py fails when the committed files
# differ from what this produces, so run it after every .proto change and commit the result.
#   bash scripts/gen-proto.sh [OUTPUT_DIR [AGENT_DIR]]   (default: contract/wire, agent/collectors)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-contract/wire}"
python="${PYTHON:-.venv/bin/python}"
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I proto --python_out="$out" \
  --grpc_python_out="$out" proto/ingest.proto
# protoc writes a top-level import; the generated modules live in the contract.wire package.
sed -i 's/^import ingest_pb2 as /from contract.wire import ingest_pb2 as /' "$out/ingest_pb2_grpc.py"
# The kubelet's PodResources API (proto/kubernetes_podresources.proto), which only the agent's
# Kubernetes identity reads: generated next to it, in agent/collectors (not the contract).
agent_out="${2:-${1:-agent/collectors}}"  # with OUTPUT_DIR given, both go there (the staleness test)
mkdir -p "$agent_out"
"$python" -m grpc_tools.protoc -I proto --python_out="$agent_out" \
  --grpc_python_out="$agent_out" proto/kubernetes_podresources.proto
sed -i 's/^import kubernetes_podresources_pb2 as /from agent.collectors import kubernetes_podresources_pb2 as /' \
  "$agent_out/kubernetes_podresources_pb2_grpc.py"
