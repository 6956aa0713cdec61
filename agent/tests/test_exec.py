"""`proof-agent exec` with real subprocesses: tee unchanged, records, exit codes, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent.trace.reader import TraceReader, validate_trace

ROOT = Path(__file__).resolve().parents[2]
AGENT = [sys.executable, "-c", "import sys; from agent.cli import main; sys.exit(main())"]

SCRIPT = r"""
import sys
print("step 1 loss 2.5")
sys.stderr.write("warning: something\n")
print("iter 10: loss 4.8186, time 120.00ms, mfu 12.00%")
sys.stdout.write("ünïcode \xff tail without newline")
sys.exit(3)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK"))
    }
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _records(path: Path) -> list[dict]:
    return list(TraceReader(path).dicts())


def test_tee_record_and_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "job.jsonl"
    env = _env(SLURM_JOB_ID="4242", RANK="5", LOCAL_RANK="1", WORLD_SIZE="16")
    proc = subprocess.run(
        [*AGENT, "exec", "--out", str(out), "--node", "n1", "--", sys.executable, "-c", SCRIPT],
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
    exit_rec = _records(out)[-1]
    assert exit_rec["type"] == "exit"
    assert exit_rec["exit_code"] == 128 + signal.SIGKILL
    assert exit_rec["labels"]["signal"] == "SIGKILL"


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
    assert recs[-1]["exit_code"] == 7
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
    assert [r["type"] for r in _records(files[0])] == ["process", "log", "exit"]

    missing = subprocess.run(
        [*AGENT, "exec", "--out", str(tmp_path / "x.jsonl"), "--", "/nonexistent/cmd"],
        capture_output=True,
        env=_env(),
        timeout=60,
    )
    assert missing.returncode == 127
    assert b"cannot run '/nonexistent/cmd'" in missing.stderr
