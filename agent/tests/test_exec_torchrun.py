"""Real `torchrun --nproc_per_node 2` runs (gloo, CPU, a few all-reduces) recorded by
`proof-agent exec` both ways round, with no scheduler: one job id for the run, both ranks in
the trace, and `proof analyze --json` listing the job with its ranks, steps and exit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.tests.exec_env import analyze_json, job_free_env
from contract.trace.reader import TraceReader, validate_trace

BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")
PROOF_AGENT = str(BIN / "proof-agent")

pytestmark = pytest.mark.slow

SCRIPT = r"""
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
loss = 3.3
for step in range(1, 6):
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    assert t[0].item() == 3.0  # 1 + 2: both ranks took part
    loss *= 0.7
    if rank == 0:
        print(f"iter {step}: loss {loss:.4f}, time 50.00ms, mfu 1.00%", flush=True)
dist.destroy_process_group()
"""


def _env() -> dict[str, str]:
    env = job_free_env(OMP_NUM_THREADS="1")
    for rendezvous in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(rendezvous, None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(argv, capture_output=True, env=_env(), cwd=cwd, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return proc


def _records(path: Path) -> list[dict[str, Any]]:
    report = validate_trace(path)
    assert report.ok, report.problems
    return list(TraceReader(path).dicts())


def _summary(*paths: Path) -> dict[str, Any]:
    """`proof analyze --json` on the traces: the one job's summary."""
    (job,) = analyze_json(*paths, env=_env())["jobs"]
    return {k: job[k] for k in ("job", "kind", "state", "exit_code", "ranks", "steps")}


def _completed(job: str) -> dict[str, Any]:
    """The summary of the tiny two-rank run, completed: five steps logged."""
    steps = {"first": 1, "last": 5, "count": 5, "logged": 5}
    return {
        "job": job,
        "kind": "training",
        "state": "completed",
        "exit_code": 0,
        "ranks": [0, 1],
        "steps": steps,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(SCRIPT)
    return path


def test_exec_around_torchrun(tmp_path: Path, script: Path) -> None:
    """`proof-agent exec -- torchrun …`: the run is exec's job; torchrun's workers (found under
    it in /proc, keyed by the identity collector from their environment) are its two ranks."""
    out = tmp_path / "run.jsonl"
    cmd = [TORCHRUN, "--nproc_per_node", "2", str(script)]
    proc = _run([PROOF_AGENT, "exec", "--out", str(out), "--", *cmd], tmp_path)
    assert b"iter 5: loss 0.5546" in proc.stdout
    recs = _records(out)
    job = recs[0]["job"]
    assert job.startswith(f"exec-{os.uname().nodename}-")
    assert {r["job"] for r in recs} == {job}
    procs = [r for r in recs if r["type"] == "process"]
    launcher = procs[0]
    assert launcher["cmd"][0] == TORCHRUN and "rank" not in launcher  # torchrun is no rank
    ranks = sorted((r for r in procs[1:]), key=lambda r: r["rank"])
    assert [(r["rank"], r["local_rank"], r["world_size"]) for r in ranks] == [(0, 0, 2), (1, 1, 2)]
    # the workers' own torchrun run id is kept as a label
    assert len({r["labels"]["torchelastic_run_id"] for r in ranks}) == 1
    assert recs[-1]["type"] == "job" and recs[-1]["state"] == "completed"
    assert _summary(out) == _completed(job)


@pytest.mark.parametrize("static", [False, True], ids=["run-id", "static-rendezvous"])
def test_torchrun_around_exec(tmp_path: Path, script: Path, static: bool) -> None:
    """`torchrun --no-python proof-agent exec -- python …`: each rank's exec records its own
    trace (`run.rank<N>.jsonl`) with torchrun's run id as the job — or, for a static rendezvous
    whose run id is `none` for every run, the launcher's pid and start time."""
    rdzv = ["--master-port", str(_free_port())] if static else []
    _run(
        [
            TORCHRUN,
            "--nproc_per_node",
            "2",
            *rdzv,
            "--no-python",
            PROOF_AGENT,
            "exec",
            "--out",
            str(tmp_path / "run.jsonl"),
            "--",
            sys.executable,
            str(script),
        ],
        tmp_path,
    )
    files = sorted(tmp_path.glob("run.rank*.jsonl"))
    assert [f.name for f in files] == ["run.rank0.jsonl", "run.rank1.jsonl"]
    per_rank = [_records(f) for f in files]
    jobs = {r["job"] for recs in per_rank for r in recs}
    assert len(jobs) == 1
    (job,) = jobs
    first = [recs[0] for recs in per_rank]
    assert [(p["type"], p["rank"], p["world_size"]) for p in first] == [
        ("process", 0, 2),
        ("process", 1, 2),
    ]
    run_id = first[0]["labels"]["torchelastic_run_id"]
    if static:
        assert run_id == "none"
        assert job.startswith(f"torchelastic-{os.uname().nodename}-")
    else:
        assert job == f"torchelastic-{run_id}"
    assert [recs[-1]["exit_code"] for recs in per_rank] == [0, 0]
    assert _summary(*files) == _completed(job)
