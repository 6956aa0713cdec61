"""Running the workload programs under the real agent, and reading back what Proof saw.

    run = record_exec("hf-healthy", program("hf_trainer", "--out-dir", d), workdir)
    run.rc, run.families, run.jobs, run.losses()

`record_exec` runs `proof-agent exec --out TRACE -- CMD` (the command a user types) and then
`proof analyze --json TRACE` (the other command a user types), both as subprocesses of the
installed entry points. Nothing here imports Django: the live path (node agent → gRPC →
ingest → evaluate_job) is in `workloads.live`.

The runs get an environment without any scheduler or launcher variables (SLURM_*,
TORCHELASTIC_*, RANK, …), whatever the CI machine exports: the suite checks what Proof makes
of a run nobody scheduled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PYTHON = str(BIN / "python")
PROOF = str(BIN / "proof")
PROOF_AGENT = str(BIN / "proof-agent")
TORCHRUN = str(BIN / "torchrun")

# What launchers and schedulers put in a job's environment; none of it may leak in from the
# machine running the suite (CI under Slurm, a developer inside torchrun…).
SCHEDULER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "PMIX_", "KUBERNETES_", "POD_")
SCHEDULER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MPI_LOCALRANKID",
)

Record = dict[str, Any]


def run_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(SCHEDULER_PREFIXES) and k not in SCHEDULER_VARS
    }
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    env.update(extra or {})
    return env


@dataclass
class Finished:
    rc: int
    stdout: str
    stderr: str
    wall_s: float


def run_command(argv: Sequence[str], *, timeout: float, env: Mapping[str, str]) -> Finished:
    """Run `argv` in its own session from the repository root; past `timeout` the whole
    process group is killed (a hung rank must not outlive the test) and the exit status is
    the shell's 124."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=dict(env),
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[killed after {timeout:.0f} s]"
        rc = 124
    return Finished(rc, out, err, time.monotonic() - t0)


def program(name: str, *args: str) -> list[str]:
    """`python -m workloads.programs.NAME ARGS…`."""
    return [PYTHON, "-m", f"workloads.programs.{name}", *args]


def torchrun(nproc: int, name: str, *args: str, wrap: Sequence[str] = ()) -> list[str]:
    """`torchrun --standalone --nproc-per-node N [--no-python WRAP… python] -m PROGRAM ARGS`.

    `--standalone` picks a free rendezvous port (the suite shares its machine) and a random
    run id, as a single-node run does. With `wrap` (e.g. `proof-agent exec --inbox D --`),
    each worker is started as `WRAP python -m PROGRAM` — the per-rank form of `exec`.
    """
    head = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}"]
    if wrap:
        return [*head, "--no-python", *wrap, PYTHON, "-m", f"workloads.programs.{name}", *args]
    return [*head, "-m", f"workloads.programs.{name}", *args]


def shown(argv: Sequence[str]) -> str:
    """A command as a user would type it in the repository root (docs, failure messages)."""
    out = []
    for a in argv:
        a = a.replace(str(BIN) + "/", "").replace(str(ROOT) + "/", "")
        out.append(a if a and all(c.isalnum() or c in "-_./=:,+" for c in a) else repr(a))
    return " ".join(out)


def read_trace(path: Path) -> list[Record]:
    records: list[Record] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return records


@dataclass
class Analysis:
    """`proof analyze --json` of one trace."""

    rc: int
    output: dict[str, Any]
    stderr: str

    @property
    def verdicts(self) -> list[dict[str, Any]]:
        return list(self.output.get("verdicts") or [])

    @property
    def families(self) -> list[str]:
        return sorted(v["family"] for v in self.verdicts)

    @property
    def jobs(self) -> list[dict[str, Any]] | None:
        """The top-level "jobs" list (issue 9), or None when this build does not print one."""
        jobs = self.output.get("jobs")
        return None if jobs is None else list(jobs)

    def said(self) -> str:
        """What Proof said, for assertion messages and the report."""
        if not self.verdicts:
            return "no verdict"
        return "; ".join(
            f"{v['family']} ({v['category']}, {v['confidence']:.2f}): {v['summary']}"
            for v in self.verdicts
        )


def analyze(trace: Path, timeout: float = 300.0) -> Analysis:
    done = subprocess.run(
        [PROOF, "analyze", "--json", "--no-progress", str(trace)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=run_env({"PROOF_ENV": os.environ.get("PROOF_ENV", "dev")}),
        cwd=ROOT,
        check=False,
    )
    try:
        output = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        output = {"unparsed": done.stdout[-2000:]}
    return Analysis(done.returncode, output, done.stderr[-4000:])


@dataclass
class Run:
    """One workload run: its command, what it printed, its trace and Proof's analysis."""

    name: str
    argv: list[str]
    rc: int
    wall_s: float
    stdout: str
    stderr: str
    trace: Path | None
    analysis: Analysis | None = None

    @property
    def command(self) -> str:
        return shown(self.argv)

    @property
    def families(self) -> list[str]:
        assert self.analysis is not None
        return self.analysis.families

    @property
    def jobs(self) -> list[dict[str, Any]] | None:
        assert self.analysis is not None
        return self.analysis.jobs

    def records(self) -> list[Record]:
        assert self.trace is not None
        return read_trace(self.trace)

    def logs(self) -> list[Record]:
        return [r for r in self.records() if r.get("type") == "log"]

    def losses(self) -> list[float]:
        """The training losses the program printed, in order, as the agent parsed them."""
        out = []
        for r in self.logs():
            loss = (r.get("parsed") or {}).get("loss")
            if isinstance(loss, int | float):
                out.append(float(loss))
        return out

    def output_has(self, text: str) -> bool:
        return text in self.stdout or text in self.stderr

    def describe(self) -> str:
        said = self.analysis.said() if self.analysis is not None else "(not analyzed)"
        err = [ln for ln in self.stderr.replace("\r", "\n").splitlines() if ln.strip()]
        return (
            f"{self.name}: `{self.command}` exit {self.rc}; Proof said: {said}\n"
            f"stdout ends: {self.stdout[-600:]}\nstderr ends: {' | '.join(err[-3:])[-600:]}"
        )


def record_exec(
    name: str,
    argv: Sequence[str],
    workdir: Path,
    *,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    analyze_trace: bool = True,
) -> Run:
    """`proof-agent exec --out WORKDIR/NAME.jsonl -- ARGV`, then `proof analyze --json`."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / f"{name}.jsonl"
    cmd = [PROOF_AGENT, "exec", "--out", str(trace), "--", *argv]
    done = run_command(cmd, timeout=timeout, env=run_env(env))
    run = Run(
        name, cmd, done.rc, done.wall_s, done.stdout, done.stderr, trace if trace.exists() else None
    )
    if analyze_trace and run.trace is not None:
        run.analysis = analyze(run.trace)
    return run


def job_field(job: Mapping[str, Any], *names: str) -> Any:
    """A field of a "jobs" entry by the first of its possible names."""
    for n in names:
        if n in job:
            return job[n]
    return None
