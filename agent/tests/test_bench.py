"""`proof-agent bench` (no flags): the collection path of a simulated 8-GPU node through the
real transport into a loopback ack server, measured. Short runs here; the figures in
docs/agent.md come from the default 60 s run."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from agent.cli import main as agent_main
from agent.runtime.bench_node import _warm_and_max

# The bench in a process of its own, as `proof-agent bench` runs it: the suite's process holds
# whatever earlier tests loaded (a local model, torch), and the bench's peak RSS is its own
# image's VmHWM (getrusage's maxrss carried the 1,068 MiB parent across fork and exec).
_RUN = (
    "import dataclasses, json; from agent.runtime.bench_node import bench_node; "
    "print(json.dumps(dataclasses.asdict(bench_node(duration_s=3, ebpf=False))))"
)


def test_collection_bench_delivers_everything_and_reports_its_cost() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RUN], capture_output=True, text=True, timeout=120, check=True
    )
    result = SimpleNamespace(**json.loads(out.stdout.strip().splitlines()[-1]))
    assert result.ticks >= 3 and result.late_ticks == 0
    # 8 GPUs' NVML fields and the whole DCGM table (per-link NVLink included) through the
    # real DcgmCollector, per-pid cuda/nccl, IB ports, NFS/disk, host
    assert result.series > 1500
    assert {"dcgm", "sim.nvml", "infiniband", "storage", "host", "logtail"} <= set(
        result.collectors
    )
    # an H100 has no video encoder, page retirement or vGPU license: 5 fields x 8 GPUs skipped
    assert result.dcgm_unsupported == 40
    assert result.rss_start_mib > 10 and result.rss_end_mib > 10
    # a 3 s run has no sample after warm-up: the end's RSS stands in, and bounds the highest
    assert result.rss_warm_mib == result.rss_end_mib <= result.rss_max_run_mib
    # everything went through the spool and was acked by the server process
    assert result.spool_pending == 0
    assert result.batches_acked == result.ticks
    assert result.samples_acked > result.series
    assert 0 < result.cpu_s < result.wall_s
    assert 10 < result.peak_rss_mib < 1024
    assert result.collector_cpu_s["infiniband"] > 0


def test_bench_command_prints_series_cores_and_rss(capsys: pytest.CaptureFixture[str]) -> None:
    assert agent_main(["bench", "--no-ebpf", "--duration", "2"]) == 0
    out = capsys.readouterr().out
    assert "series:" in out and " cores" in out and "peak RSS:" in out
    assert "uprobe cost" not in out


def test_rss_after_warm_up_is_the_first_sample_past_a_minute_and_the_max_counts_the_end() -> None:
    samples = [(10.0, 50.0), (59.9, 53.0), (60.1, 51.0), (70.0, 52.5)]
    assert _warm_and_max(samples, end_mib=51.5) == (51.0, 53.0)
    assert _warm_and_max(samples, end_mib=54.0) == (51.0, 54.0)
    assert _warm_and_max([(10.0, 50.0)], end_mib=49.0) == (49.0, 50.0)
