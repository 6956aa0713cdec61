"""Samples, in ingest's own storage: the series catalog (`Series`, keyed by
ingest.services.series_key_hash as ingest keys it), sample blocks (ingest.blocks.encode, one
row per node per `BLOCK_S` seconds as an agent's batches give, written by
ingest.storage.write_blocks) and hourly rollups (`SeriesRollup`, built from the blocks by
ingest.services.build_rollups where blocks exist).

- Charted jobs: a simulator run (simulator.simulate: the scenario's physics, its ranks, the
  framework's log) over the whole period, its job/process/log/event records stored through
  ingest.services.store_batch (the real batch path, the investigations hook included) and its
  samples written as blocks straight from the run's arrays — a day of one node is ~30 million
  samples, which the record-by-record path would take tens of minutes to carry; then the real
  detectors run on the job (investigations.services.evaluate_job), so its incidents and usage
  rows are the pipeline's own.
- The fleet: every other node's GPUs report utilisation, memory used, power, temperature and
  engine activity, following what each GPU runs (frontend/seeding/fleet.py), for the last
  minutes as blocks and the last hours as rollups.
- GPUs at risk (those given a gpu_degrading incident): their hardware counters, rising, as
  hourly rollups over days (what ingest.selectors.gpu_counters reads).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from contract import signals
from contract.rows import SeriesInfo, labels_key
from contract.wire.encode import BatchBuilder
from frontend.seeding.bulk import ids_of, insert_columns
from frontend.seeding.fleet import FleetSeed
from ingest import blocks
from ingest import services as ingest_services
from ingest.models import Job, Node, Series, SeriesRollup
from ingest.processing import Limits, decode_batch
from ingest.storage import BlockRow, write_blocks
from investigations import services as investigation_services
from simulator import simulate
from tenants.context import tenant_context

BLOCK_S = 10  # seconds of samples per block: store_sim's and the tests' agent batch
HOUR_MS = 3_600_000
RECORD_BATCH_S = 600.0
# The series key fields after the name (contract.rows.SeriesInfo), without `step`.
_IDENTITY = ("node", "gpu", "gpu_index", "pid", "job", "rank", "local_rank")
FLEET_SIGNALS = (
    signals.DCGM_FI_DEV_GPU_UTIL,
    signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    signals.DCGM_FI_DEV_FB_USED,
    signals.DCGM_FI_DEV_POWER_USAGE,
    signals.DCGM_FI_DEV_GPU_TEMP,
)


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _info(name: str, row: dict[str, Any]) -> SeriesInfo:
    return SeriesInfo(
        name,
        str(row.get("node") or ""),
        str(row.get("gpu") or ""),
        row.get("gpu_index"),
        row.get("pid"),
        str(row.get("job") or ""),
        row.get("rank"),
        row.get("local_rank"),
        labels_key(row.get("labels")),
    )


def create_series(
    operator_id: int, infos: Sequence[SeriesInfo], node_ids: dict[str, int], job_pks: dict[str, int]
) -> np.ndarray:
    """The catalog rows of these series, as ingest creates them; their ids, in order."""
    hashes = [ingest_services.series_key_hash(i) for i in infos]
    insert_columns(
        Series,
        {
            "operator_id": [operator_id] * len(infos),
            "key_hash": hashes,
            "name": [i.name for i in infos],
            "node_id": [node_ids[i.node] for i in infos],
            "gpu": [i.gpu for i in infos],
            "gpu_index": [i.gpu_index for i in infos],
            "pid": [i.pid for i in infos],
            "job_id": [job_pks.get(i.job) for i in infos],
            "rank": [i.rank for i in infos],
            "local_rank": [i.local_rank for i in infos],
            "labels": [dict(i.labels) for i in infos],
        },
    )
    by_hash = ids_of(Series, "key_hash", hashes)
    return np.array([by_hash[h] for h in hashes], dtype=np.int64)


def write_node_blocks(
    operator_id: int, node_id: int, series_ids: np.ndarray, ts_ms: np.ndarray, values: np.ndarray
) -> int:
    """Blocks of one node: `values` (series × instants, NaN where a series has no sample) cut
    into BLOCK_S-second blocks as an agent ships them. Returns the samples written."""
    rows: list[BlockRow] = []
    written = 0
    for lo in range(0, len(ts_ms), BLOCK_S):
        part = values[:, lo : lo + BLOCK_S]
        finite = np.isfinite(part)
        counts = finite.sum(axis=1)
        keep = counts > 0
        if not keep.any():
            continue
        ts_part = ts_ms[lo : lo + BLOCK_S]
        if finite.all():
            sample_ts = np.tile(ts_part, len(series_ids))
            sample_values = part.ravel()
        else:
            sample_ts = np.broadcast_to(ts_part, part.shape)[finite]
            sample_values = part[finite]
        rows.append(
            BlockRow(
                operator_id=operator_id,
                node_id=node_id,
                start_ms=int(sample_ts.min()),
                end_ms=int(sample_ts.max()),
                series_count=int(keep.sum()),
                sample_count=len(sample_values),
                payload=blocks.encode(series_ids[keep], counts[keep], sample_ts, sample_values),
            )
        )
        written += len(sample_values)
        if len(rows) >= 500:
            write_blocks(rows)
            rows = []
    write_blocks(rows)
    return written


# --- charted jobs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChartedJob:
    job_pk: int
    job_id: str
    scenario: str
    nodes: list[str]
    samples: int
    incidents: int
    jobs: int  # the jobs the run stored: a scenario may play a neighbour job beside its own


def _store_records(operator_id: int, agent_id: str, records: Iterable[dict[str, Any]]) -> None:
    """The run's discrete records through ingest's batch path, RECORD_BATCH_S at a time."""
    builder = BatchBuilder(agent_id)
    limits = Limits()
    sequence = 0
    batch_end: float | None = None

    def flush() -> None:
        nonlocal builder, sequence
        if len(builder):
            sequence += 1
            ingest_services.store_batch(operator_id, decode_batch(builder.build(sequence), limits))
            builder = BatchBuilder(agent_id)

    for record in records:
        if batch_end is None:
            batch_end = float(record["ts"]) + RECORD_BATCH_S
        if record["ts"] >= batch_end:
            flush()
            batch_end = float(record["ts"]) + RECORD_BATCH_S
        builder.add(record)
    flush()


def seed_charted_job(
    operator_id: int,
    scenario: str,
    *,
    seed: int,
    hours: float,
    nodes: int,
    end_ts: float,
    customer_id: int | None,
) -> ChartedJob:
    duration = hours * 3600.0
    run = simulate(
        scenario,
        seed=seed,
        duration_s=duration,
        nodes=nodes,
        gpus_per_node=8,
        start_ts=end_ts - duration,
    )
    # Every series of the run, one row (identity, values over the run) each.
    per_series: list[tuple[SeriesInfo, np.ndarray]] = []
    for name in signals.SIGNALS:
        for row, values in run.series(name, key=_IDENTITY):
            per_series.append((_info(name, row), values))
    hosts = sorted({info.node for info, _ in per_series if info.node})
    # The agents register their nodes and GPUs first, as a real agent does on connecting.
    for host in hosts:
        gpus = {
            info.gpu: {"uuid": info.gpu, "index": info.gpu_index, "model": run.meta["gpu_model"]}
            for info, _ in per_series
            if info.node == host and info.gpu
        }
        ingest_services.register_agent(
            operator_id,
            agent_id=f"agent-{host}",
            hostname=host,
            agent_version="0.1.2",
            gpus=gpus.values(),
        )
    _store_records(operator_id, f"agent-{hosts[0]}", run.discrete)
    subject = (run.meta.get("truth") or {}).get("subject") or {}
    main_job = str(subject.get("job") or next(iter(run.meta.get("jobs") or {"": ""})))
    ts_ms = np.rint(run.ts * 1000.0).astype(np.int64)
    with tenant_context(operator_id):
        node_ids = ids_of(Node, "hostname", hosts)
        job_pks = ids_of(Job, "job_id", sorted({i.job for i, _ in per_series if i.job}))
        series_ids = create_series(operator_id, [i for i, _ in per_series], node_ids, job_pks)
    samples = 0
    for host in hosts:  # a transaction per node: a day of one node is a few minutes' writing
        mine = [k for k, (info, _) in enumerate(per_series) if info.node == host]
        matrix = np.vstack([per_series[k][1] for k in mine])
        with tenant_context(operator_id):
            samples += write_node_blocks(
                operator_id, node_ids[host], series_ids[mine], ts_ms, matrix
            )
    with tenant_context(operator_id):
        job_pk = job_pks[main_job]
        # The job as its scheduler saw it: started with the run (ingest stamps the wall time
        # it first heard of it), and the operator's customer.
        Job.objects.filter(pk__in=list(job_pks.values())).update(first_seen_at=_dt(run.start_ts))
        if customer_id is not None:
            Job.objects.filter(pk=job_pk).update(customer_id=customer_id)
    investigation_services.note_job_data(operator_id, {job_pk: (run.start_ts, run.end_ts)})
    return ChartedJob(job_pk, main_job, scenario, hosts, samples, 0, len(job_pks))


def roll_up(operator_id: int, t0: float, t1: float) -> int:
    """ingest's hourly rollups over [t0, t1], from the blocks written so far."""
    written = 0
    hour = int(t0 * 1000) // HOUR_MS * HOUR_MS
    while hour <= int(t1 * 1000):
        written += ingest_services.build_rollups(operator_id, hour)
        hour += HOUR_MS
    return written


