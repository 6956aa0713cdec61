"""Statistics the detectors share. All of them are relative: ranks against each other, a
series against its own history, so that no threshold depends on a GPU model or a job's size."""

from __future__ import annotations

import time
from statistics import NormalDist

import numpy as np

from contract import signals
from contract.verdicts import subject
from engine.findings import Finding
from engine.window import JobWindow, StepTable

# Samples a statistic needs before it says anything: 20 samples (20 s at the usual 1 s
# interval) keeps a t-test over 10-sample blocks at two blocks or more and a median stable.
MIN_SAMPLES = 20


def new_finding(
    family: str,
    category: str,
    title: str,
    interval: tuple[float, float],
    confidence: float = 0.0,
    recommendation: str = "",
    *,
    job: str | None = None,
    node: str | None = None,
    gpu: str | None = None,
    rank: int | None = None,
    mount: str | None = None,
) -> Finding:
    """A detector's finding before its evidence is in: the summary and explanation cite
    evidence ids, so the detector writes them after; job … mount name its subject."""
    return Finding(
        family=family,
        category=category,
        title=title,
        summary="",
        recommendation=recommendation,
        explanation="",
        confidence=confidence,
        interval=interval,
        subject=subject(job, node, gpu, rank, mount),
    )


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
    active: np.ndarray = finite & (lead >= 0.2 * usual)
    return active


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
    return table_step_seconds(w.steps)


def table_step_seconds(st: StepTable) -> float:
    """`step_seconds` of a table of parsed progress lines (engine.window.parse_logs)."""
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


def step_means(x: np.ndarray, times: np.ndarray, blk: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-step means of (ranks, n) samples over blocks of `blk` samples (`step_blocks`), and
    each block's first time. Blocks end at the last sample, so the newest steps are judged
    whole; the oldest samples short of a block are left out."""
    nb = x.shape[1] // blk
    off = x.shape[1] - nb * blk
    means: np.ndarray = x[:, off:].reshape(x.shape[0], nb, blk).mean(axis=2)
    return means, times[off::blk][:nb]


# --- Materiality (docs/detectors.md "Materiality") -------------------------------------------
# A slowdown verdict must cost the job at least 5% of its speed. Healthy jobs vary by a few
# percent: step-to-step compute jitter of 1.5–4% per rank (docs: published and measured
# figures), GPU-to-GPU clock variation of a few percent, run-to-run variation of step time of a
# few percent. A verdict claiming less cannot be told from that noise and is not worth a ticket.
MATERIAL_MIN_SLOWDOWN_PCT = 5.0
# Per-rank per-step compute jitter of a healthy job (relative sd), the top of the realistic
# band: with it, ranks of a perfectly balanced job still wait for the slowest one each step
# (about HEALTHY_JITTER_SD × E[max of N normals] of a step: 5.7% at 8 ranks, 9.8% at 64). That
# waiting is not a sampler problem; only waiting beyond it is attributed to an imbalance.
HEALTHY_JITTER_SD = 0.04
# Families whose impact is a slowdown of the job (slowdown_pct and gpu_hours_lost stated; no
# verdict below the floor), and those whose impact is GPU time alone: a hang makes no progress
# at all; an underfilled endpoint is not slow, it pays for GPUs it does not fill.
SLOWDOWN_FAMILIES = frozenset(
    {"slow_rank", "sequence_imbalance", "input_starvation", "checkpoint_stall", "fabric_degraded"}
)
GPU_TIME_FAMILIES = frozenset({"collective_hang", "underfilled_batches"})


def expected_max_normal(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation; 0 for n ≤ 1)."""
    if n <= 1:
        return 0.0
    return float(NormalDist().inv_cdf((n - 0.375) / (n + 0.25)))


def jitter_wait(world: int, sd: float = HEALTHY_JITTER_SD) -> float:
    """Mean share of a step a rank of a balanced `world`-rank job waits for the slowest rank
    when every rank's compute time varies by `sd` (relative) step to step."""
    return sd * expected_max_normal(world)


def is_material(f: Finding) -> bool:
    """Whether a finding's stated impact clears the floor (non-slowdown families always do)."""
    if f.family in SLOWDOWN_FAMILIES:
        return f.slowdown_pct is not None and f.slowdown_pct >= MATERIAL_MIN_SLOWDOWN_PCT
    if f.family == "underfilled_batches":
        return f.gpu_hours_lost is not None and f.gpu_hours_lost > 0
    return True


def _duration(seconds: float) -> str:
    s = round(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def state_impact(f: Finding, w: JobWindow) -> None:
    """Give a slowdown or GPU-time finding its impact: evidence entries for the slowdown and
    the GPU-hours lost, and one sentence at the end of its summary citing them."""
    if f.family not in SLOWDOWN_FAMILIES | GPU_TIME_FAMILIES or f.details.get("impact"):
        return
    a, b = f.interval
    n_gpus = len({r.gpu for r in w.ranks if r.gpu}) or max(1, w.world)
    hours = f.gpu_hours_lost
    cites: list[str] = []
    if f.slowdown_pct is not None:
        cites.append(
            f.add(
                "impact: slowdown",
                (a, b),
                round(float(f.slowdown_pct), 1),
                MATERIAL_MIN_SLOWDOWN_PCT,
                "how much slower the job ran because of this cause, % (time lost / time it "
                "would have taken without it); baseline: the materiality floor, below which "
                "Proof gives no verdict",
                job=w.job,
            )
        )
    if hours is not None:
        cites.append(
            f.add(
                "impact: GPU-hours lost",
                (a, b),
                round(float(hours), 3),
                None,
                f"GPU time lost to this cause over {_duration(b - a)} on the job's {n_gpus} GPU(s)",
                job=w.job,
            )
        )
    if not cites:
        return
    ref = "[" + ", ".join(cites) + "]"
    span = f"from {hhmmss(a)} for {_duration(b - a)}"
    if f.family == "collective_hang":
        text = f"Impact: the job made no progress {span} on {n_gpus} GPUs"
    elif f.family == "underfilled_batches":
        need = f.details.get("gpus_needed")
        text = f"Impact: {span}, {n_gpus} GPUs served a load" + (
            f" that {need} could carry" if need else ""
        )
    else:
        text = (
            f"Impact: the job ran {float(f.slowdown_pct or 0):.1f}% slower {span} on {n_gpus} GPUs"
        )
    if hours is not None:
        text += f", {float(hours):.2f} GPU-hours lost"
    f.summary = f.summary.rstrip() + f" {text} {ref}."
    f.details["impact"] = {"slowdown_pct": f.slowdown_pct, "gpu_hours_lost": hours}
