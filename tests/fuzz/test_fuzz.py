"""The fuzz targets (tests/fuzz/targets.py) in CI: every seed through every target, then a
bounded fuzz run of each (tests/fuzz/run.py: atheris where installed, else the pure-Python
mutator), which must find no crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.run import _have_atheris
from tests.fuzz.targets import TARGETS, seeds

REPO = Path(__file__).resolve().parents[2]
SECONDS_PER_TARGET = 8
FUZZ = [sys.executable, "-m", "tests.fuzz.run"]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_seed_passes(name: str) -> None:
    one = TARGETS[name]()
    inputs = list(seeds(name))
    assert len(inputs) >= 3, f"{name}: the real fixtures give its seeds"
    for data in inputs:
        one(data)


@pytest.mark.slow
def test_bounded_fuzz_run_finds_no_crash(tmp_path: Path) -> None:
    done = subprocess.run(
        [*FUZZ, "--seconds", str(SECONDS_PER_TARGET), "--artifacts", str(tmp_path / "artifacts")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SECONDS_PER_TARGET * len(TARGETS) + 300,
    )
    out = done.stdout + done.stderr
    crashes = sorted(p.name for p in (tmp_path / "artifacts").glob("*"))
    assert done.returncode == 0 and not crashes, (crashes, out[-6000:])
    assert "fuzz: no crash" in out
    for name in TARGETS:
        assert f"fuzz {name}: " in out
    if _have_atheris():
        # libFuzzer's final stats: how many inputs each target ran
        runs = [
            int(line.split()[-1])
            for line in out.splitlines()
            if "stat::number_of_executed_units" in line
        ]
        assert len(runs) == len(TARGETS) and min(runs) > 100, out[-3000:]
