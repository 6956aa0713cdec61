"""Statistics the detectors share. All of them are relative: ranks against each other, a
series against its own history, so that no threshold depends on a GPU model or a job's size."""

from __future__ import annotations

import time

import numpy as np

from agent import signals
from investigations.window import JobWindow

# Samples a statistic needs before it says anything: 20 samples (20 s at the usual 1 s
# interval) keeps a t-test over 10-sample blocks at two blocks or more and a median stable.
MIN_SAMPLES = 20


def hhmmss(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts)) + " UTC"


def busy_matrix(w: JobWindow) -> tuple[np.ndarray, str] | None:
    """(ranks, T) share of each sample a rank spent not waiting for the others, and the signal
    it came from.

    Best source first: eBPF synchronize time measures the waiting directly (1 − sync/interval;
    the slowest rank waits least), whatever made the rank slow — fewer FLOPs per second or more
    work. Without eBPF, tensor-pipe activity (DCGM profiling) falls to ~0 while a rank waits in
    a collective; SM activity is next. NVML utilization cannot be used: a rank spinning in an
    NCCL kernel reads 100%.
    """
    sync = w.proc.get(signals.CUDA_SYNC_MS)
    if sync is not None and np.isfinite(sync).any():
        launches = w.proc.get(signals.CUDA_LAUNCHES)
        busy = 1.0 - np.clip(sync / (w.dt * 1000.0), 0.0, 1.0)
        if launches is not None:
            busy = np.where(np.nan_to_num(launches, nan=0.0) > 0, busy, 0.0)
        return busy, signals.CUDA_SYNC_MS
    for name in (signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, signals.DCGM_FI_PROF_SM_ACTIVE):
        a = w.gpu.get(name)
        if a is not None and np.isfinite(a).any() and np.nanmax(a) > 0:
            return a, name
    return None


def active_mask(busy: np.ndarray) -> np.ndarray:
    """Samples where every rank reported and the job was stepping.

    "Stepping": the busiest rank computed at least a fifth of its usual (median-of-active) level;
    below that the whole job is idle together (a checkpoint, input wait, init) and rank
    comparisons say nothing about stragglers."""
    finite = np.isfinite(busy).all(axis=0)
    lead = np.where(finite, np.nanmax(np.where(np.isfinite(busy), busy, -1.0), axis=0), 0.0)
    if not (lead > 0).any():
        return np.zeros(busy.shape[1], dtype=bool)
    usual = float(np.median(lead[lead > 0]))
    return finite & (lead >= 0.2 * usual)


def change_point(x: np.ndarray) -> int:
    """Index where the mean of x shifts most (standardised CUSUM); 0 when x is constant."""
    n = len(x)
    if n < 4:
        return 0
    c = np.cumsum(x - x.mean())
    k = np.arange(1, n)
    score = np.abs(c[:-1]) / np.sqrt(k * (n - k) / n)
    return int(np.argmax(score)) + 1


# A change point marks an onset only if the level at least doubles across it: fluctuations of
# a condition present all along (an imbalance that varies with the data) also have a "most
# likely" change point, but not a doubling.
ONSET_MIN_RATIO = 2.0


def shift_start(x: np.ndarray, min_len: int = MIN_SAMPLES) -> int:
    """Start of the segment where x is raised: the change point if the level after it is at
    least twice the level before, else 0 (raised from the beginning, or no onset)."""
    k = change_point(x)
    if k <= 0 or k >= len(x) or len(x) - k < min_len:
        return 0
    before, after = float(x[:k].mean()), float(x[k:].mean())
    return k if after > 0 and before <= after / ONSET_MIN_RATIO else 0


def block_tstat(x: np.ndarray, block: int = 10) -> float:
    """t statistic of mean(x) > 0 over non-overlapping block means.

    Blocks absorb the autocorrelation of 1 s samples within one training step (a 3 s step is
    3 correlated samples), so the test is not fooled by counting one slow step three times."""
    n = len(x) // block
    if n < 2:
        return 0.0
    m = x[: n * block].reshape(n, block).mean(axis=1)
    sd = float(m.std(ddof=1))
    if sd == 0:
        return float("inf") if m.mean() > 0 else 0.0
    return float(m.mean() / (sd / np.sqrt(n)))


def counter_delta(ts: np.ndarray, values: np.ndarray) -> tuple[float, float, float]:
    """(increase over the window, value at start, value at end) of a cumulative counter.

    Increases are summed step by step and counter resets (a driver reload zeroes volatile
    counters) are skipped, so a reset never reads as a negative or a giant delta."""
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return 0.0, float("nan"), float("nan")
    d = np.diff(v)
    return float(d[d > 0].sum()), float(v[0]), float(v[-1])


def rate_trend(ts: np.ndarray, values: np.ndarray, n_parts: int = 3) -> tuple[float, float]:
    """Increase per hour of a counter in the first and the last third of the window."""
    if len(ts) < 2 * n_parts:
        return 0.0, 0.0
    parts = np.array_split(np.arange(len(ts)), n_parts)
    rates = []
    for p in (parts[0], parts[-1]):
        span = float(ts[p[-1]] - ts[p[0]]) or 1.0
        d = np.diff(values[p])
        rates.append(float(d[d > 0].sum()) / span * 3600.0)
    return rates[0], rates[1]


def gpu_hours(n_gpus: int, seconds: float) -> float:
    return round(n_gpus * seconds / 3600.0, 3)


def step_seconds(w: JobWindow) -> float:
    """The job's typical iteration time from its log (time between logged steps per step, or
    the printed iteration time); NaN when the log says neither."""
    st = w.steps
    if len(st) >= 3:
        ok = np.isfinite(st.step)
        if ok.sum() >= 3:
            ds = np.diff(st.step[ok])
            dt = np.diff(st.ts[ok])
            good = ds > 0
            if good.any():
                return float(np.median(dt[good] / ds[good]))
        if np.isfinite(st.iter_ms).any():
            return float(np.nanmedian(st.iter_ms)) / 1000.0
    return float("nan")


def step_blocks(w: JobWindow) -> int:
    """Samples per training step (≥ 1): comparisons of ranks are made per step, because
    within one long step every rank is simply computing and the waiting comes at its end."""
    s = step_seconds(w)
    if not np.isfinite(s) or s <= w.dt:
        return 1
    return int(min(60, round(s / w.dt)))
