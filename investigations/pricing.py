"""The real price (docs/design.md §1): productive share and effective price per productive GPU-hour.

Per GPU of a job, per sample interval dt (docs/pricing.md has a worked example):

    busy    = DCGM_FI_PROF_GR_ENGINE_ACTIVE            (0–1; NVML's DCGM_FI_DEV_GPU_UTIL / 100
                                                         when profiling fields are missing)
    wait    = min(busy, cuda.sync_ms / (dt · 1000))    (host blocked in synchronize: the rank
                                                         waiting in collectives for the others;
                                                         0 when eBPF timing is missing)
    compute = busy − wait                               (useful work)
    idle    = 1 − busy                                  (stalled or idle: nothing running)

GPU time is dt per sampled interval; a sample with no `busy` reading is not counted at all
(neither billed time nor productive time: we cannot say). Then

    productive share          = Σ compute · dt / Σ dt
    effective price per productive GPU-hour
                              = Σ (gpu-hours · list price of the GPU's model) / Σ compute-hours
                              = list price / productive share   (one GPU model)

A waiting rank's engine is active (the NCCL kernel spins), which is why engine activity alone
would call a straggling job fully productive; the eBPF sync time is what separates the two.
Without eBPF (`method` "engine" or "util") the share is an upper bound and says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np

from contract import signals
from ingest import selectors as ingest_selectors

METHOD_ENGINE_EBPF = "engine+ebpf"
METHOD_ENGINE = "engine"
METHOD_UTIL = "util"
METHOD_UTIL_EBPF = "util+ebpf"


@dataclass(frozen=True)
class GpuSplit:
    gpu: str
    node: str
    gpu_seconds: float
    compute_seconds: float
    wait_seconds: float
    idle_seconds: float
    first_ts: float
    last_ts: float
    method: str


def split_gpu_time(
    window: Any, *, after: float | None = None, until: float | None = None
) -> list[GpuSplit]:
    """Each of the window's GPUs' time in (after, until], split by the formula above.

    `window` is a JobWindow (engine.window): `times` (T,), `dt`, `ranks` (rank, node,
    gpu), `gpu[name]` and `proc[name]` arrays of shape (ranks, T) with NaN where unsampled."""
    times = np.asarray(window.times, dtype=np.float64)
    if not len(times) or not window.ranks:
        return []
    dt = float(window.dt)
    keep = np.ones(len(times), dtype=bool)
    if after is not None:
        keep &= times > after
    if until is not None:
        keep &= times <= until
    engine = window.gpu.get(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE)
    util = window.gpu.get(signals.DCGM_FI_DEV_GPU_UTIL)
    sync = window.proc.get(signals.CUDA_SYNC_MS)
    out = []
    for row, rank in enumerate(window.ranks):
        if not rank.gpu:
            continue
        busy, method = _busy(engine, util, row, len(times))
        valid = keep & np.isfinite(busy)
        if not valid.any():
            continue
        b = np.clip(busy[valid], 0.0, 1.0)
        wait = np.zeros_like(b)
        if sync is not None and np.isfinite(sync[row]).any():
            w = sync[row][valid] / (dt * 1000.0)
            wait = np.clip(np.where(np.isfinite(w), w, 0.0), 0.0, b)
            method += "+ebpf"
        n = int(valid.sum())
        ts = times[valid]
        out.append(
            GpuSplit(
                gpu=rank.gpu,
                node=rank.node,
                gpu_seconds=n * dt,
                compute_seconds=float((b - wait).sum() * dt),
                wait_seconds=float(wait.sum() * dt),
                idle_seconds=float((1.0 - b).sum() * dt),
                first_ts=float(ts[0]),
                last_ts=float(ts[-1]),
                method=method,
            )
        )
    return out


def _busy(
    engine: np.ndarray | None, util: np.ndarray | None, row: int, n: int
) -> tuple[np.ndarray, str]:
    if engine is not None and np.isfinite(engine[row]).any():
        busy = engine[row].copy()
        if util is not None:  # profiling gaps filled from NVML
            gaps = ~np.isfinite(busy)
            busy[gaps] = util[row][gaps] / 100.0
        return busy, METHOD_ENGINE
    if util is not None:
        return util[row] / 100.0, METHOD_UTIL
    return np.full(n, np.nan), METHOD_UTIL


def gpu_models(operator_id: int, nodes: Iterable[str]) -> dict[str, str]:
    """GPU uuid → model name (as registered by the nodes' agents)."""
    models: dict[str, str] = {}
    for node in nodes:
        inventory = ingest_selectors.node_inventory(operator_id, node) if node else None
        for gpu in (inventory or {}).get("gpus", []):
            models[str(gpu["uuid"])] = str(gpu.get("model") or "")
    return models


@dataclass(frozen=True)
class RealPrice:
    gpu_hours: float
    compute_hours: float
    wait_hours: float
    idle_hours: float
    productive_share: float | None
    list_cost: Decimal | None  # Σ gpu-hours × list price (None: a GPU model has no price)
    effective_price_per_productive_gpu_hour: Decimal | None
    currency: str | None
    unpriced_models: tuple[str, ...]
    methods: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_hours": round(self.gpu_hours, 6),
            "compute_hours": round(self.compute_hours, 6),
            "wait_hours": round(self.wait_hours, 6),
            "idle_hours": round(self.idle_hours, 6),
            "productive_share": (
                None if self.productive_share is None else round(self.productive_share, 6)
            ),
            "list_cost": None if self.list_cost is None else str(self.list_cost),
            "effective_price_per_productive_gpu_hour": (
                None
                if self.effective_price_per_productive_gpu_hour is None
                else str(self.effective_price_per_productive_gpu_hour)
            ),
            "currency": self.currency,
            "unpriced_models": list(self.unpriced_models),
            "methods": list(self.methods),
        }


