"""Feeding simulated runs into ingest's real storage, hand-written verdicts, and running
database work from several threads at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from contract.wire.encode import BatchBuilder
from engine.analyze import analyze_store
from engine.store import TraceStore
from ingest import services as ingest_services
from ingest.models import Job
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from simulator import simulate
from tenants.context import tenant_context

BATCH_SECONDS = 10.0
GPU_MODEL = "NVIDIA H100 80GB HBM3"


def register_gpus(operator_id: int, records: Iterable[dict[str, Any]]) -> None:
    """Each simulated node's agent registers its GPUs, as the real agent does on connecting."""
    gpus: dict[str, dict[str, dict[str, Any]]] = {}
    for record in records:
        if record.get("gpu") and record.get("node"):
            gpus.setdefault(record["node"], {}).setdefault(
                record["gpu"],
                {"uuid": record["gpu"], "index": record.get("gpu_index"), "model": GPU_MODEL},
            )
    for node, node_gpus in gpus.items():
        ingest_services.register_agent(
            operator_id,
            agent_id=f"agent-{node}",
            hostname=node,
            agent_version="test",
            gpus=node_gpus.values(),
        )


def store_sim(
    operator_id: int,
    scenario: str,
    *,
    duration_s: float = 120.0,
    nodes: int = 1,
    gpus_per_node: int = 4,
    seed: int = 1,
    agent_id: str | None = None,
    end_ts: float | None = None,
) -> StoredSim:
    """Simulate `scenario` ending now (or at `end_ts`) and store it through ingest in
    BATCH_SECONDS batches, as an agent would ship it. Returns the job ids it stored (the
    scenario's subject job first) and what `proof analyze` finds in the same records."""
    end = time.time() if end_ts is None else end_ts
    run = simulate(
        scenario,
        seed=seed,
        duration_s=duration_s,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        start_ts=end - duration_s,
    )
    builder = BatchBuilder(agent_id or f"sim-{scenario}-{seed}")
    limits = Limits()
    sequence = 0
    batch_end = run.start_ts + BATCH_SECONDS

    def flush() -> None:
        nonlocal sequence
        if len(builder):
            sequence += 1
            decoded = decode_batch(builder.build(sequence), limits)
            ingest_services.store_batch(operator_id, decoded)

    register_gpus(operator_id, run.records())
    jobs: list[str] = []
    truth = run.meta.get("truth") or {}
    if truth.get("subject"):
        jobs.append(str(truth["subject"]["job"]))
    for record in run.records():
        job = record.get("job")
        if job and str(job) not in jobs:
            jobs.append(str(job))
        if record["ts"] >= batch_end:
            flush()
            while record["ts"] >= batch_end:
                batch_end += BATCH_SECONDS
        builder.add(record)
    flush()
    offline: dict[str, set[str]] = {j: set() for j in jobs}
    offline_gpus: dict[str, set[str]] = {}
    for v in analyze_store(TraceStore.from_records(run.records(), run.meta)):
        if v["subject"]["job"]:
            offline.setdefault(str(v["subject"]["job"]), set()).add(v["family"])
        elif v["subject"]["gpu"]:
            offline_gpus.setdefault(str(v["subject"]["gpu"]), set()).add(v["family"])
    return StoredSim(jobs, offline, offline_gpus)


def job_pk(operator_id: int, job_id: str) -> int:
    with tenant_context(operator_id):
        return int(Job.objects.for_tenant(operator_id).get(job_id=job_id).pk)


def store_gpu_job(operator_id: int, job_id: str, agent_id: str) -> int:
    """Store one small GPU batch of `job_id` through ingest's services; the Job's pk."""
    batch = decode_batch(gpu_batch(job=job_id, agent_id=agent_id), Limits())
    ingest_services.store_batch(operator_id, batch)
    return job_pk(operator_id, job_id)


def run_together(work: Callable[[int], object], threads: int) -> list[BaseException]:
    """Call work(0) … work(threads - 1) in threads released together by a barrier, so they
    really contend; each thread closes its own database connections. What they raised."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            barrier.wait()
            work(k)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    started = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()
    return errors


@dataclass
class StoredSim:
    jobs: list[str]
    offline_families: dict[str, set[str]]
    offline_gpu_families: dict[str, set[str]]


def verdict(
    family: str = "sequence_imbalance",
    category: str = "job",
    *,
    job: str | None = "job-1",
    start: float = 1_000.0,
    end: float = 1_100.0,
    confidence: float = 0.8,
    title: str | None = None,
    gpu: str | None = None,
) -> dict[str, Any]:
    """A docs/design.md §7 verdict object, for merge tests that need exact control of each field."""
    return {
        "id": "v-test",
        "family": family,
        "category": category,
        "title": title or f"{family} on {job}",
        "summary": f"{family} observed [e1]",
        "recommendation": "do the thing",
        "confidence": confidence,
        "subject": {"job": job, "node": None, "gpu": gpu, "rank": None, "mount": None},
        "interval": {"start": start, "end": end},
        "impact": {"slowdown_pct": None, "gpu_hours_lost": None},
        "evidence": [
            {
                "id": "e1",
                "signal": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "node": None,
                "gpu": gpu,
                "rank": None,
                "job": job,
                "interval": {"start": start, "end": end},
                "observed": 0.1,
                "baseline": 0.6,
                "note": "tensor pipes idle",
            }
        ],
        "cleared": [],
        "explanation": "",
    }
