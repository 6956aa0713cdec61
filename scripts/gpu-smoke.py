"""GPU smoke check for a machine with a real NVIDIA GPU (the device check of issue 5).

    .venv/bin/python scripts/gpu-smoke.py [--seconds 5] [--out gpu-smoke.json]

Runs the real NVML collector (nvidia-ml-py against the installed driver) at 1 Hz with a busy
GPU process if torch or cupy is importable, joins identity for the processes NVML reports,
and runs `proof-agent doctor`; prints what every reading returned, which were unsupported,
the events, the PID → GPU map and the CPU time per collection. Exit 1 when NVML does not
start (the reason is printed). Meant to be run as one prepared command on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUSY = """
import time
try:
    import torch
    a = torch.randn(8192, 8192, device="cuda")
    end = time.time() + {seconds}
    while time.time() < end:
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
except ImportError:
    time.sleep({seconds})
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import pynvml

    from agent.collectors.identity import IdentityCollector
    from agent.collectors.nvml import NvmlCollector

    col = NvmlCollector(pynvml)
    if not col.start():
        print(f"NVML unavailable: {col.unavailable_reason}")
        return 1
    facts = col.node_facts()
    print("node facts:", json.dumps(facts, indent=1))
    busy = subprocess.Popen(
        [sys.executable, "-c", BUSY.format(seconds=args.seconds + 3)],
        env={
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "SLURM_JOB_ID": "smoke",
            "PATH": "/usr/bin:/bin",
        },
    )
    time.sleep(3)
    ident = IdentityCollector(gpu_pids=col.pid_gpus)
    all_records = []
    cpu = []
    for _ in range(args.seconds):
        t0 = time.process_time()
        recs = col.collect(time.time())
        recs += ident.collect(time.time())
        cpu.append(time.process_time() - t0)
        all_records += recs
        time.sleep(1)
    busy.wait()
    last: dict[tuple[int, str], float] = {}
    for r in all_records:
        if r["type"] == "sample":
            last[(r["gpu_index"], r["name"])] = r["value"]
    for (gpu, name), value in sorted(last.items()):
        print(f"gpu{gpu} {name} = {value}")
    for state in col._gpus:
        print(f"gpu{state.index} disabled readings: {sorted(state.disabled)}")
    for r in all_records:
        if r["type"] != "sample":
            print(json.dumps(r))
    print("pid → gpu:", {pid: [g.index for g in refs] for pid, refs in col.pid_gpus().items()})
    print(
        f"CPU per collection: mean {1e3 * sum(cpu) / len(cpu):.2f} ms, max {1e3 * max(cpu):.2f} ms"
    )
    doctor = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from agent.cli import main; sys.exit(main())",
            "doctor",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    print(doctor.stdout, doctor.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps({"facts": facts, "records": all_records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
