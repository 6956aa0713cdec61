from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agent.runtime.memory import peak_rss_mib

ROOT = Path(__file__).resolve().parents[2]


def test_peak_rss_reads_vmhwm_of_this_image(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(
        "Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t 40000 kB\n"
    )
    assert peak_rss_mib(status) == 50.0


def test_peak_rss_falls_back_to_getrusage_without_proc(tmp_path: Path) -> None:
    got = peak_rss_mib(tmp_path / "missing")
    assert got > 1  # this process's own maxrss, in MiB


def test_real_proc_status_is_read() -> None:
    assert 1 < peak_rss_mib() < 100_000


def test_the_agent_process_loads_neither_numpy_nor_the_simulator() -> None:
    """numpy was ~19 MiB of the agent's RSS and the simulator ~3 more in the bench's measured
    process (issue 17): the run path, the transport, the trace sink and the bench's agent side
    must not import them (the bench's simulated hardware imports them in its child)."""
    code = (
        "import sys\n"
        "import agent.commands.run, agent.commands.record, agent.commands.bench\n"
        "import agent.runtime.node_backend, agent.runtime.sinks, agent.transport.sink\n"
        "import agent.runtime.bench_node, agent.runtime.sim_node\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'simulator'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
