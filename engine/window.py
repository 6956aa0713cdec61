"""Windows: a job's (or a GPU's) signals over [t0, t1], aligned as numpy arrays.

    window = build_job_window(store, "job-42", t0, t1)   # store: TraceStore or IngestStore
    window.gpu[signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE]    # (ranks, T), NaN where not sampled
    window.proc[signals.CUDA_SYNC_MS]                      # (ranks, T), the rank's main process
    window.steps                                           # parsed training-log progress lines
    window.missing_sources                                 # what could not be seen

Every time series is put on one grid `times` (t0 + k·dt, dt = the job's sampling interval) by
rounding each sample to its nearest grid point, so detectors compare ranks sample by sample.
The same builder serves the live pipeline (an `IngestStore`) and `proof analyze` (a
`TraceStore`): detectors never know which one they got.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from contract import signals
from contract.parsers import training as tp
from contract.rows import EventRow, JobMeta, LogRow, SeriesData
from engine import window_grid
from engine.store import FLEET_HEALTH_SIGNALS, GpuHealthStore, SignalStore, is_gpu_scope

# Source names a verdict reports under "could not see".
SRC_DCGM_PROFILING = "dcgm_profiling"  # DCGM_FI_PROF_* (tensor/SM/engine activity)
SRC_NVML = "nvml"  # utilization, power, clocks, throttle reasons
SRC_GPU_COUNTERS = "gpu_counters"  # ECC / remap / NVLink / PCIe counters
SRC_EBPF = "ebpf"  # cuda.* / nccl.* per process
SRC_TRAINING_LOG = "training_log"  # step/loss lines
SRC_INFINIBAND = "infiniband"
SRC_STORAGE = "storage"
SRC_INFERENCE = "inference_metrics"

SOURCE_DESCRIPTIONS: dict[str, str] = {
    SRC_DCGM_PROFILING: "DCGM profiling fields (tensor/SM activity per GPU)",
    SRC_NVML: "NVML readings (utilization, power, clocks, throttle reasons)",
    SRC_GPU_COUNTERS: "GPU error counters (ECC, row remaps, NVLink, PCIe)",
    SRC_EBPF: "eBPF timing of CUDA/NCCL calls per process",
    SRC_TRAINING_LOG: "the job's training log (steps, loss, checkpoints)",
    SRC_INFINIBAND: "InfiniBand port counters",
    SRC_STORAGE: "storage mount counters",
    SRC_INFERENCE: "inference-server metrics",
}

_PROF = (
    signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    signals.DCGM_FI_PROF_SM_ACTIVE,
    signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    node: str
    gpu: str
    gpu_index: int | None
    pid: int | None


@dataclass
class StepTable:
    """Training progress lines of one job, oldest first (NaN where a framework omits a field).

    A row is one progress line: a metrics line (loss, grad norm, LR) or a progress bar that
    only says which step the job is at. A NaN in `loss` is ambiguous on its own — the line
    printed `nan`, or it printed no loss at all — so `has_loss` says which rows printed one
    (finite or not); None means every row did (tables built by hand). Use `with_loss()` for
    anything about the loss."""

    ts: np.ndarray
    step: np.ndarray  # float (NaN when the line had none)
    loss: np.ndarray
    lr: np.ndarray
    grad_norm: np.ndarray
    iter_ms: np.ndarray
    has_loss: np.ndarray | None = None  # bool: the line printed a loss (finite or not)
    epoch: np.ndarray | None = None  # float, NaN where the line printed none
    grad_bad: np.ndarray | None = None  # bool: the line printed a non-finite grad norm

    @classmethod
    def empty(cls) -> StepTable:
        z = np.zeros(0)
        return cls(z, z, z, z, z, z)

    def __len__(self) -> int:
        return len(self.ts)

    def with_loss(self) -> StepTable:
        """Only the rows that printed a loss (progress bars with a step and nothing else
        dropped): a missing loss is never a non-finite one."""
        if self.has_loss is None or bool(self.has_loss.all()):
            return self
        k = self.has_loss
        # every column, whatever columns come later; has_loss is all-true once filtered
        kept: dict[str, Any] = {
            f.name: None if (v := getattr(self, f.name)) is None else v[k]
            for f in fields(self)
            if f.name != "has_loss"
        }
        return StepTable(**kept)

    def grad_nonfinite(self) -> np.ndarray:
        """Rows whose line printed a non-finite gradient norm (`nan`, `inf`); a line without
        one is not counted. Tables built by hand (no `grad_bad`) count a NaN after the first
        finite value (a column that is all NaN was never printed)."""
        if self.grad_bad is not None:
            return self.grad_bad
        fin = np.isfinite(self.grad_norm)
        bad: np.ndarray = ~fin & np.maximum.accumulate(fin)
        return bad


@dataclass(frozen=True)
class Checkpoint:
    begin: float | None
    end: float | None
    path: str | None
    step: int | None


@dataclass(frozen=True)
class LogEvent:
    ts: float
    kind: str  # a training-parser kind: nccl_timeout, traceback_end, fatal, cuda_oom, exit, …
    rank: int | None
    text: str


@dataclass
class JobWindow:
    job: str
    meta: JobMeta
    t0: float
    t1: float
    dt: float
    times: np.ndarray  # (T,)
    ranks: list[RankInfo]
    gpu: dict[str, np.ndarray]  # GPU-scope signal -> (R, T)
    proc: dict[str, np.ndarray]  # process-scope signal of the rank's main pid -> (R, T)
    worker_cpu: np.ndarray | None  # (R, T): busiest input-worker process of each rank (cores)
    gpu_raw: dict[str, dict[str, SeriesData]]  # GPU uuid -> counter name -> raw series
    node_series: dict[str, list[SeriesData]]  # node -> its IB/storage/host series
    inference: list[SeriesData]
    steps: StepTable
    checkpoints: list[Checkpoint]
    log_events: list[LogEvent]
    logs: list[LogRow]
    events: list[EventRow]  # events on the job's nodes/GPUs within the window
    related: dict[str, StepTable] = field(default_factory=dict)  # reruns: job id -> steps
    related_meta: dict[str, JobMeta] = field(default_factory=dict)
    missing_sources: set[str] = field(default_factory=set)
    # What built gpu/proc/worker_cpu, for the next window of the job to update (live).
    matrices: window_grid.Matrices | None = field(default=None, repr=False, compare=False)

    @property
    def world(self) -> int:
        return len(self.ranks)

    def ts_at(self, i: int) -> float:
        return float(self.times[min(max(i, 0), len(self.times) - 1)])

    def job_gpus(self) -> list[tuple[str, str, int | None]]:
        return [(r.gpu, r.node, r.gpu_index) for r in self.ranks if r.gpu]

    def job_nodes(self) -> list[str]:
        return sorted({r.node for r in self.ranks if r.node} | set(self.meta.nodes))


@dataclass
class GpuWindow:
    """One GPU's health signals over a (long) window, for fleet health (`gpu_degrading`)."""

    gpu: str
    node: str
    gpu_index: int | None
    t0: float
    t1: float
    series: dict[str, SeriesData]
    events: list[EventRow]
    jobs: list[str] = field(default_factory=list)  # jobs seen on the GPU in the window


