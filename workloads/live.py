"""The live path for a workload: the node agent on this machine → gRPC → ingest → the live
pipeline (`evaluate_job`), verdicts read back from the database.

    with NodeAgent(workdir, ingest_port, token) as agent:   # `proof-agent run --config …`
        run = agent.exec("hf", program("hf_trainer", …))   # `proof-agent exec --inbox …`
    seen = evaluate_live(operator_id)                       # what beat + a worker would do

`NodeAgent` starts the real `proof-agent run` as a subprocess with the node backend (the
default) and a config written here: NVML enabled (no GPU here: the agent reports NVML
unavailable once and carries on, as on any GPU-less node), DCGM off, eBPF off (its uprobes
attach to libcuda/libnccl and its output capture follows GPU processes — a CPU-only run has
neither), storage, host CPU/memory, kernel log and the exec inbox on. It streams to the
test's ingest server over gRPC and also writes what it sent to a trace (`--out`), so the same
records can be given to `proof analyze`. A job's output reaches it the way production output
does on a node without GPU processes: `proof-agent exec --inbox` writes each command's lines
to the inbox, the agent tails them and ships them with its own readings.

`evaluate_live` runs the periodic fan-out's query (`jobs_due_for_evaluation`) and the
`investigations.evaluate_job` task for each due job of the operator, then reads the jobs and
their incidents back — what a Celery worker would have done, in this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from workloads.harness import PROOF_AGENT, ROOT, Record, Run, read_trace, run_command, run_env

AGENT_CONFIG = """\
# proof-agent config for a CPU-only workload run (workloads/live.py)
[agent]
interval_s = 1.0
log_level = "info"

[server]
address = "127.0.0.1:{port}"
token = "{token}"
tls = false

[spool]
dir = "{spool}"

[nvml]
enabled = true

[dcgm]
mode = "off"

[ebpf]
enabled = false

[slurm]
enabled = false
"""


class NodeAgent:
    """`proof-agent run --config CFG --out TRACE` for the duration of a `with` block."""

    def __init__(self, workdir: Path, port: int, token: str, *, ready_timeout: float = 90.0):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spool = workdir / "spool"
        self.inbox = workdir / "inbox"  # the agent's inbox is <spool dir>/../inbox
        self.trace = workdir / "node-agent.jsonl"
        self.config = workdir / "proof-agent.toml"
        self.config.write_text(AGENT_CONFIG.format(port=port, token=token, spool=self.spool))
        self.log = workdir / "node-agent.log"
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.rc: int | None = None
        self.runs: list[Run] = []

    def __enter__(self) -> NodeAgent:
        self.inbox.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROOF_AGENT, "run", "--config", str(self.config), "--out", str(self.trace)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=run_env(),
                cwd=ROOT,
            )
        deadline = time.monotonic() + self.ready_timeout
        # Ready: the agent has collected and written its first intervals.
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"proof-agent run exited {self.proc.returncode}:\n{self.output()}"
                )
            if self.trace.exists() and self.trace.stat().st_size > 0 and len(self.records()) > 3:
                return self
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(
            f"proof-agent run wrote nothing in {self.ready_timeout} s:\n{self.output()}"
        )

    def exec(
        self, name: str, argv: Sequence[str], *, timeout: float = 300.0, wrapped: bool = False
    ) -> Run:
        """`proof-agent exec --inbox INBOX -- ARGV` (or ARGV as given when `wrapped`: a
        torchrun command that starts `proof-agent exec` per worker itself)."""
        cmd = list(argv) if wrapped else [*self.exec_prefix(), *argv]
        done = run_command(cmd, timeout=timeout, env=run_env())
        run = Run(name, cmd, done.rc, done.wall_s, done.stdout, done.stderr, None)
        self.runs.append(run)
        return run

    def exec_prefix(self) -> list[str]:
        return [PROOF_AGENT, "exec", "--inbox", str(self.inbox), "--"]

    def records(self) -> list[Record]:
        return read_trace(self.trace) if self.trace.exists() else []

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is None:
            return
        # The inbox collector deletes a file once it has read its `exit` record: wait for
        # that, then two more intervals so the last batch is cut, then stop the agent (it
        # flushes and waits for ingest's acks before exiting).
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and any(self.inbox.glob("*.jsonl")):
            time.sleep(0.5)
        time.sleep(2.5)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.rc = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.rc = self.proc.wait()


@dataclass
class LiveJob:
    job_id: str
    state: str
    world_size: int | None
    exit_code: int | None
    nodes: list[str]
    ranks: list[int]  # the job's ranks ingest stored (JobRank)
    families: list[str]
    incidents: list[dict[str, Any]] = field(default_factory=list)  # the stored verdicts

    def said(self) -> str:
        if not self.incidents:
            return "no verdict"
        return "; ".join(f"{v['family']}: {v['summary']}" for v in self.incidents)


def evaluate_live(operator_id: int) -> dict[str, LiveJob]:
    """Evaluate every due job of the operator as the live pipeline does; its jobs and
    incidents from the database, by job id."""
    # The server apps only here: the NodeAgent half of this module runs without Django.
    from ingest import selectors as ingest_selectors
    from investigations import selectors, services, tasks
    from investigations.models import Incident
    from tenants.context import tenant_context

    due = [
        pk for op, pk in selectors.jobs_due_for_evaluation(services.ACTIVE_S) if op == operator_id
    ]
    for pk in due:
        status = tasks.evaluate_job(operator_id, pk)
        assert status in ("evaluated", "no_data"), status
    out: dict[str, LiveJob] = {}
    with tenant_context(operator_id):
        for job in ingest_selectors.jobs_oldest_first(operator_id):
            incidents = list(
                Incident.objects.for_tenant(operator_id).filter(job=job).order_by("pk")
            )
            ranks = job.ranks.all()
            out[job.job_id] = LiveJob(
                job.job_id,
                job.state,
                job.world_size,
                job.exit_code,
                list(job.nodes or []),
                sorted({int(r.rank) for r in ranks if r.rank is not None}),
                sorted(i.family for i in incidents),
                [i.verdict for i in incidents],
            )
    return out


def series(records: Sequence[Record], name: str, **labels: str) -> list[Record]:
    """The samples of one signal in a trace, optionally filtered by label values."""
    out = []
    for r in records:
        if r.get("type") != "sample" or r.get("name") != name:
            continue
        got = r.get("labels") or {}
        if all(got.get(k) == v for k, v in labels.items()):
            out.append(r)
    return out
