"""Reads for the days-ahead forecast (docs/fleet-health.md): the hourly rollups and warning
XIDs a forecast pass needs, the stored forecasts, and the running jobs the drain plan groups
by. Like selectors_health.py, the rollup read queries ingest's models directly (read-only,
through `for_tenant()`); folding it into ingest/selectors.py is owed (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from contract import signals
from engine import forecast as fc
from engine.detectors.xids import WARNING, xid_kind
from ingest.models import Event, Job, Process, SeriesRollup
from investigations.models import ComponentForecast

# What a pass reads per GPU (counters as first/last, gauges as the hourly max or min) and per
# node (IB counters per device/port).
GPU_COUNTERS: tuple[str, ...] = (
    signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
    signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
    signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
    signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
    signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
)
GPU_GAUGES: tuple[str, ...] = (
    signals.DCGM_FI_DEV_GPU_TEMP,
    signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
    signals.DCGM_FI_DEV_PCIE_LINK_WIDTH,
    signals.DCGM_FI_DEV_PCIE_LINK_GEN,
)
IB_COUNTERS: tuple[str, ...] = (
    signals.IB_SYMBOL_ERROR,
    signals.IB_LINK_ERROR_RECOVERY,
    signals.IB_PORT_RCV_ERRORS,
)
LEVEL_ORDER = {name: i for i, name in enumerate(fc.LEVELS)}


@dataclass(frozen=True)
class RollupRow:
    series_id: int
    name: str
    gpu: str
    node: str
    labels: dict[str, Any]
    bucket_start_ms: int
    first: float
    last: float
    max: float
    min: float


def rollup_rows(operator_id: int, t0_ms: int, t1_ms: int) -> list[RollupRow]:
    """Every forecast signal's hourly rollups of the operator with buckets in [t0_ms, t1_ms)."""
    rows = (
        SeriesRollup.objects.for_tenant(operator_id)
        .filter(
            bucket_start_ms__gte=t0_ms,
            bucket_start_ms__lt=t1_ms,
            series__name__in=[*GPU_COUNTERS, *GPU_GAUGES, *IB_COUNTERS],
        )
        .values_list(
            "series_id",
            "series__name",
            "series__gpu",
            "series__node__hostname",
            "series__labels",
            "bucket_start_ms",
            "first",
            "last",
            "max",
            "min",
        )
        .order_by("series_id", "bucket_start_ms")
    )
    return [
        RollupRow(sid, name, gpu or "", node or "", labels or {}, b, f, la, mx, mn)
        for sid, name, gpu, node, labels, b, f, la, mx, mn in rows
    ]


def warning_xids(operator_id: int, t0_ms: int, t1_ms: int) -> list[tuple[str, int]]:
    """(gpu, hour bucket start ms) of each warning XID (63, 92, …) in [t0_ms, t1_ms)."""
    rows = (
        Event.objects.for_tenant(operator_id)
        .filter(name=signals.EVENT_XID, ts_us__gte=t0_ms * 1000, ts_us__lt=t1_ms * 1000)
        .exclude(gpu="")
        .values_list("gpu", "ts_us", "value")
    )
    return [
        (gpu, (ts_us // 1000) - (ts_us // 1000) % 3_600_000)
        for gpu, ts_us, value in rows
        if xid_kind(value) == WARNING
    ]


def forecasts(operator_id: int) -> QuerySet[ComponentForecast]:
    return ComponentForecast.objects.for_tenant(operator_id)


def existing(operator_id: int, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    wanted = set(keys)
    kinds = {k for k, _ in wanted}
    out = {}
    for row in ComponentForecast.objects.for_tenant(operator_id).filter(kind__in=kinds):
        if (row.kind, row.key) in wanted:
            out[(row.kind, row.key)] = row
    return out


def flagged(operator_id: int) -> list[ComponentForecast]:
    """Components at watch or above, most at risk first."""
    return list(
        ComponentForecast.objects.for_tenant(operator_id)
        .exclude(level="ok")
        .order_by("-risk_7d", "kind", "key")
    )


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    nodes: tuple[str, ...]
    gpus: int


def running_jobs(operator_id: int) -> list[RunningJob]:
    """The operator's running jobs with the nodes their processes are on (what a drain would
    interrupt)."""
    jobs = {
        j.pk: j
        for j in Job.objects.for_tenant(operator_id).filter(state="running").only("pk", "job_id")
    }
    if not jobs:
        return []
    nodes: dict[int, set[str]] = {}
    gpus: dict[int, set[str]] = {}
    for job_pk, host, gpu in (
        Process.objects.for_tenant(operator_id)
        .filter(job_id__in=list(jobs), exited_at__isnull=True)
        .values_list("job_id", "node__hostname", "gpu")
    ):
        nodes.setdefault(job_pk, set()).add(host)
        if gpu:
            gpus.setdefault(job_pk, set()).add(gpu)
    return [
        RunningJob(jobs[pk].job_id, tuple(sorted(hosts)), len(gpus.get(pk, ())) or len(hosts))
        for pk, hosts in nodes.items()
    ]