def _interval(series: list[SeriesData]) -> float:
    """The sampling interval: the median spacing of the densest series (1 s if unknown)."""
    best = 0
    dt = 1.0
    for s in series:
        if len(s.ts) > best and len(s.ts) > 2:
            d = np.diff(s.ts)
            d = d[d > 0]
            if len(d):
                best = len(s.ts)
                dt = float(np.median(d))
    return max(dt, 1e-3)


# Fewer samples than this in the densest GPU series without a pid is not the job's cadence
# (e.g. the few samples taken before the job's processes were known).
MIN_CADENCE_SAMPLES = 10


def job_sampling_interval(series: list[SeriesData]) -> float:
    """The job's grid spacing. GPU-scope series without a pid are preferred: process-scope
    series can run at another cadence. When the agent keyed every GPU sample with the job's
    pid, the untagged ones are only a handful and their spacing is meaningless, so every GPU
    series counts then (a 154 s grid over a 420 s job was seen that way)."""
    untagged = [s for s in series if s.info.gpu and not s.info.pid]
    if max((len(s.ts) for s in untagged), default=0) >= MIN_CADENCE_SAMPLES:
        return _interval(untagged)
    gpu_scope = [s for s in series if s.info.gpu]
    return _interval(gpu_scope or series)


def merge_series(parts: list[SeriesData]) -> SeriesData:
    """One series from pieces of the same signal (identity changed mid-way), in time order."""
    if len(parts) == 1:
        return parts[0]
    ts = np.concatenate([p.ts for p in parts])
    vals = np.concatenate([p.values for p in parts])
    order = np.argsort(ts, kind="stable")
    return SeriesData(parts[0].info, ts[order], vals[order])


