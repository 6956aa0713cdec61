"""GPU smoke check for a machine with a real NVIDIA GPU (the device check of issue 5), in one go.

    .venv/bin/python scripts/gpu-smoke.py            # JSON summary to $OUT/gpu-smoke.json
    .venv/bin/python scripts/gpu-smoke.py --out DIR --seconds 10

A launcher: the check is the agent's own `proof-agent gpu-smoke` (agent/commands/gpu_smoke.py,
where its steps are described), run here in its own process with this interpreter from the
checkout's root, so this script imports nothing of the agent. Options and output are the
command's; so is the exit status (0 when the summary was written, 2 if it could not be).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    # The checkout's agent, whether or not this interpreter has the project installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "agent.cli", "gpu-smoke", *argv]
    try:
        return subprocess.run(command, cwd=ROOT, env=env).returncode  # noqa: S603 - our interpreter running the checkout's agent; the options are the caller's own
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
