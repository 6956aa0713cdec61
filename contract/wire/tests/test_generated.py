"""The committed generated code is exactly what scripts/gen-proto.sh produces from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.wire import ingest_pb2

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ("ingest_pb2.py", "ingest_pb2_grpc.py")


def test_regenerating_gives_identical_files(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)],
        check=True,
        cwd=ROOT,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    for name in GENERATED:
        committed = (ROOT / "contract" / "wire" / name).read_bytes()
        fresh = (tmp_path / name).read_bytes()
        assert fresh == committed, f"contract/wire/{name} is stale: run scripts/gen-proto.sh"


def test_generated_module_round_trips_a_batch() -> None:
    batch = ingest_pb2.Batch(agent_id="a", sequence=7, strings=["", "x"], values=[1.5, 2.5])
    decoded = ingest_pb2.Batch.FromString(batch.SerializeToString())
    assert decoded.sequence == 7
    assert list(decoded.values) == [1.5, 2.5]