def _bar_refreshes(rows: list[LogRow]) -> list[LogRow]:
    """Rows with Lightning's tqdm bar split into its refreshes. Outside a terminal the bar
    redraws with `\r` and never ends its line, so one log line holds a whole fit, a
    `train_loss_step=` per refresh; the parser reads one state a line (the last), which would
    leave the run one loss point. Only bars that carry a loss are split: a plain progress
    bar's refreshes say nothing its last one does not."""
    out: list[LogRow] = []
    for row in rows:
        line = row.line
        if "\r" in line and "Epoch " in line and "_loss" in line:
            parts = [part for part in line.split("\r") if part.strip()]
            if len(parts) > 1:
                out.extend(replace(row, line=part) for part in parts)
                continue
        out.append(row)
    return out


def parse_logs(rows: list[LogRow]) -> tuple[StepTable, list[Checkpoint], list[LogEvent]]:
    """Training progress, checkpoints and errors from a job's log lines (contract/parsers/training).

    Progress lines are kept once per step (ranks that all print the same step are merged: the
    first line wins) so a step's loss is counted once."""
    parsers: dict[tuple[str, int | None], tp.LogParser] = {}
    seen_steps: set[int] = set()
    # ts, step, loss, lr, grad norm, iter ms, printed a loss (1/0), epoch, grad non-finite (1/0)
    cols: list[tuple[float, float, float, float, float, float, float, float, float]] = []
    end_epochs: list[tuple[float, float]] = []  # (ts, epoch) of "training done" summaries
    ckpts: list[Checkpoint] = []
    open_ckpt: dict[str | None, tuple[float, str | None, int | None]] = {}
    begun_steps: set[int] = set()
    events: list[LogEvent] = []
    nan = float("nan")

    def f(x: float | None) -> float:
        return nan if x is None else float(x)

    for row in _bar_refreshes(rows):
        parser = parsers.setdefault((row.node, row.pid), tp.LogParser())
        p = parser.feed(row.line)
        if p is None:
            continue
        rank = p.rank if p.rank is not None else row.rank
        if p.kind == tp.PROGRESS:
            if p.step is not None:
                if p.step in seen_steps:
                    continue
                seen_steps.add(p.step)
            cols.append(
                (
                    row.ts,
                    f(p.step),
                    f(p.loss),
                    f(p.lr),
                    f(p.grad_norm),
                    f(p.iter_ms),
                    0.0 if p.loss is None else 1.0,
                    f(p.epoch),
                    0.0 if p.grad_norm is None or math.isfinite(p.grad_norm) else 1.0,
                )
            )
        elif p.kind == tp.CHECKPOINT_BEGIN:
            if p.path is None and p.step is not None and p.step in begun_steps:
                # A save-progress bar ("Writing model shards") inside a save whose own
                # "Saving model checkpoint to …" line was already seen: the same save.
                continue
            if p.step is not None:
                begun_steps.add(p.step)
            # One save is printed by every rank in some frameworks: keep the first begin.
            key = p.path
            if key in open_ckpt and row.ts - open_ckpt[key][0] > 30.0:
                # A new save to the same place and the last one never printed an end line
                # (nanoGPT prints only "saving checkpoint to …"): keep it as begin-only.
                begin, path, step = open_ckpt.pop(key)
                ckpts.append(Checkpoint(begin, None, path, step))
            if key not in open_ckpt:  # else the same save printed by another rank
                open_ckpt[key] = (row.ts, p.path, p.step)
        elif p.kind == tp.CHECKPOINT_END:
            # Pair with the open save whose path contains this one's (frameworks print the
            # save directory first, then files inside it), else the oldest open save.
            key = next(
                (k for k in open_ckpt if k and p.path and p.path.startswith(k)),
                next(iter(open_ckpt), None) if open_ckpt else None,
            )
            if open_ckpt and key in open_ckpt:
                begin, path, step = open_ckpt.pop(key)
                ckpts.append(Checkpoint(begin, row.ts, path or p.path, step))
            elif ckpts and ckpts[-1].path and p.path and p.path.startswith(ckpts[-1].path):
                # A later "saved" line of the same save (weights after config): it ends later.
                last = ckpts[-1]
                ckpts[-1] = Checkpoint(last.begin, row.ts, last.path, last.step)
            elif not ckpts or ckpts[-1].end is None or row.ts - ckpts[-1].end > 1.0:
                ckpts.append(Checkpoint(None, row.ts, p.path, p.step))
        elif p.kind in (
            tp.NCCL_TIMEOUT,
            tp.NCCL_ERROR,
            tp.TRACEBACK_END,
            tp.FATAL,
            tp.CUDA_OOM,
            tp.EXIT,
            tp.COMPLETED,
        ):
            events.append(LogEvent(row.ts, p.kind, rank, (p.error or row.line)[:300]))
            if p.kind == tp.COMPLETED and p.epoch is not None:
                end_epochs.append((row.ts, p.epoch))
    for begin, path, step in open_ckpt.values():
        ckpts.append(Checkpoint(begin, None, path, step))
    ckpts.sort(key=lambda c: c.begin if c.begin is not None else (c.end or 0.0))
    if not cols:
        return StepTable.empty(), ckpts, events
    arr = np.array(cols, dtype=np.float64)
    order = np.argsort(arr[:, 0], kind="stable")
    arr = arr[order]
    _steps_from_epochs(arr, end_epochs)
    return (
        StepTable(
            arr[:, 0],
            arr[:, 1],
            arr[:, 2],
            arr[:, 3],
            arr[:, 4],
            arr[:, 5],
            arr[:, 6] > 0,
            arr[:, 7],
            arr[:, 8] > 0,
        ),
        ckpts,
        events,
    )