def evaluate(operator_id: int, job_pk: int) -> int:
    """The real detectors over the job's last window; the incidents it has afterwards."""
    from investigations.models import Incident

    investigation_services.evaluate_job(operator_id, job_pk)
    with tenant_context(operator_id):
        return Incident.objects.for_tenant(operator_id).filter(job_id=job_pk).count()


# --- the fleet's GPUs --------------------------------------------------------------------------


def _fleet_levels(
    rng: np.random.Generator, busy: np.ndarray, holding: np.ndarray, memory: np.ndarray
) -> np.ndarray:
    """Each GPU's level of each FLEET_SIGNALS signal: (GPUs, signals)."""
    util = 100.0 * busy
    engine = np.clip(busy * rng.uniform(0.95, 1.0, busy.shape), 0.0, 1.0)
    fb = np.where(busy > 0, memory * rng.uniform(0.5, 0.95, busy.shape), 0.0)
    fb = np.where(holding, memory * rng.uniform(0.3, 0.8, busy.shape), fb)
    power = 70.0 + 45.0 * (fb > 0) + 560.0 * busy**1.3
    temp = rng.uniform(24.0, 30.0, busy.shape) + 0.065 * power
    return np.stack([util, engine, fb, power, temp], axis=-1)


def seed_fleet_series(
    operator_id: int,
    rng: np.random.Generator,
    fleet: FleetSeed,
    memory_mib: np.ndarray,
    *,
    minutes: float,
    rollup_hours: int,
    now: float,
) -> tuple[int, int]:
    """Every GPU's FLEET_SIGNALS: the last `minutes` as blocks, the last `rollup_hours` hours as
    rollups. About 2% of idle GPUs hold memory (a process left behind). Returns (samples,
    rollup rows)."""
    n_nodes, per_node = fleet.gpu_busy.shape
    holding = (fleet.gpu_busy == 0) & (rng.random(fleet.gpu_busy.shape) < 0.02)
    memory = np.repeat(memory_mib[:, None], per_node, axis=1).astype(np.float64)
    levels = _fleet_levels(rng, fleet.gpu_busy, holding, memory)  # (nodes, gpus, signals)
    infos = [
        SeriesInfo(name, fleet.hostnames[n], fleet.gpu_uuids[n][g], g, None, "", None, None, ())
        for n in range(n_nodes)
        for g in range(per_node)
        for name in FLEET_SIGNALS
    ]
    node_ids = dict(zip(fleet.hostnames, fleet.node_ids.tolist(), strict=True))
    with tenant_context(operator_id):
        series_ids = create_series(operator_id, infos, node_ids, {}).reshape(
            n_nodes, per_node * len(FLEET_SIGNALS)
        )
    seconds = int(minutes * 60)
    start = float(int(now) - seconds)
    ts_ms = (np.arange(seconds, dtype=np.int64) + int(start)) * 1000
    samples = 0
    flat_levels = levels.reshape(n_nodes, -1)  # (nodes, series), series in `infos` order
    noise_scale = np.tile([2.0, 0.02, 0.0, 12.0, 0.4], per_node)
    for lo in range(0, n_nodes, 100):  # a transaction per 100 nodes
        with tenant_context(operator_id):
            for n in range(lo, min(lo + 100, n_nodes)):
                base = flat_levels[n][:, None]
                noise = rng.normal(0.0, 1.0, (len(base), seconds)) * noise_scale[:, None]
                values = np.round(np.clip(base + noise * (base > 0), 0.0, None), 3)
                samples += write_node_blocks(
                    operator_id, int(fleet.node_ids[n]), series_ids[n], ts_ms, values
                )
    with tenant_context(operator_id):
        rollups = _fleet_rollups(
            operator_id, rng, series_ids.ravel(), flat_levels.ravel(), rollup_hours, now
        )
    return samples, rollups


