"""The real-node backend (`proof-agent run/record --config FILE`): every collector the config
enables, on fixture proc/sys trees, a file standing in for /dev/kmsg, real HTTP endpoints
serving the dcgm-exporter and vLLM fixtures, a real (stand-in) `scontrol` on PATH and the
simulated NVML (the one thing that cannot exist here), run by the real agent loop."""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.nvml_sim import SimulatedNvml
from agent.commands._backend import _assemble_node
from agent.config import parse_config, schema
from agent.runtime import Agent, ManualClock, MemorySink
from agent.runtime.node_backend import NodeBackend
from agent.tests.fakeproc import write_host_files
from agent.tests.fileserver import serve
from agent.tests.ttar import extract
from contract import signals
from contract.trace import check_record
from tests.agentproc import run_python

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
PID = 4242
T0 = 1_700_000_000.0


def fake_proc(root: Path) -> Path:
    """A proc tree: host files, NFS/disk statistics and one Slurm rank-2 training process."""
    proc = root / "proc"
    write_host_files(proc)
    pid = proc / str(PID)
    pid.mkdir()
    fields = ["S", "1"] + ["0"] * 17 + ["123456"] + ["0"] * 30  # field 22 = start time
    (pid / "stat").write_text(f"{PID} (python) " + " ".join(fields) + "\n")
    env = {
        "SLURM_JOB_ID": "777",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "2",
        "SLURM_NTASKS": "8",
        "RANK": "2",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "8",
    }
    (pid / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
    (pid / "cmdline").write_bytes(b"python\0train.py\0")
    (pid / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_777\n")
    return proc


def fake_scontrol(bin_dir: Path, stdout: Path) -> None:
    """A `scontrol` that answers for job 777 the way Slurm prints `show job -o`."""
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f"echo 'JobId=777 JobName=train UserId=alice(1000) JobState=RUNNING NumNodes=1 "
        f"NumTasks=8 StdOut={stdout} StdErr={stdout} ExitCode=0:0'\n"
    )
    script.chmod(0o755)


def node_config(tmp_path: Path, proc: Path, base: str, **over: Any) -> Any:
    sysfs = tmp_path / "sys"
    extract(DATA / "infiniband/sysfs_infiniband_counters_hw_counters_procfs.ttar", sysfs)
    (tmp_path / "kmsg").write_text("")
    (tmp_path / "logs").mkdir()
    data: dict[str, Any] = {
        "agent": {"node": "gpu-node-7"},
        "paths": {"proc_root": str(proc), "sys_root": str(sysfs), "kmsg": str(tmp_path / "kmsg")},
        "dcgm": {"mode": "exporter", "exporter_url": f"{base}/dcgm"},
        "inference": {"discover": False, "endpoints": [f"{base}/vllm"]},
        "logs": {"globs": [str(tmp_path / "logs/*.log")]},
        "spool": {"dir": str(tmp_path / "spool")},
    }
    for section, keys in over.items():
        data.setdefault(section, {}).update(keys)
    return parse_config(data, env={})


ROUTES = {
    "/dcgm": (DATA / "dcgm/dcgm_exporter_metrics_L40S_upcloud.prom").read_bytes(),
    "/vllm": (DATA / "vllm/vllm_metrics_datadog_fixture.prom").read_bytes(),
}


def test_node_backend_every_source_keyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    proc = fake_proc(tmp_path)
    job_out = tmp_path / "slurm-777.out"
    job_out.write_text("")
    fake_scontrol(tmp_path / "bin", job_out)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    nv = SimulatedNvml.with_gpus(2)
    nv.gpus[1].processes = [(PID, 1 << 30)]
    nv.gpus[1].util_gpu = 77
    caplog.set_level(logging.INFO)
    with serve(ROUTES) as base:
        cfg = node_config(tmp_path, proc, base)
        backend = NodeBackend.from_config(
            cfg, nvml=nv, ebpf_status=lambda: (False, "BPF refused (test)")
        )
        assert backend.names == [
            "nvml",
            "kubernetes",
            "identity",
            "exec_inbox",
            "dcgm_exporter",
            "inference",
            "infiniband",
            "storage",
            "kmsg",
            "host",
            "logtail",
        ]
        assert backend.ebpf_reason == "BPF refused (test)"
        facts = backend.node_facts()
        assert [(g["index"], g["uuid"]) for g in facts["gpus"]] == [
            (0, nv.gpus[0].uuid),
            (1, nv.gpus[1].uuid),
        ]
        assert facts["gpus"][0]["memory_mib"] == 80 * 1024 and facts["gpus"][0]["model"]
        assert facts["gpus"][0]["driver_version"] and facts["driver_version"]

        sink = MemorySink()
        clock = ManualClock(T0)
        agent = Agent(backend.collectors, sink, clock=clock, node=backend.node)
        agent.tick()
        # Between ticks: the kernel reports an XID on GPU 1 naming the training pid, the job
        # writes to its Slurm StdOut, a glob-matched log appears, the host CPU moves.
        bus = "0000:28:00"  # the simulated GPU 1's PCI bus id (NVML 00000000:28:00.0)
        (tmp_path / "kmsg").write_text(
            f"NVRM: Xid (PCI:{bus}): 79, pid={PID}, name=python, GPU has fallen off the bus.\n"
        )
        job_out.write_text((DATA / "training/megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log").read_text())
        shutil.copy(
            DATA / "training/nanogpt_shakespeare_char_with_checkpoint_saves.log",
            tmp_path / "logs/nanogpt.log",
        )
        (proc / "stat").write_text("cpu  40 0 10 110 0 0 0 0 0 0\nbtime 1700000000\n")
        for _ in range(3):
            clock.advance(5.0)  # past the log tail's 10 s glob rescan
            agent.tick()
        agent.close()

    recs = sink.records
    assert all(check_record(r) is None for r in recs), [check_record(r) for r in recs][:3]
    assert not [r for r in recs if r.get("name") == signals.EVENT_COLLECTOR_ERROR]
    assert all(r.get("node") == "gpu-node-7" for r in recs if r["type"] != "job")

    def named(name: str) -> list[dict[str, Any]]:
        return [r for r in recs if r.get("name") == name]

    # NVML: per GPU, GPU 1 keyed with the job and rank of the process using it
    util = [r for r in named(signals.DCGM_FI_DEV_GPU_UTIL) if r.get("gpu") == nv.gpus[1].uuid]
    assert util and util[-1]["value"] == 77
    assert (util[-1]["job"], util[-1]["rank"], util[-1]["local_rank"]) == ("777", 2, 2)
    assert all("job" not in r for r in recs if r.get("gpu") == nv.gpus[0].uuid)
    procs = [r for r in recs if r["type"] == "process"]
    assert [(p["pid"], p["job"], p["rank"]) for p in procs] == [(PID, "777", 2)]
    # Slurm job record from scontrol, and its StdOut followed by the log tail, keyed to the job
    jobs = [r for r in recs if r["type"] == "job"]
    assert jobs and jobs[0]["job"] == "777" and jobs[0]["config"]["stdout"] == str(job_out)
    job_logs = [r for r in recs if r["type"] == "log" and r.get("job") == "777"]
    assert len(job_logs) > 10
    steps = [r for r in job_logs if (r.get("parsed") or {}).get("kind") == "progress"]
    assert steps, "training progress parsed from the job's StdOut"
    # the configured glob
    assert [r for r in recs if r["type"] == "log" and r.get("file", "").endswith("nanogpt.log")]
    # kernel log: XID on GPU 1 through NVML's PCI bus id; the pid gives job and rank
    xids = named(signals.EVENT_XID)
    assert len(xids) == 1 and xids[0]["value"] == 79
    assert xids[0]["gpu"] == nv.gpus[1].uuid and xids[0]["job"] == "777"
    # the other sources
    for name in (
        signals.DCGM_FI_DEV_POWER_USAGE,  # dcgm-exporter
        signals.VLLM_NUM_REQUESTS_RUNNING,  # inference endpoint
        signals.IB_PORT_XMIT_DATA,
        signals.STORAGE_READ_BYTES,
        signals.HOST_CPU_UTIL,
        signals.HOST_MEM_USED_BYTES,
    ):
        assert named(name), name
    # eBPF off: said once, with the reason
    said = [r for r in caplog.records if "eBPF collectors off" in r.getMessage()]
    assert len(said) == 1 and "BPF refused (test)" in said[0].getMessage()


def test_unreadable_source_reported_once_others_keep_going(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = fake_proc(tmp_path)
    nv = SimulatedNvml.with_gpus(1)
    with serve(ROUTES) as base:
        cfg = node_config(
            tmp_path,
            proc,
            base,
            paths={"kmsg": str(tmp_path / "no-such-kmsg")},
            slurm={"enabled": False},
            ebpf={"enabled": False},
        )
        backend = NodeBackend.from_config(cfg, nvml=nv)
        assert backend.ebpf_reason == "[ebpf] enabled = false"
        sink = MemorySink()
        clock = ManualClock(T0)
        agent = Agent(backend.collectors, sink, clock=clock, node=backend.node)
        caplog.set_level(logging.INFO)
        for _ in range(5):
            agent.tick()
            clock.advance(1.0)
        agent.close()
    said = [r for r in caplog.records if "no-such-kmsg" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    last = {r.get("name") for r in sink.records if r["ts"] == T0 + 4}
    for name in (
        signals.DCGM_FI_DEV_GPU_UTIL,
        signals.DCGM_FI_DEV_POWER_USAGE,
        signals.IB_PORT_XMIT_DATA,
        signals.STORAGE_READ_BYTES,
        signals.HOST_MEM_USED_BYTES,
    ):
        assert name in last, name


def test_assembled_meta_and_interval_from_config(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path)
    with serve(ROUTES) as base:
        cfg = node_config(tmp_path, proc, base, agent={"interval_s": 2.0})
    path = tmp_path / "agent.toml"
    path.write_text(_toml(cfg))
    args = argparse.Namespace(
        config=str(path), scenario=None, node=None, interval=None, duration=10.0
    )
    nv = SimulatedNvml.with_gpus(2)
    assembled = _assemble_node(
        args, clock=ManualClock(T0), nvml=nv, ebpf_status=lambda: (False, "x")
    )
    assert assembled.interval == 2.0 and assembled.until == T0 + 10.0
    assert assembled.node == "gpu-node-7" and assembled.meta["backend"] == "node"
    assert [g["uuid"] for g in assembled.meta["gpus"]] == [g.uuid for g in nv.gpus]
    assert "kmsg" in assembled.meta["collectors"]


def _toml(cfg: Any) -> str:
    lines: list[str] = []
    for section, keys in schema().items():
        lines.append(f"[{section}]")
        for key in keys:
            lines.append(f"{key} = {json.dumps(getattr(getattr(cfg, section), key))}")
    return "\n".join(lines) + "\n"


def test_record_cli_on_fixture_roots(tmp_path: Path) -> None:
    """`proof-agent record --config` end to end in a subprocess: the real pynvml (no driver
    here: reported, the agent goes on) and every file source on the fixture roots."""
    proc = fake_proc(tmp_path)
    with serve(ROUTES) as base:
        cfg = node_config(tmp_path, proc, base, slurm={"enabled": False})
        path = tmp_path / "agent.toml"
        path.write_text(_toml(cfg))
        out = tmp_path / "node.jsonl.gz"
        argv = ["record", "--config", str(path), "--out", str(out), "--duration", "2"]
        done = run_python(
            ["-m", "agent.cli", *argv], env={"PROOF_AGENT_EBPF_ENABLED": "false"}, timeout=60
        )
    assert done.returncode == 0, done.stderr
    with gzip.open(out, "rt") as fh:
        rows = [json.loads(line) for line in fh]
    names = {r.get("name") for r in rows}
    for name in (
        signals.IB_PORT_XMIT_DATA,
        signals.HOST_MEM_USED_BYTES,
        signals.VLLM_NUM_REQUESTS_RUNNING,
    ):
        assert name in names, name
    assert "NVML unavailable" in done.stderr or "nvml" in done.stderr.lower()
