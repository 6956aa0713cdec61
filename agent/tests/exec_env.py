"""What the `proof-agent exec` tests share: a child environment without the test runner's own
job identity, and `proof analyze --json` on the traces they record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Variables a scheduler or launcher sets: a test run inside Slurm/torchrun must not leak them.
JOB_ENV_PREFIXES = (
    "SLURM_",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "TORCHELASTIC_",
    "PROOF_JOB",
    "OMPI_",
)


def job_free_env(**extra: str) -> dict[str, str]:
    """This process's environment without any job identity, importing this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(JOB_ENV_PREFIXES)}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def analyze_json(*paths: Path, env: dict[str, str]) -> dict[str, Any]:
    """`proof analyze --json` on the traces at `paths`."""
    proc = subprocess.run(
        [sys.executable, "-m", "proof_web.cli", "analyze", "--json", *map(str, paths)],
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    report: dict[str, Any] = json.loads(proc.stdout)
    return report
