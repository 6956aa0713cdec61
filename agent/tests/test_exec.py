"""`proof-agent exec` with real subprocesses: tee unchanged, records, exit codes, signals, and
the job a run is without a scheduler (exec's own id, passed to the command, joined by the node
agent's identity collector on the real /proc; ranks found under a launcher)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent.collectors.identity import IdentityCollector, ProcessIdentity
from agent.collectors.nvml import GpuRef
from agent.commands.exec import is_launcher, out_path
from agent.tests.exec_env import analyze_json, job_free_env
from contract.trace.reader import TraceReader, validate_trace

AGENT = [sys.executable, "-c", "import sys; from agent.cli import main; sys.exit(main())"]

SCRIPT = r"""
import sys
print("step 1 loss 2.5")
sys.stderr.write("warning: something\n")
print("iter 10: loss 4.8186, time 120.00ms, mfu 12.00%")
sys.stdout.write("ünïcode \xff tail without newline")
sys.exit(3)
"""


_env = job_free_env


def _records(path: Path) -> list[dict[str, Any]]:
    return list(TraceReader(path).dicts())


def test_tee_record_and_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "job-5.jsonl"
    env = _env(SLURM_JOB_ID="4242", RANK="5", LOCAL_RANK="1", WORLD_SIZE="16")
    template = str(tmp_path / "job-{rank}.jsonl")
    proc = subprocess.run(
        [*AGENT, "exec", "--out", template, "--node", "n1", "--", sys.executable, "-c", SCRIPT],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 3
    # what the command wrote reaches our stdout/stderr byte for byte
    assert proc.stdout == (
        b"step 1 loss 2.5\niter 10: loss 4.8186, time 120.00ms, mfu 12.00%\n"
        + "ünïcode \xff tail without newline".encode()
    )
    assert proc.stderr == b"warning: something\n"

    report = validate_trace(out)
    assert report.ok, report.problems
    recs = _records(out)
    types = [r["type"] for r in recs]
    assert types[0] == "process" and types[-1] == "exit"
    process, exit_rec = recs[0], recs[-1]
    assert (process["job"], process["rank"], process["local_rank"], process["world_size"]) == (
        "4242",
        5,
        1,
        16,
    )
    assert process["node"] == "n1" and process["cmd"][0] == sys.executable
    child_pid = process["pid"]
    assert exit_rec["exit_code"] == 3 and exit_rec["pid"] == child_pid
    logs = [r for r in recs if r["type"] == "log"]
    assert [(r["stream"], r["line"]) for r in logs if r["stream"] == "stdout"] == [
        ("stdout", "step 1 loss 2.5"),
        ("stdout", "iter 10: loss 4.8186, time 120.00ms, mfu 12.00%"),
        ("stdout", "ünïcode \xff tail without newline"),
    ]
    assert [r["line"] for r in logs if r["stream"] == "stderr"] == ["warning: something"]
    for r in logs:
        assert (r["job"], r["rank"], r["pid"], r["node"]) == ("4242", 5, child_pid, "n1")
    # the nanoGPT progress line is understood: step and loss parsed
    nano = next(r for r in logs if r["line"].startswith("iter 10"))
    assert nano["step"] == 10 and nano["parsed"]["loss"] == 4.8186


def test_command_killed_by_signal_kills_exec_the_same_way(tmp_path: Path) -> None:
    out = tmp_path / "killed.jsonl"
    proc = subprocess.run(
        [
            *AGENT,
            "exec",
            "--out",
            str(out),
            "--",
            sys.executable,
            "-c",
            "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGKILL)",
        ],
        capture_output=True,
        env=_env(),
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout == b"bye\n"
    recs = _records(out)
    exit_rec = recs[-2]
    assert exit_rec["type"] == "exit"
    assert exit_rec["exit_code"] == 128 + signal.SIGKILL
    assert exit_rec["labels"]["signal"] == "SIGKILL"
    # no scheduler: exec's own job ends cancelled, with the shell's exit code
    job_end = recs[-1]
    assert (job_end["type"], job_end["state"], job_end["exit_code"]) == (
        "job",
        "cancelled",
        128 + signal.SIGKILL,
    )
    assert job_end["job"] == exit_rec["job"]


def test_sigterm_is_forwarded_to_the_command(tmp_path: Path) -> None:
    out = tmp_path / "term.jsonl"
    script = (
        "import signal, sys, time\n"
        "def h(*_):\n"
        "    print('got TERM', flush=True); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, h)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [*AGENT, "exec", "--out", str(out), "--", sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=_env(),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    rest, _err = proc.communicate(timeout=30)
    assert proc.returncode == 7
    assert rest == b"got TERM\n"
    recs = _records(out)
    exits = [r for r in recs if r["type"] == "exit"]
    assert [r["exit_code"] for r in exits] == [7]
    assert (recs[-1]["type"], recs[-1]["state"], recs[-1]["exit_code"]) == ("job", "failed", 7)
    assert "got TERM" in [r.get("line") for r in recs]


def test_inbox_and_missing_command(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    proc = subprocess.run(
        [*AGENT, "exec", "--inbox", str(inbox), "--", sys.executable, "-c", "print('hi')"],
        capture_output=True,
        env=_env(),
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == b"hi\n"
    files = list(inbox.glob("exec-*.jsonl"))
    assert len(files) == 1
    assert [r["type"] for r in _records(files[0])] == ["job", "process", "log", "exit", "job"]

    missing = subprocess.run(
        [*AGENT, "exec", "--out", str(tmp_path / "x.jsonl"), "--", "/nonexistent/cmd"],
        capture_output=True,
        env=_env(),
        timeout=60,
    )
    assert missing.returncode == 127
    assert b"cannot run '/nonexistent/cmd'" in missing.stderr


def _stat_start(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()[19]


def _boot8() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]


def _analyze_json(*paths: Path) -> dict[str, Any]:
    return analyze_json(*paths, env=_env())


WAITS = (
    "import os, sys\n"
    "print(os.getpid(), os.environ['PROOF_JOB_ID'], os.environ['PROOF_JOB_SCHEDULER'], flush=True)\n"
    "sys.stdin.readline()\n"
    "for i in (10, 20, 30):\n"
    "    print(f'iter {i}: loss {5.0 - i / 10:.4f}, time 100.00ms, mfu 10.00%', flush=True)\n"
)


def test_no_scheduler_the_run_is_execs_job_and_the_agent_joins_it(tmp_path: Path) -> None:
    """No Slurm, no torchrun: the job is exec's own (node, exec's pid and /proc start time,
    boot id), passed to the command as PROOF_JOB_ID; the node agent's identity collector,
    reading the command's real /proc/<pid>/environ, keys it with the same id."""
    out = tmp_path / "run.jsonl"
    proc = subprocess.Popen(
        [*AGENT, "exec", "--out", str(out), "--node", "n1", "--", sys.executable, "-c", WAITS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    child_pid_s, job, scheduler = proc.stdout.readline().decode().split()
    child_pid = int(child_pid_s)
    assert job == f"exec-n1-{proc.pid}-{_stat_start(proc.pid)}-{_boot8()}"
    assert scheduler == "proof-exec"
    agent_view = IdentityCollector(node="n1", gpu_pids=lambda: {child_pid: [GpuRef("GPU-x", 0)]})
    seen = [r for r in agent_view.collect(time.time()) if r["type"] == "process"]
    assert [(r["pid"], r["job"]) for r in seen] == [(child_pid, job)]
    proc.stdin.write(b"\n")
    proc.stdin.close()
    proc.stdout.read()
    assert proc.wait(timeout=60) == 0

    recs = _records(out)
    assert validate_trace(out).ok
    assert {r["job"] for r in recs if r["type"] != "meta"} == {job}
    process = next(r for r in recs if r["type"] == "process")
    assert (process["pid"], process["rank"], process["local_rank"]) == (child_pid, 0, 0)
    assert process["world_size"] == 1
    jobs = [r for r in recs if r["type"] == "job"]
    assert [(j.get("state"), j.get("kind"), j.get("exit_code")) for j in jobs] == [
        ("running", None, None),
        ("running", "training", None),  # its first training-progress line
        ("completed", "training", 0),
    ]
    # every record says all exec knows (ingest applies a batch's last record of a job)
    for j in jobs:
        assert (j["scheduler"], j["nodes"], j["name"]) == (
            "proof-exec",
            ["n1"],
            os.path.basename(sys.executable),
        )

    doc = _analyze_json(out)
    assert doc["verdicts"] == []
    (summary,) = doc["jobs"]
    assert {k: summary[k] for k in ("job", "kind", "state", "exit_code", "ranks", "steps")} == {
        "job": job,
        "kind": "training",
        "state": "completed",
        "exit_code": 0,
        "ranks": [0],
        "steps": {"first": 10, "last": 30, "count": 3, "logged": 3},
    }
    assert summary["interval"]["start"] == jobs[0]["ts"]
    assert summary["interval"]["end"] == jobs[-1]["ts"]


FAKE_LAUNCHER = r"""
import os, subprocess, sys
rank_code = (
    "import os, time; time.sleep(1.8); r = os.environ['RANK']; print('rank', r, flush=True); "
    "print(f'[rank{r}]: prefixed', flush=True)"
)
kids = [
    subprocess.Popen(
        [sys.executable, "-c", rank_code],
        env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"},
    )
    for r in (0, 1)
]
sys.exit(max(k.wait() for k in kids))
"""


def test_ranks_under_a_launcher_are_found_and_recorded(tmp_path: Path) -> None:
    """A command that starts processes with ranks of their own (what torchrun does) is a
    launcher: exec finds its ranks in /proc and records them under its job."""
    out = tmp_path / "l.jsonl"
    proc = subprocess.run(
        [*AGENT, "exec", "--out", str(out), "--", sys.executable, "-c", FAKE_LAUNCHER],
        capture_output=True,
        env=_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    recs = _records(out)
    job = recs[1]["job"]
    assert job.startswith("exec-")
    procs = [r for r in recs if r["type"] == "process"]
    launcher, ranks = procs[0], sorted(procs[1:], key=lambda r: r["rank"])
    # not a launcher by name: rank 0 of its own at first, until its ranks show up…
    assert launcher["rank"] == 0
    assert [(r["job"], r["rank"], r["local_rank"], r["world_size"]) for r in ranks] == [
        (job, 0, 0, 2),
        (job, 1, 1, 2),
    ]
    ended = [r for r in recs if r.get("name") == "process_gone" or r["type"] == "exit"]
    assert {r["pid"] for r in ended} == {launcher["pid"], *(r["pid"] for r in ranks)}
    assert recs[-1]["world_size"] == 2  # the job's end record: the world its ranks said
    # …after which its lines are its ranks', not rank 0's
    lines = {r["line"]: r for r in recs if r["type"] == "log"}
    assert set(lines) == {"rank 0", "rank 1", "[rank0]: prefixed", "[rank1]: prefixed"}
    assert "rank" not in lines["rank 0"] and "rank" not in lines["rank 1"]
    # a launcher prefix names the rank of the line
    assert (lines["[rank0]: prefixed"]["rank"], lines["[rank1]: prefixed"]["rank"]) == (0, 1)
    assert "rank" not in next(
        r for r in recs if r["type"] == "exit" and r["pid"] == launcher["pid"]
    )


def test_out_names_each_ranks_file(tmp_path: Path) -> None:
    """Ranks of a world larger than one never write over each other's --out file."""
    env = _env(TORCHELASTIC_RUN_ID="r1", RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
    proc = subprocess.run(
        [*AGENT, "exec", "--out", str(tmp_path / "t.jsonl.gz"), "--", "true"],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0
    assert b"recording to " + str(tmp_path / "t.rank1.jsonl.gz").encode() in proc.stderr
    (written,) = tmp_path.iterdir()
    assert written.name == "t.rank1.jsonl.gz"
    recs = _records(written)
    assert recs[0]["job"] == "torchelastic-r1" and recs[0]["rank"] == 1
    assert [r["type"] for r in recs] == ["process", "exit"]  # torchrun's job: no job records
    assert re.fullmatch(r"torchelastic-r1", recs[-1]["job"])


def test_out_placeholders_and_launcher_names() -> None:

    ident = ProcessIdentity(pid=1, job="torchelastic-a/b", rank=3, local_rank=1, world_size=8)
    assert out_path("/t/{node}-{job}-{rank}-{local_rank}.jsonl", ident, "n1") == (
        "/t/n1-torchelastic-a_b-3-1.jsonl"
    )
    assert out_path("/t/run.jsonl.gz", ident, "n1") == "/t/run.rank3.jsonl.gz"
    single = ProcessIdentity(pid=1, job="exec-n1-1-2", rank=0, local_rank=0, world_size=1)
    assert out_path("/t/run.jsonl", single, "n1") == "/t/run.jsonl"
    assert is_launcher(["/usr/bin/torchrun", "--nproc_per_node", "2", "t.py"])
    assert is_launcher(["python3", "-m", "torch.distributed.run", "t.py"])
    assert not is_launcher(["python3", "-m", "pytest"]) and not is_launcher(["python", "-m"])
