"""The live part of `proof demo`: ingest, in-process evaluation and simulated agents.

    LiveDemo(operator_id, ...).start()   # ingest gRPC on loopback, evaluator, agents
    ...                                  # daphne serves the web meanwhile (main thread)
    demo.stop()

- **Ingest**: `ingest.server.IngestServer` on 127.0.0.1 (an ephemeral port unless given).
- **Evaluator**: the embedded default has no broker or worker (tasks run eagerly), so a
  thread plays Celery beat + worker: every `evaluate_every` seconds it runs the same fan-out
  the periodic task runs (investigations.selectors → services.evaluate_job for every active job
  with new data), and fleet health at its slower rate.
- **Agents**: one `proof-agent` runtime per scenario, in threads: the simulated-hardware
  backend's collectors → the real `Agent` loop and identity join → batches from the real
  encoder → the real gRPC client, authenticated with a fresh agent token of the demo operator.
  The simulated run ends "now" and plays at `speed`× real time, so its timestamps are never in
  the future.
- **Printing**: a subscriber of the notification hook prints each verdict as it appears.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TextIO

log = logging.getLogger(__name__)

# docs/design.md §1's four reference cases, then the healthy control (seeds checked to show each).
REFERENCE_SCENARIOS: tuple[str, ...] = (
    "sequence_imbalance",
    "checkpoint_stall",
    "underfilled_batches",
    "numerical_divergence",
)
HEALTHY_SCENARIO = "healthy_training"
DEMO_SCENARIOS: tuple[str, ...] = (*REFERENCE_SCENARIOS, HEALTHY_SCENARIO)
AGENT_TOKEN_NAME = "proof demo agents"  # noqa: S105 - the demo token's display name, not the secret
# USD per GPU-hour for the simulator's GPU models (typical on-demand list prices).
DEMO_LIST_PRICES = {
    "NVIDIA H100 80GB HBM3": Decimal("2.49"),
    "NVIDIA H200": Decimal("3.49"),
    "NVIDIA A100-SXM4-80GB": Decimal("1.29"),
}


class GrpcSink:
    """Agent sink that ships each few seconds of records as one batch over the real gRPC
    client (contract.wire.client) — the path `proof-agent run --server` takes."""

    def __init__(
        self,
        target: str,
        token: str,
        agent_id: str,
        batch_seconds: float = 2.0,
        job_suffix: str = "",
        gpu_model: str = "",
    ):
        from contract.wire.client import BatchSender, open_channel
        from contract.wire.encode import BatchBuilder

        self.channel = open_channel(target)
        self.sender = BatchSender(self.channel, token)
        self.builder = BatchBuilder(agent_id)
        self.batch_seconds = batch_seconds
        self.sequence = 0
        self._batch_start: float | None = None
        self.agent_id = agent_id
        self.job_suffix = job_suffix
        self.gpu_model = gpu_model
        self._registered: set[str] = set()

    def _register(self, records: Sequence[dict[str, Any]]) -> None:
        """Register each node with its GPUs when first seen, as the real agent does on start
        (with the simulated fleet's GPU model, as NVML names it)."""
        gpus: dict[str, dict[str, dict[str, Any]]] = {}
        for rec in records:
            node, gpu = rec.get("node"), rec.get("gpu")
            if node and gpu and node not in self._registered:
                gpus.setdefault(node, {})[gpu] = {
                    "uuid": gpu,
                    "index": int(rec.get("gpu_index") or 0),
                    "model": self.gpu_model,
                }
        for node, found in gpus.items():
            self.sender.register(
                agent_id=f"{self.agent_id}-{node}",
                hostname=node,
                agent_version="demo",
                gpus=list(found.values()),
            )
            self._registered.add(node)

    def submit(self, records: Sequence[dict[str, Any]]) -> None:
        if not records:
            return
        if self.job_suffix:
            # A re-run of the demo plays the same seeds over overlapping times: its jobs, nodes
            # and GPUs get new names, as if another part of the fleet ran new jobs.
            for rec in records:
                for key in ("job", "rerun_of", "node", "gpu"):
                    if rec.get(key):
                        rec[key] = f"{rec[key]}{self.job_suffix}"
                if isinstance(rec.get("nodes"), list):
                    rec["nodes"] = [f"{n}{self.job_suffix}" for n in rec["nodes"]]
        self._register(records)
        self.builder.extend(records)
        ts = float(records[-1]["ts"])
        if self._batch_start is None:
            self._batch_start = ts
        if ts - self._batch_start >= self.batch_seconds or len(self.builder) > 50_000:
            self.flush()
            self._batch_start = ts

    def flush(self) -> None:
        if len(self.builder):
            self.sequence += 1
            self.sender.send(self.builder.build(self.sequence))

    def close(self) -> None:
        self.flush()
        self.sender.close()
        self.channel.close()


@dataclass
class AgentRun:
    scenario: str
    thread: threading.Thread
    agent: Any
    jobs: set[str] = field(default_factory=set)
    error: BaseException | None = None


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
        evaluate_every: float = 3.0,
        agents: bool = True,
        out: TextIO | None = None,
        seed: int = 1,
    ) -> None:
        import sys

        self.operator_id = operator_id
        self.scenarios = list(scenarios)
        self.speed = speed
        self.duration_s = duration_s
        self.ingest_port = ingest_port
        self.evaluate_every = evaluate_every
        self.with_agents = agents
        self.out = out or sys.stdout
        self.seed = seed
        self.stopping = threading.Event()
        self.server: Any = None
        self.port: int | None = None
        self.runs: list[AgentRun] = []
        self._receiver: Callable[..., None] | None = None
        self._evaluator: threading.Thread | None = None
        self.evaluations = 0
        self.job_suffix = ""

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        from ingest.server import IngestServer
        from investigations import notifications

        self._receiver = notifications.subscribe(lambda note: _print_verdict(self.out, note))
        self._ensure_list_price()
        self.server = IngestServer("127.0.0.1", self.ingest_port)
        self.port = self.server.start()
        self.out.write(f"proof demo: ingest (gRPC) listening on 127.0.0.1:{self.port}\n")
        self._evaluator = threading.Thread(target=self._evaluate_loop, name="demo-evaluator")
        self._evaluator.daemon = True
        self._evaluator.start()
        if self.with_agents:
            self._start_agents()
        self.out.flush()

    def stop(self) -> None:
        from django.db import connections

        from investigations import notifications

        self.stopping.set()
        for run in self.runs:
            run.agent.stop()
        for run in self.runs:
            run.thread.join(timeout=30)
        if self.server is not None:
            self.server.stop(grace=2.0)
        if self._evaluator is not None:
            self._evaluator.join(timeout=60)
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
        from tenants import services as tenant_services
        from tenants.context import tenant_context
        from tenants.models import AgentToken

        with tenant_context(self.operator_id):
            earlier = (
                AgentToken.objects.for_tenant(self.operator_id)
                .filter(name=AGENT_TOKEN_NAME)
                .count()
            )
        self.job_suffix = f"-run{earlier + 1}" if earlier else ""
        _token, plaintext = tenant_services.do_create_agent_token(
            self.operator_id, name=AGENT_TOKEN_NAME
        )
        start_ts = float(int(time.time() - self.duration_s))
        for scenario in self.scenarios:
            run = self._agent(scenario, plaintext, start_ts)
            self.runs.append(run)
            run.thread.start()
        self.out.write(
            f"proof demo: {len(self.runs)} simulated agents ({', '.join(self.scenarios)}) "
            f"playing {self.duration_s:g} s of telemetry at {self.speed:g}x\n"
        )

    def _agent(self, scenario: str, token: str, start_ts: float) -> AgentRun:
        from agent.runtime import AcceleratedClock, Agent
        from agent.runtime.sim_backend import SimBackend

        backend = SimBackend.from_scenario(
            scenario,
            seed=self.seed,
            duration_s=self.duration_s,
            start_ts=start_ts,
            nodes=1,
            gpus_per_node=4,
        )
        # A fresh agent id per run: ingest de-duplicates on (agent id, sequence).
        sink = GrpcSink(
            f"127.0.0.1:{self.port}",
            token,
            f"demo-{scenario}-{uuid.uuid4().hex[:8]}",
            job_suffix=self.job_suffix,
            gpu_model=str(backend.trace_meta()[0].get("gpu_model") or ""),
        )
        agent = Agent(
            list(backend.collectors()), sink, clock=AcceleratedClock(start_ts, self.speed)
        )
        run = AgentRun(scenario, threading.Thread(), agent)

        def play() -> None:
            try:
                agent.run(until=backend.end_ts)
            except BaseException as exc:  # a demo agent failing must say so, not vanish
                run.error = exc
                log.exception("demo agent %s failed", scenario)
            finally:
                agent.close()

        run.thread = threading.Thread(target=play, name=f"demo-agent-{scenario}", daemon=True)
        return run

    # --- the in-process evaluator ------------------------------------------------------------

    def _evaluate_loop(self) -> None:
        from django.db import close_old_connections

        from investigations import selectors, services

        last_fleet = 0.0
        while not self.stopping.wait(self.evaluate_every):
            try:
                for operator_id, job_pk in selectors.jobs_due_for_evaluation(services.ACTIVE_S):
                    if self.stopping.is_set():
                        break
                    services.evaluate_job(operator_id, job_pk)
                    self.evaluations += 1
                if time.monotonic() - last_fleet >= 600:
                    last_fleet = time.monotonic()
                    for operator_id, gpu in selectors.gpus_due_for_fleet_health():
                        services.evaluate_fleet_health(operator_id, gpu)
            except Exception:
                log.exception("demo evaluation failed; retrying at the next tick")
            finally:
                close_old_connections()
        # One last pass so the data that arrived last is judged too.
        try:
            for operator_id, job_pk in selectors.jobs_due_for_evaluation(services.ACTIVE_S):
                services.evaluate_job(operator_id, job_pk)
        except Exception:
            log.exception("final demo evaluation failed")

    # --- summary -----------------------------------------------------------------------------

    def summary(self) -> str:
        from ingest.models import Job
        from investigations.models import Incident
        from tenants.context import tenant_context

        with tenant_context(self.operator_id):
            incidents = list(
                Incident.objects.for_tenant(self.operator_id)
                .select_related("job")
                .order_by("id")
                .values_list("job__job_id", "family", "category", "state")
            )
            jobs = list(
                Job.objects.for_tenant(self.operator_id)
                .order_by("id")
                .values_list("pk", "job_id", "kind")
            )
        from investigations import selectors
        from tenants.access import Principal
        from tenants.models import Role

        admin = Principal(self.operator_id, None, Role.OPERATOR_ADMIN, True)
        lines = [f"proof demo: {self.evaluations} evaluations; verdicts per job:"]
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
                lines.append(f"  agent {run.scenario} failed: {run.error!r}")
        return "\n".join(lines)