@dataclass(frozen=True)
class UsageRow:
    gpu_model: str
    gpu_seconds: float
    compute_seconds: float
    wait_seconds: float
    idle_seconds: float
    method: str


def real_price(rows: Iterable[UsageRow], prices: dict[str, tuple[Decimal, str]]) -> RealPrice:
    """Aggregate usage rows (any set: a job, a customer, the fleet) with the operator's list
    prices (model → (price per GPU-hour, currency))."""
    rows = list(rows)
    gpu_s = sum(r.gpu_seconds for r in rows)
    compute_s = sum(r.compute_seconds for r in rows)
    share = compute_s / gpu_s if gpu_s > 0 else None
    unpriced = sorted({r.gpu_model or "(unknown model)" for r in rows if r.gpu_model not in prices})
    currencies = {prices[r.gpu_model][1] for r in rows if r.gpu_model in prices}
    cost: Decimal | None = None
    effective: Decimal | None = None
    currency = next(iter(currencies)) if len(currencies) == 1 else None
    if rows and not unpriced and len(currencies) == 1:
        cost = sum(
            (Decimal(str(r.gpu_seconds)) / 3600 * prices[r.gpu_model][0] for r in rows),
            Decimal(0),
        ).quantize(Decimal("0.0001"))
        if compute_s > 0:
            effective = (cost / (Decimal(str(compute_s)) / 3600)).quantize(Decimal("0.0001"))
    return RealPrice(
        gpu_hours=gpu_s / 3600,
        compute_hours=compute_s / 3600,
        wait_hours=sum(r.wait_seconds for r in rows) / 3600,
        idle_hours=sum(r.idle_seconds for r in rows) / 3600,
        productive_share=share,
        list_cost=cost,
        effective_price_per_productive_gpu_hour=effective,
        currency=currency,
        unpriced_models=tuple(unpriced),
        methods=tuple(sorted({r.method for r in rows if r.method})),
    )
