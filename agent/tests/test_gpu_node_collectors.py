"""The real-node GPU collectors assembled from the config, run by the agent runtime: GPU samples
leave the agent keyed with the job and rank of the (real) process using the GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agent.collectors import gpu_node_collectors
from agent.collectors.nvml_sim import SimulatedNvml
from agent.config import parse_config
from agent.runtime import Agent, ManualClock, MemorySink
from contract import signals


def test_gpu_samples_keyed_with_job_and_rank_of_a_real_process(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={"SLURM_JOB_ID": "5150", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"},
    )
    try:
        nv = SimulatedNvml.with_gpus(2)
        nv.gpus[1].processes = [(child.pid, 1 << 30)]
        nv.gpus[1].util_gpu = 88
        cfg = parse_config(
            {
                "dcgm": {"mode": "off"},
                "slurm": {"enabled": False},
                "spool": {"dir": str(tmp_path / "spool")},
            },
            env={},
        )
        collectors = gpu_node_collectors(cfg, "n7", nvml=nv)
        assert [c.name for c in collectors] == ["nvml", "kubernetes", "identity", "exec_inbox"]
        sink = MemorySink()
        agent = Agent(collectors, sink, clock=ManualClock(1000.0), node="n7")
        agent.run(max_ticks=3)
        util = [
            r
            for r in sink.records
            if r.get("name") == signals.DCGM_FI_DEV_GPU_UTIL and r["gpu_index"] == 1
        ]
        assert util and util[-1]["value"] == 88
        # keyed at collection time through the identity join: job, rank of the process on GPU 1
        assert (util[-1]["job"], util[-1]["rank"], util[-1]["local_rank"]) == ("5150", 3, 1)
        gpu0 = [r for r in sink.records if r.get("gpu_index") == 0 and r["type"] == "sample"]
        assert gpu0 and all("job" not in r for r in gpu0)  # nobody on GPU 0
        procs = [r for r in sink.records if r["type"] == "process"]
        assert [(p["pid"], p["gpu"]) for p in procs] == [(child.pid, nv.gpus[1].uuid)]
    finally:
        child.kill()
        child.wait()
