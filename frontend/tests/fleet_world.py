"""Data for the fleet and health page tests, stored through ingest's real services and
evaluated by the live pipeline's real detectors: simulated runs (store_sim), single GPUs with
chosen readings (one agent batch each), hourly rollups built as the periodic task builds them,
fleet-health evaluations of the degrading GPUs."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
from django.db import connection

from contract import signals
from contract.wire.encode import BatchBuilder
from frontend.selectors import fleet as fleet_selectors
from ingest import services as ingest_services
from ingest.models import Job
from ingest.processing import Limits, decode_batch
from investigations import services, window_cache
from investigations.tests.live_helpers import GPU_MODEL, job_pk, store_sim
from tenants.context import tenant_context
from tenants.models import Customer

HOUR_MS = 3_600_000


def store_gpu(
    operator_id: int,
    *,
    node: str,
    gpu: str,
    index: int,
    readings: dict[str, float],
    seconds: int = 60,
    model: str = GPU_MODEL,
    seen: datetime | None = None,
) -> None:
    """A node's agent registers one GPU and ships one batch of `seconds` one-hertz samples of
    each of `readings` (signal → constant value) ending now. `seen`: when the agent was last
    heard from (a node that went silent then)."""
    now = datetime.now(UTC) if seen is None else seen
    ingest_services.register_agent(
        operator_id,
        agent_id=f"agent-{node}",
        hostname=node,
        agent_version="test",
        gpus=[{"uuid": gpu, "index": index, "model": model}],
        now=now,
    )
    builder = BatchBuilder(f"agent-{node}")
    end = now.timestamp()
    ts = end - seconds + np.arange(seconds, dtype=np.float64)
    identity = {signals.NODE: node, signals.GPU: gpu, signals.GPU_INDEX: index}
    for name, value in readings.items():
        builder.add_samples(name, identity, ts, np.full(seconds, value))
    sequence = int(time.time() * 1000) % 1_000_000_000
    ingest_services.store_batch(
        operator_id, decode_batch(builder.build(sequence), Limits()), now=now
    )


def roll_up(operator_id: int, hours: int = 3) -> None:
    """The hourly rollups of the last `hours` hours, as the ingest-rollups task builds them
    (it rebuilds the last 3). Three, not two: a reading 65 min old falls in the hour before the
    previous one during each hour's first 5 minutes."""
    current = int(time.time() * 1000) // HOUR_MS * HOUR_MS
    for back in range(hours):
        ingest_services.build_rollups(operator_id, current - back * HOUR_MS)


def assign(operator_id: int, job_id: str, customer: Customer) -> None:
    # Attribution is the mapping rules' business (tenants/services.py, tested there); the
    # simulator draws its Slurm ids per seed, so the tests attribute stored jobs themselves.
    with tenant_context(operator_id):
        Job.objects.for_tenant(operator_id).filter(job_id=job_id).update(customer=customer)


def store_and_evaluate(
    operator_id: int, scenario: str, seed: int, agent: str, **kwargs: Any
) -> tuple[list[str], dict[str, set[str]]]:
    """A simulated run stored through ingest, every job of it evaluated; its job ids and the
    GPUs `proof analyze` finds fleet-health verdicts on."""
    sim = store_sim(operator_id, scenario, seed=seed, agent_id=agent, **kwargs)
    with tenant_context(operator_id):
        # A fleet-health scenario's truth names no job (store_sim lists it as "None").
        jobs = [
            j for j in sim.jobs if Job.objects.for_tenant(operator_id).filter(job_id=j).exists()
        ]
    for job in jobs:
        services.evaluate_job(operator_id, job_pk(operator_id, job))
    return jobs, sim.offline_gpu_families


def degrading_gpus(operator_id: int, seed: int = 1) -> list[str]:
    """The gpu_degrading scenario stored and its GPUs evaluated by the fleet-health pass:
    the GPUs that got an open gpu_degrading incident."""
    _jobs, families = store_and_evaluate(
        operator_id, "gpu_degrading", seed, f"agent-degrading-{seed}", duration_s=300
    )
    gpus = sorted(families)
    for gpu in gpus:
        assert services.evaluate_fleet_health(operator_id, gpu).status == "evaluated"
    return gpus


def recent(minutes: float) -> datetime:
    return datetime.now(UTC) - timedelta(minutes=minutes)


def clear_process_caches() -> None:
    """Forget what this process cached of earlier tests' data: on SQLite a rolled-back test
    hands its ids (operators, jobs, series) out again, and a worker's window cache keyed by
    (operator, job id) would serve the earlier test's samples."""
    ingest_services.clear_caches()
    window_cache.CACHE.clear()
    fleet_selectors.clear_idle_cache()


def by_vendor(counts: dict[str, int]) -> int:
    """Query counts differ by database: PostgreSQL's tenant context sets and resets the
    row-level-security settings (4 statements a context), SQLite's is a plain transaction."""
    return counts[connection.vendor]


def same_money(a: Decimal | None, b: Decimal | None) -> bool:
    """Two prices of the same usage, summed in a different order (per job and model in SQL,
    per GPU row in the API): equal to the 4 decimals they are quantized to, give or take one."""
    return a is not None and b is not None and abs(a - b) <= Decimal("0.0001")