# A metrics line and the progress-bar line that ends just after it describe the same step:
# the Trainer prints its metrics dict, then starts a save, whose newline ends the bar's
# \r-collapsed line. Recorded gaps: 0–100 ms (agent/tests/data/real/); 0.5 s before to
# 0.1 s after (the two streams are read apart) leaves room for a loaded machine, and a save
# on a step that logged nothing is further from its last dict than that at any realistic
# step time — and if not, the readings disagree and no step is given.
_EPOCH_PAIR_BEFORE_S = 0.5
_EPOCH_PAIR_AFTER_S = 0.1
# Exact pairs agree to the epoch's printed precision (transformers 5: 4 significant digits).
_EPOCH_RATIO_TOL = 0.005


def _steps_from_epochs(arr: np.ndarray, end_epochs: list[tuple[float, float]]) -> None:
    """Give step numbers to metrics lines that print an epoch but no step (the Hugging Face
    Trainer's `{'loss': …, 'epoch': 3.125}`), in place.

    The Trainer's epoch is global step ÷ steps per epoch. A progress bar (`100/300`) whose
    line ends right after a metrics line or the run's final summary (≤ 0.5 s) gives one
    reading of steps per epoch; with readings that agree (a majority within 0.5% of their
    median), each metrics line's step is its epoch × that ratio, rounded — if that makes the
    steps strictly increase (an epoch printed as `0.01` may not tell them apart). Otherwise
    the steps stay unknown: no step rather than a wrong one."""
    ts, step, has_loss, epoch = arr[:, 0], arr[:, 1], arr[:, 6] > 0, arr[:, 7]
    need = has_loss & np.isnan(step) & np.isfinite(epoch) & (epoch > 0)
    bars = ~has_loss & np.isfinite(step) & (step > 0)
    if not need.any() or not bars.any():
        return
    e_ts = np.concatenate([ts[need], np.array([t for t, _ in end_epochs])])
    e_val = np.concatenate([epoch[need], np.array([e for _, e in end_epochs])])
    ok = np.isfinite(e_val) & (e_val > 0)
    e_ts, e_val = e_ts[ok], e_val[ok]
    if not len(e_ts):
        return
    ratios = []
    for t, s in zip(ts[bars], step[bars], strict=True):
        gap = e_ts - t  # negative: the metrics line came first
        near = (gap >= -_EPOCH_PAIR_BEFORE_S) & (gap <= _EPOCH_PAIR_AFTER_S)
        if near.any():
            j = int(np.flatnonzero(near)[np.argmin(np.abs(gap[near]))])
            ratios.append(s / e_val[j])
    if not ratios:
        return
    r = np.array(ratios)
    mid = float(np.median(r))
    good = np.abs(r - mid) <= _EPOCH_RATIO_TOL * mid
    if good.sum() * 2 < len(r):
        return  # the readings disagree: better no step than a wrong one
    per_epoch = float(np.median(r[good]))
    est = np.rint(epoch[need] * per_epoch)
    if len(est) > 1 and not (np.diff(est) > 0).all():
        return  # an epoch printed too coarsely (`0.01`) to tell logged steps apart
    arr[need, 1] = est


