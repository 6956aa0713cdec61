"""Hand-built windows for detector tests (no simulator): ranks, aligned arrays, logs, events."""

from __future__ import annotations

import numpy as np

from contract import signals
from contract.rows import EventRow, JobMeta, SeriesData, SeriesInfo
from engine.detectors.common import new_finding
from engine.findings import JOB, Finding
from engine.window import JobWindow, RankInfo, StepTable

T0 = 1_767_600_000.0


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def finding(
    family: str,
    category: str = JOB,
    *,
    node: str | None = None,
    gpu: str | None = None,
    rank: int | None = None,
) -> Finding:
    """A finding about job J1 over the hand-built window's 300 s, for the code that reads one
    (the clearance)."""
    return new_finding(
        family, category, "t", (T0, T0 + 299), 0.9, job="J1", node=node, gpu=gpu, rank=rank
    )


def counter(gpu: str, name: str, values: np.ndarray, node: str = "n0") -> SeriesData:
    ts = T0 + np.arange(len(values), dtype=float)
    return SeriesData(SeriesInfo(name, node, gpu, 0, None, "", None), ts, values.astype(float))


def window(
    *,
    world: int = 8,
    n: int = 300,
    sync: np.ndarray | None = None,
    steps: StepTable | None = None,
    events: list[EventRow] | None = None,
    gpu: dict[str, np.ndarray] | None = None,
    gpu_raw: dict[str, dict[str, SeriesData]] | None = None,
    state: str = "running",
) -> JobWindow:
    ranks = [RankInfo(r, f"n{r // 4}", gpu_uuid(r), r % 4, 1000 + r) for r in range(world)]
    proc: dict[str, np.ndarray] = {}
    if sync is not None:
        proc[signals.CUDA_SYNC_MS] = sync
        proc[signals.CUDA_LAUNCHES] = np.full((world, n), 500.0)
    return JobWindow(
        job="J1",
        meta=JobMeta(job="J1", kind="training", state=state, world_size=world),
        t0=T0,
        t1=T0 + n - 1,
        dt=1.0,
        times=T0 + np.arange(n, dtype=float),
        ranks=ranks,
        gpu=gpu or {},
        proc=proc,
        worker_cpu=None,
        gpu_raw=gpu_raw or {},
        node_series={},
        inference=[],
        steps=steps or StepTable.empty(),
        checkpoints=[],
        log_events=[],
        logs=[],
        events=events or [],
    )


def healthy_sync(rng: np.random.Generator, world: int = 8, n: int = 300) -> np.ndarray:
    """Every rank waits ~150 ms per second in collectives, with 2% timing jitter."""
    return 150.0 + rng.normal(0, 15.0, (world, n))


def steps(loss: np.ndarray, *, lr: float | None = 1e-4, grad: float | None = 1.0) -> StepTable:
    k = len(loss)
    nan = np.full(k, np.nan)
    return StepTable(
        ts=T0 + 10.0 * np.arange(k),
        step=10.0 * np.arange(1, k + 1),
        loss=loss.astype(float),
        lr=nan if lr is None else np.full(k, lr),
        grad_norm=nan if grad is None else np.full(k, grad),
        iter_ms=np.full(k, 1000.0),
    )
