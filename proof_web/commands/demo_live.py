"""The live part of `proof demo`: ingest, the in-process task runner and simulated agents.

    LiveDemo(operator_id, ...).start()   # ingest gRPC on loopback, task runner, agents
    ...                                  # daphne serves the web meanwhile (main thread)
    demo.stop()

- **Ingest**: `ingest.server.IngestServer` on 127.0.0.1 (an ephemeral port unless given).
- **Tasks**: `proof_web.runner.TaskRunner`, the embedded default's beat and worker: every
  periodic task of proof_web/schedule.py at its own period (the job fan-out every 15 s, fleet
  health every 10 min, …) and a small Celery worker pool in this process that runs what they
  and the services enqueue — `evaluate_job` after each debounced ingest announcement, as in
  production. With a real broker (REDIS_URL) the demo starts no runner: the worker and beat
  processes evaluate.
- **Agents**: one `proof-agent run --backend sim --node N` process per simulated node of each
  scenario (4 GPUs a node; a scenario's neighbour job or rerun adds a node) — the agent an
  operator runs on each node, with the simulated-hardware backend for collectors —
  shipping over gRPC with the agent's own transport to the ingest above, authenticated with a
  fresh agent token of the demo operator. An accelerated run ends about now, so its
  timestamps are never in the future. Each agent's output goes to
  `PROOF_DATA_DIR/demo-agents/<scenario>-<node>.log`.
- **Printing**: a subscriber of the notification hook prints each verdict as it appears.

The methods import Django's modules (models, ingest, the runner) where they use them:
`proof demo` imports this module for `DEMO_SCENARIOS` to build its arguments, before
`django.setup()`.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, TextIO

import simulator

# The four reference cases of docs/design.md §1, then the healthy control (seed 1 checked to show each).
REFERENCE_SCENARIOS: tuple[str, ...] = (
    "sequence_imbalance",
    "checkpoint_stall",
    "underfilled_batches",
    "numerical_divergence",
)
HEALTHY_SCENARIO = "healthy_training"
DEMO_SCENARIOS: tuple[str, ...] = (*REFERENCE_SCENARIOS, HEALTHY_SCENARIO)
AGENT_TOKEN_NAME = "proof demo agents"  # noqa: S105 - the token's display name, not a secret
AGENT_NODES = 1
AGENT_GPUS_PER_NODE = 4
# USD per GPU-hour for the simulator's GPU models (typical on-demand list prices).
DEMO_LIST_PRICES = {
    "NVIDIA H100 80GB HBM3": Decimal("2.49"),
    "NVIDIA H200": Decimal("3.49"),
    "NVIDIA A100-SXM4-80GB": Decimal("1.29"),
}
# How long an agent gets to ship what it holds and exit once asked to stop (SIGTERM: it stops
# after the current interval and flushes its transport).
AGENT_STOP_S = 30.0


def agent_command() -> list[str]:
    """`proof-agent` as installed beside this interpreter (the same environment), else on
    PATH: the agent is its own program, started as an operator starts it."""
    beside = Path(sys.executable).with_name("proof-agent")
    found = str(beside) if beside.exists() else shutil.which("proof-agent")
    if not found:
        raise RuntimeError("proof-agent is not installed here (pip install '.[agent]')")
    return [found]


@dataclass
class AgentRun:
    scenario: str
    node: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    @property
    def error(self) -> str | None:
        """Why the agent failed (its exit status and last output line), or None."""
        code = self.process.poll()
        if code in (None, 0, -signal.SIGTERM):
            return None
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return f"exit status {code}: {lines[-1] if lines else 'no output'} ({self.log_path})"


def agent_argv(
    *,
    scenario: str,
    seed: int,
    duration_s: float,
    speed: float,
    start_ts: float,
    server: str,
    token: str,
    nodes: int,
    gpus_per_node: int,
    node: str | None = None,
    interval_s: float | None = None,
) -> list[str]:
    """The command line of one `proof-agent run --backend sim` playing `scenario` (every node
    of its simulated run, or only `node`) to the ingest at `server`."""
    argv = [
        *agent_command(),
        "run",
        "--backend",
        "sim",
        "--scenario",
        scenario,
        "--seed",
        str(seed),
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(gpus_per_node),
        "--duration",
        f"{duration_s:g}",
        "--speed",
        f"{speed:g}",
        "--start-ts",
        f"{start_ts:.0f}",
        "--server",
        server,
        "--token",
        token,
    ]
    if node is not None:
        argv += ["--node", node]
    if interval_s is not None:
        argv += ["--interval", f"{interval_s:g}"]
    return argv


def start_agent(scenario: str, node: str, argv: list[str], log_path: Path) -> AgentRun:
    """Start one agent process, its output (stdout and stderr) into `log_path`."""
    log = log_path.open("wb")
    # S603: our own argv (the installed proof-agent, fixed flags), no shell.
    process = subprocess.Popen(  # noqa: S603
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
    )
    return AgentRun(scenario, node, process, log_path, log)


def stop_agents(runs: Sequence[AgentRun], timeout: float = AGENT_STOP_S) -> None:
    """Ask every agent still running to stop (SIGTERM: it ships what it holds), wait for
    each, kill those that outlive `timeout`; close their logs."""
    for run in runs:
        if run.process.poll() is None:
            run.process.terminate()
    for run in runs:
        try:
            run.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.process.kill()
            run.process.wait()
        run.log.close()


def scenario_nodes(
    scenario: str,
    *,
    seed: int,
    duration_s: float,
    nodes: int,
    gpus_per_node: int,
    start_ts: float,
) -> list[str]:
    """The simulated nodes of the scenario's run (a neighbour or a rerun of the job may add one
    to the nodes asked for): the agents' own simulator, asked the same way."""
    run = simulator.simulate(
        scenario,
        seed=seed,
        duration_s=duration_s,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        start_ts=start_ts,
    )
    return [str(node) for node in run.meta.get("nodes") or []]


