"""`proof-agent doctor` on this machine (no GPU) and against real local stand-ins."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from agent.commands.doctor import (
    ATTENTION,
    OFF,
    OK,
    UNAVAILABLE,
    Check,
    check_dead_letter,
    check_slurm,
    run_checks,
)
from agent.config import parse_config
from agent.spool import DEAD_LETTER_DIR, DeadLetter
from agent.tests.fileserver import serve

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def _by_source(checks: list[Check]) -> dict[str, Check]:
    return {c.source: c for c in checks}


def test_doctor_runs_here_and_says_why_nvml_is_unavailable() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROOF_AGENT_CONFIG": ""}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from agent.cli import main; sys.exit(main())",
            "doctor",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    checks = {c["source"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["NVML"]["status"] == UNAVAILABLE
    assert checks["NVML"]["detail"] == "libnvidia-ml.so.1 not found — no NVIDIA driver on this node"
    assert checks["DCGM bindings"]["status"] == UNAVAILABLE
    assert "pydcgm.py" in checks["DCGM bindings"]["detail"]
    assert checks["ingest server"]["status"] == OFF
    expected = {
        "NVML",
        "DCGM bindings",
        "dcgm-exporter",
        "eBPF uprobes",
        "libcuda/libnccl",
        "kernel log",
        "InfiniBand/RoCE",
        "storage (mountstats)",
        "Slurm",
        "Kubernetes",
        "inference servers",
        "ingest server",
        "dead letter (refused batches)",
    }
    assert set(checks) == expected
    for c in checks.values():
        assert c["detail"], c  # every status says why


def test_doctor_with_real_local_sources(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    (sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1").mkdir(parents=True)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    (tmp_path / "token").write_text("agent-token\n")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True)
    accepted.start()
    prom = (DATA / "dcgm" / "dcgm_exporter_metrics_L40S_upcloud.prom").read_bytes()
    try:
        with serve({"/metrics": prom}) as base:
            cfg = parse_config(
                {
                    "dcgm": {"mode": "exporter", "exporter_url": f"{base}/metrics"},
                    "paths": {
                        "sys_root": str(sys_root),
                        "kmsg": str(kmsg),
                        "mountstats": str(DATA / "proc" / "mountstats_nfs.txt"),
                        "diskstats": str(DATA / "proc" / "diskstats.txt"),
                    },
                    "inference": {"discover": False, "endpoints": [f"{base}/missing"]},
                    "server": {
                        "address": f"127.0.0.1:{port}",
                        "tls": False,
                        "token_file": str(tmp_path / "token"),
                    },
                    "ebpf": {"enabled": False},
                },
                env={},
            )
            checks = _by_source(run_checks(cfg, timeout=5))
    finally:
        listener.close()
    exporter = checks["dcgm-exporter"]
    assert exporter.status == OK and "profiling" in exporter.detail
    assert checks["DCGM bindings"].status == OFF
    assert checks["InfiniBand/RoCE"].status == OK and "mlx5_0" in checks["InfiniBand/RoCE"].detail
    assert checks["kernel log"].status == OK
    storage = checks["storage (mountstats)"]
    assert storage.status == OK and " 0 NFS" not in storage.detail
    inference = checks["inference servers"]
    assert inference.status == UNAVAILABLE and "404" in inference.detail
    server = checks["ingest server"]
    # A TCP port that is not Proof ingest: reachable, but the token cannot be proven there
    # (tests/test_agent_run_to_ingest.py and the doctor's Register path cover a real server).
    assert server.status == UNAVAILABLE and "reachable" in server.detail
    assert "Register call failed" in server.detail and "token refused" not in server.detail
    assert checks["eBPF uprobes"].status == OFF


def test_unreachable_server_and_missing_token(tmp_path: Path) -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    cfg = parse_config(
        {
            "server": {"address": f"127.0.0.1:{port}", "token": "t", "tls": False},
            "ebpf": {"enabled": False},
        },
        env={},
    )
    server = _by_source(run_checks(cfg, timeout=2))["ingest server"]
    assert server.status == UNAVAILABLE and "refused" in server.detail.lower()
    cfg = parse_config({"server": {"address": "127.0.0.1:1"}, "ebpf": {"enabled": False}}, env={})
    server = _by_source(run_checks(cfg, timeout=2))["ingest server"]
    assert server.status == UNAVAILABLE and "no token" in server.detail


def test_slurm_found_or_not() -> None:
    cfg = parse_config({}, env={})
    assert check_slurm(cfg, which=lambda c: None).status == UNAVAILABLE
    assert check_slurm(cfg, which=lambda c: f"/usr/bin/{c}").detail == "scontrol, sacct found"


def test_dead_letter_is_reported_for_the_operator(tmp_path: Path) -> None:
    cfg = parse_config({"spool": {"dir": str(tmp_path / "spool")}}, env={})
    quiet = check_dead_letter(cfg)
    assert quiet.status == OK and quiet.detail.endswith(": none")
    assert not (tmp_path / "spool").exists()  # doctor creates nothing
    dead = DeadLetter(tmp_path / "spool" / DEAD_LETTER_DIR)
    dead.add(7, b"\x00junk", "log 0: NUL character at position 1", agent_id="a1")
    dead.add(9, b"\x01junk", "batch over the size limit", agent_id="a1")
    loud = check_dead_letter(cfg)
    assert loud.status == ATTENTION
    assert "2 batch(es) refused" in loud.detail and "#9: batch over the size limit" in loud.detail
    assert "proof-agent validate" in loud.detail
