"""Ingest's reads, for detectors and the console. Every function runs as the tenant
(tenant_context) and returns plain values: per series, numpy arrays of timestamps (float
seconds since the epoch, millisecond resolution) and values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db.models import Q

from agent import signals
from ingest import blocks
from ingest.models import Event, Gpu, Job, JobRank, LogLine, Node, Series, SeriesRollup
from ingest.storage import read_block_payloads
from tenants.context import tenant_context

# The cumulative hardware counters of DESIGN §4 (GPU scope) that long-range reads ask for.
GPU_COUNTERS: tuple[str, ...] = (
    signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
    signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
    signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
    signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
    signals.DCGM_FI_DEV_ROW_REMAP_FAILURE,
    signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
)


@dataclass(frozen=True)
class SeriesInfo:
    id: int
    name: str
    node: str
    gpu: str
    gpu_index: int | None
    pid: int | None
    job: str
    rank: int | None
    local_rank: int | None
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class SeriesData:
    info: SeriesInfo
    ts: np.ndarray  # float64 seconds
    values: np.ndarray  # float64


@dataclass(frozen=True)
class RollupData:
    info: SeriesInfo
    bucket_start: np.ndarray  # float64 seconds, start of each hour
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray
    first: np.ndarray
    last: np.ndarray


_INFO_FIELDS = (
    "id",
    "name",
    "node__hostname",
    "gpu",
    "gpu_index",
    "pid",
    "job__job_id",
    "rank",
    "local_rank",
    "labels",
    "node_id",
)


def _infos(qs: Any) -> tuple[dict[int, SeriesInfo], set[int]]:
    infos: dict[int, SeriesInfo] = {}
    node_ids: set[int] = set()
    for sid, name, node, gpu, gidx, pid, job, rank, lrank, labels, node_id in qs.values_list(
        *_INFO_FIELDS
    ):
        infos[sid] = SeriesInfo(
            sid, name, node or "", gpu, gidx, pid, job or "", rank, lrank, labels or {}
        )
        node_ids.add(node_id)
    return infos, node_ids


def _ms(ts: float) -> int:
    return round(ts * 1000)


def read_samples(
    operator_id: int, infos: dict[int, SeriesInfo], node_ids: Iterable[int], t0: float, t1: float
) -> list[SeriesData]:
    """Samples of the given series over [t0, t1] (inside the caller's tenant_context).

    Vectorised over blocks: the runs of each decoded block (one contiguous run per series) are
    ordered by (series, block) and gathered in one numpy indexing step, so the cost grows with
    the samples read, not with series × blocks in Python.
    """
    if not infos:
        return []
    t0_ms, t1_ms = _ms(t0), _ms(t1)
    wanted = np.fromiter(infos.keys(), dtype=np.int64)
    run_sid, run_start, run_len, ts_parts, value_parts = [], [], [], [], []
    offset = 0
    for payload in read_block_payloads(operator_id, node_ids, t0_ms, t1_ms):
        block = blocks.decode(payload)
        starts = np.concatenate(([0], np.cumsum(block.counts)[:-1])) + offset
        keep = np.isin(block.series_ids, wanted)
        run_sid.append(block.series_ids[keep])
        run_start.append(starts[keep])
        run_len.append(block.counts[keep])
        ts_parts.append(block.ts_ms)
        value_parts.append(block.values)
        offset += len(block.ts_ms)
    if not ts_parts:
        return [SeriesData(i, np.zeros(0), np.zeros(0)) for i in infos.values()]
    sids = np.concatenate(run_sid)
    starts = np.concatenate(run_start)
    lens = np.concatenate(run_len)
    order = np.argsort(sids, kind="stable")  # blocks arrive in time order: stable keeps it
    sids, starts, lens = sids[order], starts[order], lens[order]
    total = int(lens.sum())
    run_offsets = np.concatenate(([0], np.cumsum(lens)[:-1]))
    gather = np.arange(total, dtype=np.int64) + np.repeat(starts - run_offsets, lens)
    ts = np.concatenate(ts_parts)[gather]
    values = np.concatenate(value_parts)[gather]
    sample_sid = np.repeat(sids, lens)
    inside = (ts >= t0_ms) & (ts <= t1_ms)
    ts, values, sample_sid = ts[inside], values[inside], sample_sid[inside]
    uniq, first = np.unique(sample_sid, return_index=True)
    bounds = [*list(first[1:]), len(ts)]
    seconds = ts / 1000.0
    out = {
        int(s): SeriesData(infos[int(s)], seconds[a:b], values[a:b])
        for s, a, b in zip(uniq, first, bounds, strict=True)
    }
    return [
        out.get(sid) or SeriesData(info, np.zeros(0), np.zeros(0)) for sid, info in infos.items()
    ]


def job_series(operator_id: int, job_id: str, t0: float, t1: float) -> list[SeriesData]:
    """All series of job J over [t0, t1]: those carrying the job's id, plus the GPU-scope series
    (no job key) of the GPUs its ranks ran on."""
    with tenant_context(operator_id):
        job = Job.objects.for_tenant(operator_id).filter(job_id=job_id).first()
        if job is None:
            return []
        gpus = [
            g
            for g in JobRank.objects.for_tenant(operator_id)
            .filter(job=job)
            .values_list("gpu", flat=True)
            if g
        ]
        query = Q(job=job)
        if gpus:
            query |= Q(job__isnull=True, gpu__in=gpus)
        infos, node_ids = _infos(Series.objects.for_tenant(operator_id).filter(query))
        return read_samples(operator_id, infos, node_ids, t0, t1)


def node_series(
    operator_id: int, hostname: str, t0: float, t1: float, names: Iterable[str] | None = None
) -> list[SeriesData]:
    """A node's signals (all its series, or those named) over [t0, t1]."""
    with tenant_context(operator_id):
        qs = Series.objects.for_tenant(operator_id).filter(node__hostname=hostname)
        if names is not None:
            qs = qs.filter(name__in=list(names))
        infos, node_ids = _infos(qs)
        return read_samples(operator_id, infos, node_ids, t0, t1)


def gpu_counters(
    operator_id: int,
    gpu_uuid: str,
    t0: float,
    t1: float,
    names: Iterable[str] = GPU_COUNTERS,
) -> list[RollupData]:
    """One GPU's counters over a long range (e.g. 30 days) from the hourly rollups."""
    with tenant_context(operator_id):
        infos, _ = _infos(
            Series.objects.for_tenant(operator_id).filter(gpu=gpu_uuid, name__in=list(names))
        )
        rows = (
            SeriesRollup.objects.for_tenant(operator_id)
            .filter(
                series_id__in=list(infos),
                bucket_start_ms__gte=_ms(t0) - _ms(t0) % 3_600_000,
                bucket_start_ms__lte=_ms(t1),
            )
            .order_by("series_id", "bucket_start_ms")
            .values_list("series_id", "bucket_start_ms", "count", "min", "max", "first", "last")
        )
        table = np.array(list(rows), dtype=np.float64).reshape(-1, 7)
    out = []
    for sid, info in infos.items():
        part = table[table[:, 0] == sid]
        out.append(
            RollupData(
                info,
                part[:, 1] / 1000.0,
                part[:, 2].astype(np.int64),
                part[:, 3],
                part[:, 4],
                part[:, 5],
                part[:, 6],
            )
        )
    return out


@dataclass(frozen=True)
class LogRow:
    ts: float
    node: str
    pid: int | None
    rank: int | None
    step: int | None
    stream: str
    line: str


def job_logs(
    operator_id: int,
    job_id: str,
    around: float,
    before_s: float = 60.0,
    after_s: float = 60.0,
    limit: int = 1000,
) -> list[LogRow]:
    """Log lines of job J from `before_s` before to `after_s` after `around`, oldest first."""
    lo, hi = int((around - before_s) * 1e6), int((around + after_s) * 1e6)
    with tenant_context(operator_id):
        rows = (
            LogLine.objects.for_tenant(operator_id)
            .filter(job__job_id=job_id, ts_us__gte=lo, ts_us__lte=hi)
            .order_by("ts_us", "id")
            .values_list("ts_us", "node__hostname", "pid", "rank", "step", "stream", "line")[:limit]
        )
        return [
            LogRow(ts / 1e6, node or "", pid, rank, step, s, line)
            for ts, node, pid, rank, step, s, line in rows
        ]


@dataclass(frozen=True)
class EventRow:
    ts: float
    name: str
    node: str
    gpu: str
    gpu_index: int | None
    job: str
    value: float | None
    text: str
    labels: dict[str, str]


def events(
    operator_id: int,
    *,
    gpu: str | None = None,
    node: str | None = None,
    t0: float | None = None,
    t1: float | None = None,
    limit: int = 1000,
) -> list[EventRow]:
    """Events of a GPU (by UUID) or of a node (by hostname; its GPUs' events included)."""
    if (gpu is None) == (node is None):
        raise ValueError("pass exactly one of gpu= or node=")
    with tenant_context(operator_id):
        qs = Event.objects.for_tenant(operator_id)
        qs = qs.filter(gpu=gpu) if gpu is not None else qs.filter(node__hostname=node)
        if t0 is not None:
            qs = qs.filter(ts_us__gte=int(t0 * 1e6))
        if t1 is not None:
            qs = qs.filter(ts_us__lte=int(t1 * 1e6))
        rows = qs.order_by("ts_us", "id").values_list(
            "ts_us",
            "name",
            "node__hostname",
            "gpu",
            "gpu_index",
            "job__job_id",
            "value",
            "text",
            "labels",
        )[:limit]
        return [
            EventRow(ts / 1e6, name, n or "", g, gi, j or "", v, text, labels or {})
            for ts, name, n, g, gi, j, v, text, labels in rows
        ]


def node_inventory(operator_id: int, hostname: str) -> dict[str, Any] | None:
    """A node with its GPUs, as registered."""
    with tenant_context(operator_id):
        node = Node.objects.for_tenant(operator_id).filter(hostname=hostname).first()
        if node is None:
            return None
        gpus = list(
            Gpu.objects.for_tenant(operator_id)
            .filter(node=node)
            .order_by("index")
            .values("uuid", "index", "model", "memory_mib", "driver_version", "cuda_version")
        )
        return {"hostname": node.hostname, "agent_version": node.agent_version, "gpus": gpus}