def _print_verdict(out: TextIO, note: Any) -> None:
    v = note.verdict
    subject = ", ".join(f"{k} {val}" for k, val in (v.get("subject") or {}).items() if val)
    head = "NEW VERDICT" if note.kind == "new" else "VERDICT CHANGED"
    lines = [
        f"\n== {head}: {note.family} ({note.category}) — {v.get('title', '')}",
        f"   subject: {subject or '-'}   confidence {v.get('confidence')}",
        f"   {v.get('summary', '')}",
    ]
    if v.get("recommendation"):
        lines.append(f"   do: {v['recommendation']}")
    for e in (v.get("evidence") or [])[:3]:
        where = " ".join(
            f"{k}={e[k]}" for k in ("node", "gpu", "rank") if e.get(k) not in (None, "")
        )
        lines.append(
            f"   [{e.get('id')}] {e.get('signal')} {where}: observed {e.get('observed')}"
            f" vs baseline {e.get('baseline')} — {e.get('note', '')}"
        )
    out.write("\n".join(lines) + "\n")
    out.flush()


class LiveDemo:
    def __init__(
        self,
        operator_id: int,
        *,
        scenarios: Sequence[str] = DEMO_SCENARIOS,
        speed: float = 10.0,
        duration_s: float = 600.0,
        ingest_port: int = 0,
        agents: bool = True,
        out: TextIO | None = None,
        seed: int = 1,
    ) -> None:
        self.operator_id = operator_id
        self.scenarios = list(scenarios)
        self.speed = speed
        self.duration_s = duration_s
        self.ingest_port = ingest_port
        self.with_agents = agents
        self.out = out or sys.stdout
        self.seed = seed
        self.server: Any = None
        self.port: int | None = None
        self.runner: Any = None
        self.runs: list[AgentRun] = []
        self._receiver: Callable[..., None] | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        from ingest.server import IngestServer
        from investigations import notifications
        from proof_web.runner import TaskRunner, in_process

        self._receiver = notifications.subscribe(lambda note: _print_verdict(self.out, note))
        self._ensure_list_price()
        if in_process():
            self.runner = TaskRunner()
            self.runner.start()
            self.out.write(
                "proof demo: tasks in-process: "
                + ", ".join(f"{p.task} every {p.every_seconds:g} s" for p in self.runner.plan)
                + f", and a {self.runner.concurrency}-thread worker for what they enqueue\n"
            )
        else:
            self.out.write(
                "proof demo: tasks go to the broker (REDIS_URL): run a worker and beat "
                "(README, production process layout) to evaluate\n"
            )
        self.server = IngestServer("127.0.0.1", self.ingest_port)
        self.port = self.server.start()
        self.out.write(f"proof demo: ingest (gRPC) listening on 127.0.0.1:{self.port}\n")
        if self.with_agents:
            self._start_agents()
        self.out.flush()

    def stop(self) -> None:
        from django.db import connections

        from investigations import notifications
        from investigations.tasks import fan_out_job_evaluations

        stop_agents(self.runs)
        if self.server is not None:
            self.server.stop(grace=2.0)
        if self.runner is not None:
            # One last job fan-out, so the data that arrived last is judged too; what waits
            # for a countdown is dropped with the runner (the fan-out evaluates those jobs).
            self.runner.send_now(
                p.name for p in self.runner.plan if p.task == fan_out_job_evaluations.name
            )
            self.runner.wait_idle(120, delayed=False)
            self.runner.stop()
        if self._receiver is not None:
            notifications.unsubscribe(self._receiver)
        connections.close_all()

    def _ensure_list_price(self) -> None:
        """List prices for the simulated GPU models, so the real price can be shown (kept where
        the operator set one)."""
        from investigations import selectors, services
        from tenants.access import Principal
        from tenants.context import tenant_context
        from tenants.models import Role

        with tenant_context(self.operator_id):
            known = selectors.list_prices(self.operator_id)
        admin = Principal(self.operator_id, None, Role.OPERATOR_ADMIN, True)
        for model, price in DEMO_LIST_PRICES.items():
            if model not in known:
                services.set_list_price(admin, gpu_model=model, price_per_gpu_hour=price)

    # --- agents -------------------------------------------------------------------------------

    def _start_agents(self) -> None:
        from django.conf import settings

        from tenants import services as tenant_services
        from tenants.context import tenant_context
        from tenants.models import AgentToken

        with tenant_context(self.operator_id):
            earlier = (
                AgentToken.objects.for_tenant(self.operator_id)
                .filter(name=AGENT_TOKEN_NAME)
                .count()
            )
        # A re-run plays the next seed: new jobs, nodes and GPUs, as if another part of the
        # fleet ran new jobs (the same seed over overlapping times would mix two runs'
        # samples in one job's series).
        seed = self.seed + earlier
        _token, plaintext = tenant_services.do_create_agent_token(
            self.operator_id, name=AGENT_TOKEN_NAME
        )
        logs = Path(settings.DATA_DIR) / "demo-agents"
        logs.mkdir(parents=True, exist_ok=True)
        # One start for every agent of a scenario: they play one simulated run, node by node.
        start_ts = float(int(time.time() - self.duration_s))
        for scenario in self.scenarios:
            for node in scenario_nodes(
                scenario,
                seed=seed,
                duration_s=self.duration_s,
                nodes=AGENT_NODES,
                gpus_per_node=AGENT_GPUS_PER_NODE,
                start_ts=start_ts,
            ):
                argv = agent_argv(
                    scenario=scenario,
                    seed=seed,
                    duration_s=self.duration_s,
                    speed=self.speed,
                    start_ts=start_ts,
                    server=f"127.0.0.1:{self.port}",
                    token=plaintext,
                    nodes=AGENT_NODES,
                    gpus_per_node=AGENT_GPUS_PER_NODE,
                    node=node,
                )
                self.runs.append(start_agent(scenario, node, argv, logs / f"{scenario}-{node}.log"))
        rerun = f", seed {seed} (a re-run: new jobs)" if earlier else ""
        self.out.write(
            f"proof demo: {len(self.runs)} simulated agents, one per node, for "
            f"{len(self.scenarios)} scenarios ({', '.join(self.scenarios)}) playing "
            f"{self.duration_s:g} s of telemetry at {self.speed:g}x{rerun}\n"
        )

    # --- summary -----------------------------------------------------------------------------

    def summary(self) -> str:
        from ingest import selectors as ingest_selectors
        from investigations import selectors
        from investigations.models import Incident
        from investigations.tasks import evaluate_job
        from tenants.access import Principal
        from tenants.context import tenant_context
        from tenants.models import Role

        with tenant_context(self.operator_id):
            incidents = list(
                Incident.objects.for_tenant(self.operator_id)
                .select_related("job")
                .order_by("id")
                .values_list("job__job_id", "family", "category", "state")
            )
        jobs = [
            (j.pk, j.job_id, j.kind) for j in ingest_selectors.jobs_oldest_first(self.operator_id)
        ]
        admin = Principal(self.operator_id, None, Role.OPERATOR_ADMIN, True)
        evaluations = self.runner.completed[evaluate_job.name] if self.runner is not None else 0
        lines = [f"proof demo: {evaluations} evaluations; verdicts per job:"]
        for _pk, job_id, kind in jobs:
            found = [f"{f} ({c}, {s})" for j, f, c, s in incidents if j == job_id]
            lines.append(f"  {job_id:<36} {kind or '?':<10} {', '.join(found) or 'no verdict'}")
        lines.append("proof demo: the real price (docs/pricing.md) per job:")
        for pk, job_id, _kind in jobs:
            price = selectors.real_price_for(admin, job_pk=pk)
            if price.productive_share is None:
                continue
            effective = price.effective_price_per_productive_gpu_hour
            # The list price per GPU-hour differs by GPU model, so show it beside the effective
            # one: a cheap A100 job can cost less per productive hour than a busy H100 job.
            listed = (
                f"{price.list_cost / Decimal(str(price.gpu_hours)):.2f}"
                if price.list_cost is not None and price.gpu_hours
                else "-"
            )
            lines.append(
                f"  {job_id:<36} {price.gpu_hours:7.3f} GPU-h, productive share "
                f"{price.productive_share:6.1%}, list {listed} → effective "
                f"{effective if effective is not None else '-'} {price.currency or ''}"
                "/productive GPU-h"
            )
        for run in self.runs:
            if run.error is not None:
                lines.append(f"  agent {run.scenario} on {run.node} failed: {run.error}")
        return "\n".join(lines)