def job_span(store: SignalStore, job: str) -> tuple[float, float]:
    """[first, last] time the store saw the job (the trace's range where it has no record)."""
    meta = store.jobs().get(job)
    lo, hi = store.time_range()
    if meta is None:
        return lo, hi
    a = meta.first_ts if np.isfinite(meta.first_ts) else lo
    b = meta.last_ts if np.isfinite(meta.last_ts) else hi
    return a, max(b, a)


def build_job_window(
    store: SignalStore,
    job: str,
    t0: float | None = None,
    t1: float | None = None,
    *,
    reuse: window_grid.Matrices | None = None,
    changed_from: float | None = None,
) -> JobWindow:
    """The job's window; [t0, t1] defaults to the job's whole observed life.

    `reuse`, `changed_from`: the previous window's `matrices` of this job and the earliest
    sample time the store's data may differ from what that window saw (the live pipeline's
    cache: engine/window_grid.py); the matrices are then updated, not rebuilt."""
    a, b = job_span(store, job)
    t0 = a if t0 is None else t0
    t1 = b if t1 is None else t1
    meta = store.jobs().get(job) or JobMeta(job=job)
    series = store.job_series(job, t0, t1)
    procs = store.processes(job)
    # Ranks: the processes that hold a GPU (one per rank); inference servers without a rank are
    # numbered by GPU.
    main: dict[int, RankInfo] = {}
    for p in sorted(procs, key=lambda p: p.first_ts):
        if not p.gpu:
            continue
        r = p.rank
        if r is None:
            r = len(main)
        if r not in main:
            main[r] = RankInfo(r, p.node, p.gpu, p.gpu_index, p.pid)
    for s in series:  # samples that carry a rank and GPU even without a process record
        i = s.info
        if i.rank is not None and i.gpu and i.rank not in main:
            main[i.rank] = RankInfo(i.rank, i.node, i.gpu, i.gpu_index, i.pid)
    ranks = [main[r] for r in sorted(main)]
    row_of_gpu = {r.gpu: k for k, r in enumerate(ranks)}
    row_of_pid = {(r.node, r.pid): k for k, r in enumerate(ranks) if r.pid is not None}
    row_of_rank = {r.rank: k for k, r in enumerate(ranks)}

    dt = job_sampling_interval(series)
    n_t = max(1, int(np.floor((t1 - t0) / dt)) + 1)
    times = t0 + dt * np.arange(n_t)
    n_r = len(ranks)
    gpu_raw: dict[str, dict[str, SeriesData]] = {}
    inference: list[SeriesData] = []
    gpu_parts: dict[tuple[str, str], list[SeriesData]] = {}
    # Process-scope series to place, per signal: (rows, series), placed together below.
    proc_parts: dict[str, tuple[list[int], list[SeriesData]]] = {}
    worker_rows: list[int] = []
    worker_parts: list[SeriesData] = []
    # Per name, not per series: a 200-GPU job's window has ~13,000 series of ~30 names.
    gpu_scope: dict[str, bool] = {}
    for s in series:
        i = s.info
        if i.name.startswith(signals.INFERENCE_PREFIXES):
            inference.append(s)
            continue
        scoped = gpu_scope.get(i.name)
        if scoped is None:
            scoped = gpu_scope[i.name] = is_gpu_scope(i.name)
        if scoped:
            # The agent joins identity at collection time, so one GPU's signal arrives in
            # pieces (before the job, with the job's pid/rank): merged per (GPU, name).
            if i.gpu in row_of_gpu:
                gpu_parts.setdefault((i.gpu, i.name), []).append(s)
            continue
        if i.pid is not None:
            row = row_of_pid.get((i.node, i.pid))
            if row is not None:
                rows_of, parts_of = proc_parts.setdefault(i.name, ([], []))
                rows_of.append(row)
                parts_of.append(s)
            elif i.name == signals.HOST_CPU_UTIL and i.rank is not None:
                row = row_of_rank.get(i.rank)
                if row is not None:
                    worker_rows.append(row)
                    worker_parts.append(s)
    # Per signal, per GPU row the pieces of its series, merged in time order by the grid
    # (only the part it places, when it updates the last window's matrices).
    gpu_groups: dict[str, tuple[list[int], list[list[SeriesData]]]] = {}
    for (g, name), parts in gpu_parts.items():
        rows_of, pieces_of = gpu_groups.setdefault(name, ([], []))
        rows_of.append(row_of_gpu[g])
        if signals.is_cumulative(name):
            merged = merge_series(parts)
            gpu_raw.setdefault(g, {})[name] = merged
            pieces_of.append([merged])
        else:
            pieces_of.append(parts)
    groups = window_grid.Groups(
        gpu=gpu_groups,
        # nccl.* come per op: summed over ops.
        proc={
            name: (rows_of, parts_of, name.startswith(signals.NCCL_PREFIX))
            for name, (rows_of, parts_of) in proc_parts.items()
        },
        worker=(worker_rows, worker_parts),
    )
    layout = (tuple(ranks), tuple(gpu_groups), tuple(proc_parts), tuple(worker_rows))
    matrices = window_grid.place(
        groups, window_grid.Grid(t0, dt, n_t), n_r, layout, reuse, changed_from
    )
    gpu, proc, worker = matrices.gpu, matrices.proc, matrices.worker
    nodes = sorted({r.node for r in ranks if r.node} | set(meta.nodes))
    node_series: dict[str, list[SeriesData]] = {}
    events: list[EventRow] = []
    job_gpus = {r.gpu for r in ranks}
    for node in nodes:
        node_series[node] = [
            s
            for s in store.node_series(node, t0, t1)
            if not s.info.gpu and s.info.pid is None and not s.info.job
        ]
        events.extend(
            e for e in store.events(node=node, t0=t0, t1=t1) if not e.gpu or e.gpu in job_gpus
        )
    events.sort(key=lambda e: e.ts)
    logs = store.job_logs(job, t0, t1)
    steps, ckpts, log_events = parse_logs(logs)
    related: dict[str, StepTable] = {}
    related_meta: dict[str, JobMeta] = {}
    for other, m in store.jobs().items():
        if other != job and (m.rerun_of == job or meta.rerun_of == other):
            lo, hi = job_span(store, other)
            related[other] = parse_logs(store.job_logs(other, lo, hi))[0]
            related_meta[other] = m
    window = JobWindow(
        job=job,
        meta=meta,
        t0=t0,
        t1=t1,
        dt=dt,
        times=times,
        ranks=ranks,
        gpu=gpu,
        proc=proc,
        worker_cpu=worker,
        gpu_raw=gpu_raw,
        node_series=node_series,
        inference=inference,
        steps=steps,
        checkpoints=ckpts,
        log_events=log_events,
        logs=logs,
        events=events,
        related=related,
        related_meta=related_meta,
        matrices=matrices,
    )
    window.missing_sources = missing_sources(window)
    return window


