"""`proof simulate`: lists scenarios, writes a valid trace, refuses bad input; no Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.cli import dispatch
from contract.trace import validate_trace
from simulator import list_scenarios


def main(argv: list[str]) -> int:
    """`proof simulate …` through the same dispatcher as `proof` (proof_web.cli registers
    simulator.cli as `simulate`; the simulator's tests do not import the server layer)."""
    return dispatch("proof", "", {"simulate": ("simulator.cli", "simulate")}, argv)


def test_list_prints_one_line_per_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [info.name for info in list_scenarios()]
    assert len(lines) == len(names)
    assert {ln.split()[0] for ln in lines} == set(names)


def test_writes_a_valid_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl.gz"
    argv = ["simulate", "fabric_degraded", "--seed", "4", "--duration", "120", "--out", str(out)]
    assert main([*argv, "--nodes", "2", "--gpus-per-node", "2"]) == 0
    report = validate_trace(out)
    assert report.ok and report.meta is not None
    assert report.meta["truth"]["family"] == "fabric_degraded"
    assert report.meta["seed"] == 4 and report.meta["duration_s"] == 120.0
    assert "records" in capsys.readouterr().err


def test_bad_input_is_refused_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    assert main(["simulate", "no_such_thing", "--out", str(out)]) == 2
    assert "unknown scenario 'no_such_thing'" in capsys.readouterr().err
    assert main(["simulate", "healthy_training", "--duration", "-5", "--out", str(out)]) == 2
    assert "duration_s must be positive" in capsys.readouterr().err
    assert main(["simulate", "healthy_training"]) == 2
    assert not out.exists()


def test_runs_without_django(tmp_path: Path) -> None:
    code = (
        "import sys; from proof_web.cli import main; "
        f"rc = main(['simulate', 'healthy_training', '--duration', '30', '--nodes', '1', "
        f"'--out', {str(tmp_path / 'x.jsonl')!r}]); "
        "assert rc == 0, rc; assert 'django' not in sys.modules, 'django imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])
