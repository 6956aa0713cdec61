"""The Slurm prolog/epilog (packaging/slurm/) run as slurmd would, with a fake job environment:
what they write is read by the real inbox collector and keys the job's GPUs in the real join."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent.collectors.inbox import InboxCollector
from agent.runtime import IdentityJoin
from contract import signals
from contract.trace.records import check_record

SLURM = Path(__file__).resolve().parents[2] / "packaging" / "slurm"
NODE = "gpu-node-07"


def run(script: str, inbox: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": "/usr/bin:/bin", "PROOF_AGENT_INBOX": str(inbox), **env}
    return subprocess.run(
        ["bash", str(SLURM / script)], env=full, capture_output=True, text=True, check=False
    )


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    d = tmp_path / "inbox"
    d.mkdir(mode=0o1733)
    return d


def records(inbox: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for path in sorted(inbox.glob("*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines())
    return out


def test_prolog_announces_gpus_before_any_process_and_epilog_ends_them(inbox: Path) -> None:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_GPUS": "0,2-3",
        "SLURM_JOB_USER": 'al"ice\\',
        "SLURM_JOB_ACCOUNT": "project-a",
        "SLURM_JOB_PARTITION": "gc3-h100",
    }
    done = run("proof-prolog.sh", inbox, **env)
    assert done.returncode == 0, done.stderr
    [rec] = records(inbox)
    assert check_record(rec) is None
    assert rec["job"] == "4242"
    assert rec["scheduler"] == "slurm"
    assert rec["state"] == "running"
    assert rec["slurm_user"] == 'al"ice\\'
    assert rec["slurm_partition"] == "gc3-h100"
    assert rec["allocation"] == {"gpu_indices": [0, 2, 3]}
    assert rec["config"] == {"gpu_indices": [0, 2, 3], "gpu_source": "SLURM_JOB_GPUS"}
    assert not list(inbox.glob(".*")), "the temporary file was left behind"

    # The running agent: the inbox collector passes it on, the join keys GPU 2's samples.
    collector = InboxCollector(inbox)
    join = IdentityJoin(NODE)
    join.learn_gpu("GPU-cccc", 2)
    batch = collector.collect(10.0)
    sample = {"type": "sample", "ts": 10.0, "name": "gpu.util", "value": 0.0, "gpu_index": 2}
    other = {"type": "sample", "ts": 10.0, "name": "gpu.util", "value": 0.0, "gpu_index": 1}
    join.apply([*batch, sample, other], 10.0)
    assert sample[signals.JOB] == "4242"
    assert sample[signals.GPU] == "GPU-cccc"
    assert signals.JOB not in other

    done = run("proof-epilog.sh", inbox, SLURM_JOB_ID="4242")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in inbox.glob("*.jsonl")] == ["slurm-4242.stop.jsonl"]
    join.apply(collector.collect(20.0), 20.0)
    later = {"type": "sample", "ts": 21.0, "name": "gpu.util", "value": 0.0, "gpu_index": 2}
    join.apply([later], 21.0)
    assert signals.JOB not in later


def test_gpus_from_the_cgroup_v1_devices_list(inbox: Path, tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    devices = cgroup / "devices/slurm/uid_1000/job_77"
    devices.mkdir(parents=True)
    # nvidia1 and nvidia5, nvidiactl (255), nvidia-uvm (another major) and a block device.
    (devices / "devices.list").write_text(
        "c 195:1 rwm\nc 195:5 rwm\nc 195:255 rwm\nc 508:0 rwm\nb 8:0 r\n"
    )
    done = run(
        "proof-prolog.sh",
        inbox,
        SLURM_JOB_ID="77",
        SLURM_JOB_UID="1000",
        PROOF_CGROUP_ROOT=str(cgroup),
    )
    assert done.returncode == 0, done.stderr
    [rec] = records(inbox)
    assert rec["allocation"] == {"gpu_indices": [1, 5]}
    assert rec["config"] == {"gpu_indices": [1, 5], "gpu_source": "cgroup"}


def test_no_gpus_known_is_an_empty_allocation(inbox: Path) -> None:
    done = run("proof-prolog.sh", inbox, SLURM_JOB_ID="78")
    assert done.returncode == 0
    [rec] = records(inbox)
    assert rec["allocation"] == {"gpu_indices": []}
    assert check_record(rec) is None


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"SLURM_JOB_ID": "12; rm -rf /"}, "is not a Slurm job id"),
        ({}, "is not a Slurm job id"),
        ({"SLURM_JOB_ID": "12", "SLURM_JOB_GPUS": "0,$(reboot)"}, "not a list of GPU indices"),
    ],
)
def test_bad_environment_is_named_and_never_fails_the_job(
    inbox: Path, env: dict[str, str], said: str
) -> None:
    done = run("proof-prolog.sh", inbox, **env)
    assert done.returncode == 0  # a failing prolog would drain the node
    assert said in done.stderr
    for rec in records(inbox):  # a bad GPU list still announces the job, without GPUs
        assert rec["allocation"] == {"gpu_indices": []}


def test_no_agent_inbox_is_said_and_exits_zero(tmp_path: Path) -> None:
    done = run("proof-prolog.sh", tmp_path / "missing", SLURM_JOB_ID="5", SLURM_JOB_GPUS="0")
    assert done.returncode == 0
    assert "no agent inbox" in done.stderr
    assert not (tmp_path / "missing").exists()


def test_an_array_job_id_is_accepted(inbox: Path) -> None:
    done = run("proof-prolog.sh", inbox, SLURM_JOB_ID="900_3", SLURM_JOB_GPUS="1")
    assert done.returncode == 0, done.stderr
    [rec] = records(inbox)
    assert rec["job"] == "900_3"


def test_scripts_are_executable() -> None:
    for name in ("proof-prolog.sh", "proof-epilog.sh"):
        assert os.access(SLURM / name, os.X_OK), name


def test_installed_layout_finds_the_common_part_or_says_so(inbox: Path, tmp_path: Path) -> None:
    # Copied alone (as into /etc/slurm/prolog.d), without the common part anywhere it looks:
    # said, exit 0, nothing written (a real node has it in /usr/local/lib/proof-agent).
    alone = tmp_path / "prolog.d"
    alone.mkdir()
    script = alone / "50-proof.sh"
    script.write_text((SLURM / "proof-prolog.sh").read_text())
    if Path("/usr/local/lib/proof-agent/proof-slurm-common.sh").exists():
        pytest.skip("this machine has the common part installed")
    done = subprocess.run(
        ["bash", str(script)],
        env={"PATH": "/usr/bin:/bin", "PROOF_AGENT_INBOX": str(inbox), "SLURM_JOB_ID": "9"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert "proof-slurm-common.sh not found" in done.stderr
    assert records(inbox) == []