def _fleet_rollups(
    operator_id: int,
    rng: np.random.Generator,
    series_ids: np.ndarray,
    levels: np.ndarray,
    hours: int,
    now: float,
) -> int:
    if hours <= 0:
        return 0
    current = int(now * 1000) // HOUR_MS * HOUR_MS
    buckets = current - HOUR_MS * np.arange(hours - 1, -1, -1, dtype=np.int64)
    n = len(series_ids)
    # Earlier hours: what ran then — the same level mostly, now and then another job's.
    level = np.repeat(levels[:, None], hours, axis=1)
    other = rng.random((n, hours)) < 0.15
    level = np.where(other, level * rng.uniform(0.0, 1.2, (n, hours)), level)
    spread = np.abs(level) * 0.05 + 0.5
    count = np.full((n, hours), 3600, dtype=np.int64)
    count[:, -1] = max(1, int(now * 1000 - current) // 1000)
    return insert_columns(
        SeriesRollup,
        {
            "operator_id": np.full(n * hours, operator_id, dtype=np.int64),
            "series_id": np.repeat(series_ids, hours),
            "bucket_start_ms": np.tile(buckets, n),
            "count": count.ravel(),
            "min": np.clip(level - spread, 0.0, None).ravel(),
            "max": (level + spread).ravel(),
            "sum": (level * count).ravel(),
            "first": level.ravel(),
            "last": level.ravel(),
        },
    )


def seed_counter_series(
    operator_id: int,
    rng: np.random.Generator,
    fleet: FleetSeed,
    at_risk: Sequence[tuple[int, int]],
    *,
    days: int,
    now: float,
) -> int:
    """The hardware counters (ingest.selectors.GPU_COUNTERS) of the GPUs at risk, rising over
    the last `days` days, as hourly rollups. Returns the rollup rows."""
    if not at_risk or days <= 0:
        return 0
    names = list(signals.GPU_COUNTERS)
    infos = [
        SeriesInfo(name, fleet.hostnames[n], fleet.gpu_uuids[n][g], g, None, "", None, None, ())
        for n, g in at_risk
        for name in names
    ]
    node_ids = dict(zip(fleet.hostnames, fleet.node_ids.tolist(), strict=True))
    series_ids = create_series(operator_id, infos, node_ids, {})
    hours = days * 24
    current = int(now * 1000) // HOUR_MS * HOUR_MS
    buckets = current - HOUR_MS * np.arange(hours - 1, -1, -1, dtype=np.int64)
    n = len(series_ids)
    # Each counter: a pre-existing value, then increments whose rate grows toward now (a GPU
    # degrading); some counters of each GPU stay flat.
    base = rng.integers(0, 200, n).astype(np.float64)
    moving = rng.random(n) < 0.5
    ramp = np.linspace(0.0, 1.0, hours) ** 2
    rate = rng.uniform(0.5, 40.0, n)[:, None] * ramp[None, :] * moving[:, None]
    steps = rng.poisson(rate)
    last = base[:, None] + np.cumsum(steps, axis=1)
    first = last - steps
    return insert_columns(
        SeriesRollup,
        {
            "operator_id": np.full(n * hours, operator_id, dtype=np.int64),
            "series_id": np.repeat(series_ids, hours),
            "bucket_start_ms": np.tile(buckets, n),
            "count": np.full(n * hours, 3600, dtype=np.int64),
            "min": first.ravel(),
            "max": last.ravel(),
            "sum": ((first + last) / 2 * 3600).ravel(),
            "first": first.ravel(),
            "last": last.ravel(),
        },
    )
