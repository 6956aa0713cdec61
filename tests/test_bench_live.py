"""`proof bench live`, tiny: one family, one seed, a short accelerated run through real
`proof-agent` processes, ingest and the task runner (the embedded default here: SQLite and the
in-process runner); the output has the delay table and the CPU figures, and the fault was found
with a finite delay."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import embedded_default_env

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_live_finds_the_fault_and_prints_the_figures(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proof_web.cli",
            "bench",
            "live",
            "--families",
            "sequence_imbalance",
            "--no-controls",
            "--seeds",
            "1",
            "--duration",
            "300",
            "--speed",
            "30",
        ],
        cwd=REPO,
        env=embedded_default_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert result.returncode == 0, (out[-3000:], result.stderr[-3000:])
    assert "tasks: in-process runner" in out  # and says it is not worker processes
    row = re.search(
        r"^sequence_imbalance +sequence_imbalance +(-?\d+) +(-?\d+) +(-?\d+)\*? +[\d.]+ +1/1$",
        out,
        re.MULTILINE,
    )
    assert row, out
    p50, p90, worst = (int(v) for v in row.groups())
    # Found within the run: after the onset, no later than the data played.
    assert 0 <= p50 <= p90 <= worst <= 300, out
    assert "missed faults: 0 of 1" in out
    assert "controls' false verdicts: 0" in out
    cpu = re.search(r"→ ([\d.]+) cores per 1,000 GPUs", out)
    assert cpu and float(cpu.group(1)) > 0, out
    assert re.search(r"evaluate_job [1-9]\d* runs", out), out
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_bench_live_fleet_mode_prints_the_cost_per_data_second_stored(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proof_web.cli",
            "bench",
            "live",
            "--fleet-gpus",
            "16",
            "--fleet-agents",
            "2",
            "--fleet-faulty",
            "1",
            "--duration",
            "150",
            "--speed",
            "5",
        ],
        cwd=REPO,
        env={**embedded_default_env(tmp_path), "PROOF_EXPLAIN": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert result.returncode == 0, (out[-3000:], result.stderr[-3000:])
    assert "fleet: 2 nodes × 8 GPUs as 2 agent processes" in out
    stored = re.search(r"over ([\d,]+) data s of (\d+) GPUs", out)
    assert stored, out
    # the divisor is what ingest stored, never more than was played
    assert 60 <= int(stored.group(1).replace(",", "")) <= 150, out
    lag = re.search(r"ingest stored (\d+) of the 150 data s played", out)
    assert lag is None or int(lag.group(1)) < 143, out
    cpu = re.search(r"→ ([\d.]+) cores per 1,000 GPUs", out)
    assert cpu and float(cpu.group(1)) > 0, out