def missing_sources(w: JobWindow) -> set[str]:
    """Sources with no data in the window (what a verdict says it could not see)."""
    missing: set[str] = set()

    def has(d: dict[str, np.ndarray], name: str) -> bool:
        a = d.get(name)
        return a is not None and bool(np.isfinite(a).any())

    if w.meta.kind == "inference":
        if not w.inference:
            missing.add(SRC_INFERENCE)
        return missing
    if not any(has(w.gpu, n) for n in _PROF):
        missing.add(SRC_DCGM_PROFILING)
    if not has(w.gpu, signals.DCGM_FI_DEV_GPU_UTIL) and not has(
        w.gpu, signals.DCGM_FI_DEV_SM_CLOCK
    ):
        missing.add(SRC_NVML)
    if not w.gpu_raw:
        missing.add(SRC_GPU_COUNTERS)
    if not has(w.proc, signals.CUDA_LAUNCHES) and not has(w.proc, signals.CUDA_SYNC_MS):
        missing.add(SRC_EBPF)
    if not len(w.steps) and not w.checkpoints:
        missing.add(SRC_TRAINING_LOG)
    names = {s.info.name for ss in w.node_series.values() for s in ss}
    if len(w.job_nodes()) > 1 and not any(n.startswith(signals.IB_PREFIX) for n in names):
        missing.add(SRC_INFINIBAND)
    if not any(n.startswith(signals.STORAGE_PREFIX) for n in names):
        missing.add(SRC_STORAGE)
    return missing


def build_gpu_window(
    store: GpuHealthStore, gpu: str, node: str, gpu_index: int | None, t0: float, t1: float
) -> GpuWindow:
    parts: dict[str, list[SeriesData]] = {}
    # Only the health signals are read: a GPU's 6 h of every signal (~40 series) is what a
    # fleet-health pass per GPU every 10 min cannot afford at 10,000 GPUs.
    for s in store.gpu_series(gpu, t0, t1, FLEET_HEALTH_SIGNALS):
        if s.info.name in FLEET_HEALTH_SIGNALS:
            parts.setdefault(s.info.name, []).append(s)
    series = {name: merge_series(p) for name, p in parts.items()}
    events = [e for e in store.events(node=node, t0=t0, t1=t1) if e.gpu == gpu]
    jobs = sorted(j for j in store.jobs() if any(p.gpu == gpu for p in store.processes(j)))
    return GpuWindow(gpu, node, gpu_index, t0, t1, series, events, jobs)
