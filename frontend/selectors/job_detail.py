"""Reads of the job page (`/jobs/<job_id>/`): per-rank lanes, the training curves, the key GPU
signals per rank, the log with what the parser read, the job's verdicts and its real price.

Nothing here re-derives what the engine computes: the recent data is put in the engine's own
`JobWindow` (engine.window.build_job_window over a read-only store of ingest's selectors), the
lanes are the straggler detectors' per-step shares (engine.detectors.common: `busy_matrix`,
`active_mask`, `step_blocks`, `step_means`), the training curves are `engine.window.parse_logs`
over the job's stored lines, and each shown line is read by the same `LogParser` the detectors'
log reading uses.

The page reads a bounded amount whatever the job's age or size: the last RECENT_S of samples
(one block read), the last LOG_READ log lines (one query), and for a job longer than that the
hourly rollups of its GPU signals over the last ROLLUP_S (one query).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from dataclasses import fields as dc_fields
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import numpy as np
import orjson
from django.db.models import Case, IntegerField, Value, When
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from contract import signals
from contract.parsers import training as tp
from contract.rows import EventRow, JobMeta, LogRow, ProcessInfo, SeriesData
from engine.detectors.common import (
    active_mask,
    busy_matrix,
    step_blocks,
    step_means,
    step_seconds,
    table_step_seconds,
)
from engine.window import (
    SOURCE_DESCRIPTIONS,
    SRC_DCGM_PROFILING,
    SRC_EBPF,
    SRC_GPU_COUNTERS,
    SRC_NVML,
    SRC_TRAINING_LOG,
    JobWindow,
    StepTable,
    build_job_window,
    parse_logs,
)
from ingest import selectors as ingest_selectors
from ingest.models import Gpu, Job, LogLine, Process, SeriesRollup
from investigations.models import Incident, IncidentState, JobActivity
from investigations.pricing import RealPrice
from investigations.selectors import real_price_for
from tenants.access import Principal

# Lanes show the newest 60 steps (a row of 60 bars per rank stays legible).
LANE_STEPS = 60
# The lanes and the per-rank GPU charts cover the time of the job's last 60 steps and a quarter
# more (the log's step time), within 2-10 min of its newest data: one block read bounded by
# time, not by the job's age (10 min of a 64-GPU job's blocks is the page's largest read).
RECENT_S = 600.0
MIN_RECENT_S = 120.0
RECENT_STEP_MARGIN = 1.25
# …and at most this many GPU-seconds of samples (10 min of 64 GPUs): a larger job's window is
# shortened in proportion, to no less than MIN_RECENT_S. The read and its decoding grow with
# GPUs × seconds; a 256-rank job's 10 minutes were 1,920 blocks, ~200 ms of CPU a page.
RECENT_GPU_S = 64 * RECENT_S
# Log lines read for the training curves (Megatron prints one every 10 steps: 5,000 steps; a
# trainer printing every step, the bench's charted job, 500 steps or 50 minutes)… The page
# parses them with the detectors' parser on every request: 2,000 lines were ~27 ms of the
# charted job page's CPU on the console bench, 500 are ~7. Longer history is the hourly charts'.
LOG_READ = 500
# …of which the newest 200 are shown, read with 50 more lines of context before them (a
# traceback's first line may come earlier).
LOG_SHOWN = 200
LOG_CONTEXT = 50
# One chart line has at most 600 points (a chart is ~600-1200 px wide)…
MAX_POINTS = 600
# …and a per-rank chart at most 6,000 in all (a 64-rank job: 93 points a line), so the page
# stays ~250 kB whatever the job's size.
RANK_CHART_POINTS = 6_000
# A larger job shows this many ranks' lanes, rows and chart lines (the ones furthest from the
# job's median compute share, and rank 0) unless `?ranks=all`: rendering 256 lanes and lines
# took ~250 ms of CPU a page; the charts draw the median of all ranks with them.
MAX_SHOWN_RANKS = 64
# Longer jobs also get their GPU signals over the last 48 h from the hourly rollups.
ROLLUP_S = 48 * 3600.0


@dataclass(frozen=True)
class GpuChartSignal:
    key: str
    name: str
    title: str
    unit: str
    scale: float = 1.0  # ratios are shown in %
    process: bool = False  # a process-scope signal (JobWindow.proc), else GPU scope


GPU_SIGNALS: tuple[GpuChartSignal, ...] = (
    GpuChartSignal(
        "tensor", signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, "Tensor pipes active", "%", 100.0
    ),
    GpuChartSignal("sm", signals.DCGM_FI_PROF_SM_ACTIVE, "SM activity", "%", 100.0),
    GpuChartSignal("power", signals.DCGM_FI_DEV_POWER_USAGE, "Power", " W"),
    GpuChartSignal("clock", signals.DCGM_FI_DEV_SM_CLOCK, "SM clock", " MHz"),
    GpuChartSignal("sync", signals.CUDA_SYNC_MS, "Synchronize time (waiting)", " ms", process=True),
)

# Sources of the job's own series, which the page's window reads (node series it does not).
_OWN_SOURCES = frozenset({SRC_DCGM_PROFILING, SRC_NVML, SRC_GPU_COUNTERS, SRC_EBPF})

_SOURCE_LABELS = {
    signals.CUDA_SYNC_MS: "eBPF synchronize time (waiting measured directly)",
    signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: "tensor-pipe activity (no eBPF: waiting inferred)",
    signals.DCGM_FI_PROF_SM_ACTIVE: "SM activity (no eBPF: waiting inferred)",
}


# --- the read-only store the engine's window builder reads through ------------------------------


class JobPageStore:
    """The `SignalStore` (engine/store.py) of one job page: the job's own series, processes and
    already-read log lines. Node series and events are not shown on this page and read as
    none (no query); another job's data (a rerun) is not read either."""

    def __init__(
        self,
        operator_id: int,
        job_id: str,
        span: tuple[float, float],
        logs: list[LogRow],
        gpus: dict[str, tuple[str, int | None]],
    ) -> None:
        self.operator_id = operator_id
        self.job_id = job_id
        self.span = span
        self.logs = logs
        self._gpus = gpus
        self._metas: dict[str, JobMeta] | None = None

    def jobs(self) -> dict[str, JobMeta]:
        if self._metas is None:
            metas = ingest_selectors.job_metas(self.operator_id, {self.job_id: self.span})
            self._metas = {k: v for k, v in metas.items() if k == self.job_id}
        return self._metas

    def processes(self, job: str) -> list[ProcessInfo]:
        if job != self.job_id:
            return []
        return ingest_selectors.job_processes(self.operator_id, job, self.span[0], gpus=self._gpus)

    def job_series(self, job: str, t0: float, t1: float) -> list[SeriesData]:
        if job != self.job_id:
            return []
        return ingest_selectors.job_series(self.operator_id, job, t0, t1)

    def node_series(
        self, node: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        return []

    def gpu_series(
        self, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        return []

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]:
        return []

    def job_logs(self, job: str, t0: float, t1: float) -> list[LogRow]:
        if job != self.job_id:
            return []
        return [r for r in self.logs if t0 <= r.ts <= t1]

    def gpus(self) -> list[tuple[str, str, int | None]]:
        return [(uuid, node, index) for uuid, (node, index) in sorted(self._gpus.items())]

    def time_range(self) -> tuple[float, float]:
        return self.span


# --- lanes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaneRow:
    rank: int
    node: str
    gpu: str
    compute: list[float]  # per step: share of the step computing (the rest: waiting)
    slowest: list[bool]  # per step: this rank was the slowest (the others waited for it)

    @cached_property
    def mean_compute(self) -> float:
        return float(np.mean(self.compute)) if self.compute else 0.0

    @cached_property
    def slowest_steps(self) -> int:
        return sum(self.slowest)

    def _bars(self, which: bool) -> str:
        parts = []
        for i, (c, s) in enumerate(zip(self.compute, self.slowest, strict=True)):
            if s is which:
                h = round(max(0.0, min(1.0, c)) * 100, 1)
                parts.append(f"M{i} 100v-{h}h0.86v{h}z")
        return "".join(parts)

    @cached_property
    def compute_path(self) -> str:
        """SVG path (viewBox 0 0 steps 100) of the compute bars of the steps it was not slowest."""
        return self._bars(False)

    @cached_property
    def slowest_path(self) -> str:
        """…and of the steps it was the slowest, drawn in the marking colour."""
        return self._bars(True)

    @cached_property
    def compute_csv(self) -> str:
        return ",".join(f"{c:.3f}" for c in self.compute)


@dataclass(frozen=True)
class Lanes:
    rows: list[LaneRow]
    step_start: list[float]  # each step's first sample time
    samples_per_step: int
    sample_s: float  # the window's sampling interval
    step_s: float | None  # the log's step time, where it gives one
    source: str  # the signal the shares come from
    shown: frozenset[int] | None = None  # the ranks drawn (None: all)

    @cached_property
    def shown_rows(self) -> list[LaneRow]:
        """The rows drawn; the slowest-per-step line and "slowest most often" are of all."""
        shown = self.shown
        return self.rows if shown is None else [r for r in self.rows if r.rank in shown]

    @cached_property
    def steps(self) -> int:
        return len(self.step_start)

    @cached_property
    def bar_s(self) -> float:
        """Seconds of data behind one bar: a step's samples, or one sample when the job steps
        faster than it is sampled (the detectors then compare ranks sample by sample too)."""
        return self.samples_per_step * self.sample_s

    @cached_property
    def source_label(self) -> str:
        return _SOURCE_LABELS.get(self.source, self.source)

    @cached_property
    def slowest_rank(self) -> list[int | None]:
        """Per step, the slowest rank (None when every rank read the same)."""
        out: list[int | None] = [None] * self.steps
        for row in self.rows:
            for i, s in enumerate(row.slowest):
                if s:
                    out[i] = row.rank
        return out

    @cached_property
    def most_often_slowest(self) -> LaneRow | None:
        best = max(self.rows, key=lambda r: r.slowest_steps, default=None)
        return best if best is not None and best.slowest_steps else None


def lanes_of(w: JobWindow, steps: int = LANE_STEPS) -> Lanes | None:
    """The last `steps` steps of each rank: the share of each step it computed, and which rank
    was the slowest — the straggler detectors' own per-step shares (`imbalance_stats`): the
    non-waiting share per sample (`busy_matrix`), the samples where the job was stepping
    (`active_mask`), averaged over one step's samples (`step_blocks`, `step_means`). The
    slowest rank of a step is the one that waited least (the others waited for it)."""
    if w.world < 1:
        return None
    got = busy_matrix(w)
    if got is None:
        return None
    busy, source = got
    mask = active_mask(busy)
    if not mask.any():
        return None
    blk = step_blocks(w)
    x, tb = step_means(np.nan_to_num(busy[:, mask], nan=0.0), w.times[mask], blk)
    if not x.shape[1]:
        return None
    x, tb = x[:, -steps:], tb[-steps:]
    spread = x.max(axis=0) - x.min(axis=0) > 1e-9  # ties say nothing about who is slowest
    top = np.argmax(x, axis=0)
    rows = []
    for row, rank in enumerate(w.ranks):
        rows.append(
            LaneRow(
                rank=rank.rank,
                node=rank.node,
                gpu=rank.gpu,
                compute=[float(v) for v in np.clip(x[row], 0.0, 1.0)],
                slowest=[bool(spread[i] and top[i] == row) for i in range(x.shape[1])],
            )
        )
    step_s = step_seconds(w)
    return Lanes(
        rows=rows,
        step_start=[float(t) for t in tb],
        samples_per_step=blk,
        sample_s=float(w.dt),
        step_s=step_s if math.isfinite(step_s) else None,
        source=source,
    )


# --- charts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    spec: dict[str, Any]
    note: str = ""

    @property
    def series_labels(self) -> list[str]:
        return [str(s["label"]) for s in self.spec["series"]]

    @property
    def json(self) -> SafeString:
        """The spec as charts.js reads it, escaped as Django's json_script escapes (safe inside
        <script>); NaN → null. orjson writes a 64-rank page's ~60,000 numbers in a few ms,
        where json.dumps and the json_script filter took ~0.3 s."""
        text = orjson.dumps(self.spec, option=orjson.OPT_SERIALIZE_NUMPY).decode()
        return mark_safe(text.translate(_JSON_SCRIPT_ESCAPES))  # noqa: S308 - escaped as json_script does


_JSON_SCRIPT_ESCAPES = {ord(">"): "\\u003E", ord("<"): "\\u003C", ord("&"): "\\u0026"}


def _rounded(values: np.ndarray) -> np.ndarray:
    """A line's values to 4 significant digits of its largest (the chart's resolution), as a
    contiguous float array (orjson writes NaN, unsampled, as null)."""
    v = np.ascontiguousarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if not finite.any():
        return v
    top = float(np.max(np.abs(v[finite])))
    digits = 3 - math.floor(math.log10(top)) if top > 0 else 0
    return np.round(v, max(0, digits)) if digits < 15 else v


def downsample(
    times: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """(lines, T) values on `times` as at most `max_points` bucket means per line (NaN where a
    bucket holds no sample), each bucket at its first time."""
    values = np.atleast_2d(values)
    n = len(times)
    k = max(1, math.ceil(n / max(1, max_points)))
    if k == 1:
        return times, values
    nb = math.ceil(n / k)
    padded = np.full((values.shape[0], nb * k), np.nan)
    padded[:, :n] = values
    blocks = padded.reshape(values.shape[0], nb, k)
    seen = np.isfinite(blocks)
    counts = seen.sum(axis=2)
    sums = np.where(seen, blocks, 0.0).sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return times[::k], means


def _spec(
    x: np.ndarray, lines: Sequence[tuple[str, np.ndarray, str]], y_label: str
) -> dict[str, Any]:
    spec = {
        "x": np.round(np.ascontiguousarray(x, dtype=np.float64), 3),
        "series": [
            {"label": label, "values": _rounded(values), "unit": unit}
            for label, values, unit in lines
        ],
        "interval": None,
        "baseline": None,
        "y_label": y_label,
    }
    finite = [np.abs(v[np.isfinite(v)]) for _, v, _ in lines]
    top = max((float(f.max()) for f in finite if len(f)), default=0.0)
    if 0 < top < 0.01:  # a learning rate: fixed decimals would read 0.00
        spec["y_format"] = "exp"
    return spec


def _step_time_s(st: StepTable) -> np.ndarray:
    """Seconds per step at each progress line: the printed iteration time, else the time since
    the previous logged step over the steps between them."""
    out = np.where(np.isfinite(st.iter_ms), st.iter_ms / 1000.0, np.nan)
    if len(st) >= 2:
        ds = np.diff(st.step)
        dt = np.diff(st.ts)
        with np.errstate(invalid="ignore", divide="ignore"):
            derived = np.where(ds > 0, dt / ds, np.nan)
        gaps = ~np.isfinite(out[1:])
        out[1:][gaps] = derived[gaps]
    return out


def training_charts(steps: StepTable) -> list[Chart]:
    """Loss, grad norm, learning rate and step time from the parsed progress lines."""
    charts = []
    with_loss = steps.with_loss()
    candidates = (
        ("job-loss", "Loss", with_loss.ts, with_loss.loss, "loss", ""),
        ("job-grad-norm", "Grad norm", steps.ts, steps.grad_norm, "grad norm", ""),
        ("job-lr", "Learning rate", steps.ts, steps.lr, "learning rate", ""),
        ("job-step-time", "Step time", steps.ts, _step_time_s(steps), "step time", " s"),
    )
    for chart_id, title, ts, values, label, unit in candidates:
        if not len(ts) or not np.isfinite(values).any():
            continue
        x, v = downsample(np.asarray(ts), np.asarray(values))
        charts.append(Chart(chart_id, title, _spec(x, [(label, v[0], unit)], title)))
    return charts


def _rank_points(world: int) -> int:
    return max(60, min(MAX_POINTS, RANK_CHART_POINTS // max(1, world)))


def shown_ranks(lanes: Lanes | None, ranks: Sequence[int]) -> frozenset[int] | None:
    """The MAX_SHOWN_RANKS ranks a large job's page draws (None: all of them): rank 0 and
    those whose compute share is furthest from the job's median (the slowest and the most
    waiting ones first), or the first ranks where no lanes say who deviates."""
    if len(ranks) <= MAX_SHOWN_RANKS:
        return None
    keep = [r for r in ranks if r == 0][:1]
    if lanes is not None and lanes.rows:
        median = float(np.median([row.mean_compute for row in lanes.rows]))
        by_deviation = sorted(
            lanes.rows, key=lambda row: (-abs(row.mean_compute - median), row.rank)
        )
        order = [row.rank for row in by_deviation]
    else:
        order = sorted(ranks)
    for rank in order:
        if len(keep) >= MAX_SHOWN_RANKS:
            break
        if rank not in keep:
            keep.append(rank)
    return frozenset(keep)


def _capped_lines(
    labels: Sequence[tuple[int, str]],
    values: np.ndarray,
    unit: str,
    shown: frozenset[int] | None,
) -> list[tuple[str, np.ndarray, str]]:
    """One line per shown rank, and the median of all ranks where some are not shown."""
    lines = [
        (label, values[row], unit)
        for row, (rank, label) in enumerate(labels)
        if shown is None or rank in shown
    ]
    if shown is not None and len(labels):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a column no rank sampled
            median = np.nanmedian(values, axis=0)
        lines.append((f"median of {len(labels)} ranks", median, unit))
    return lines


def gpu_charts(w: JobWindow, shown: frozenset[int] | None = None) -> list[Chart]:
    """The key GPU signals of each rank over the recent window, one line per shown rank."""
    charts = []
    labels = [(r.rank, f"rank {r.rank}") for r in w.ranks]
    points = _rank_points(w.world if shown is None else len(shown) + 1)
    for sig in GPU_SIGNALS:
        arr = (w.proc if sig.process else w.gpu).get(sig.name)
        if arr is None or not np.isfinite(arr).any():
            continue
        x, v = downsample(w.times, arr * sig.scale, points)
        lines = _capped_lines(labels, v, sig.unit, shown)
        charts.append(Chart(f"job-gpu-{sig.key}", sig.title, _spec(x, lines, sig.title)))
    return charts


def rollup_charts(
    operator_id: int,
    job: Job,
    ranks: dict[str, int],
    t0: float,
    t1: float,
    shown: frozenset[int] | None = None,
) -> list[Chart]:
    """The GPU signals of each rank over [t0, t1] from the hourly rollups (mean per hour), in
    one query: series of the job, or of its GPUs without a job key, with the charted names."""
    names = {s.name: s for s in GPU_SIGNALS}
    lo = int(t0 * 1000) - int(t0 * 1000) % 3_600_000
    rows = (
        SeriesRollup.objects.for_tenant(operator_id)
        .filter(series__job=job, series__name__in=list(names))
        .filter(bucket_start_ms__gte=lo, bucket_start_ms__lte=int(t1 * 1000))
        .values_list(
            "series__name", "series__gpu", "series__rank", "bucket_start_ms", "count", "sum"
        )
    )
    acc: dict[str, dict[int, dict[int, tuple[float, int]]]] = {}
    buckets: set[int] = set()
    for name, gpu, rank, bucket, count, total in rows:
        r = rank if rank is not None else ranks.get(gpu)
        if r is None or not count:
            continue
        per = acc.setdefault(name, {}).setdefault(int(r), {})
        s, c = per.get(int(bucket), (0.0, 0))
        per[int(bucket)] = (s + float(total), c + int(count))
        buckets.add(int(bucket))
    if len(buckets) < 2:
        return []
    xs = sorted(buckets)
    col = {b: i for i, b in enumerate(xs)}
    charts = []
    for sig in GPU_SIGNALS:
        per_rank = acc.get(sig.name)
        if not per_rank:
            continue
        lines = []
        for rank in sorted(per_rank):
            values = np.full(len(xs), np.nan)
            for bucket, (s, c) in per_rank[rank].items():
                values[col[bucket]] = s / c * sig.scale
            lines.append((rank, values))
        x = np.array(xs, dtype=np.float64) / 1000.0
        drawn = len(lines) if shown is None else min(len(lines), len(shown) + 1)
        x_ds, v = downsample(x, np.array([line[1] for line in lines]), _rank_points(drawn))
        labels = [(rank, f"rank {rank}") for rank, _ in lines]
        spec = _spec(x_ds, _capped_lines(labels, v, sig.unit, shown), sig.title)
        charts.append(
            Chart(f"job-hourly-{sig.key}", f"{sig.title} (hourly means)", spec, "hourly rollups")
        )
    return charts


# --- the log -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShownLine:
    ts: float
    node: str
    rank: int | None
    stream: str
    line: str
    kind: str | None = None  # what the parser recognised (progress, checkpoint_begin, …)
    read: list[tuple[str, str]] = field(default_factory=list)  # the fields it read

    @property
    def parsed(self) -> bool:
        return self.kind is not None

    @property
    def time_text(self) -> str:
        """HH:MM:SS.mmm UTC, the line's data time (the page's header gives the date)."""
        return datetime.fromtimestamp(self.ts, UTC).strftime("%H:%M:%S.%f")[:-3]

    @property
    def read_text(self) -> str:
        """What the parser read, as one string: the page has 200 of these, and one template
        variable per line renders several times faster than a loop over the fields."""
        return " · ".join(f"{name} {value}" for name, value in self.read)

    @property
    def html(self) -> SafeString:
        """The log table's row, escaped: one template variable a row instead of six (200 rows
        a page; their rendering was a tenth of the charted job page's CPU)."""
        parsed = self.kind is not None
        kind = escape(self.kind or "")
        rank = "" if self.rank is None else str(self.rank)
        stderr = " stderr" if self.stream == "stderr" else ""
        read = f"<strong>{kind}</strong> · {escape(self.read_text)}" if parsed else ""
        return mark_safe(  # noqa: S308 - every value escaped here
            (f'<tr class="parsed" data-kind="{kind}">' if parsed else "<tr>")
            + f'<td class="ts">{self.time_text}</td><td class="num">{rank}</td>'
            + f'<td class="line{stderr}"><code>{escape(self.line)}</code></td>'
            + f'<td class="read">{read}</td></tr>'
        )


# The ParsedLine fields shown (all but which kind and framework: the kind is shown apart).
_SHOWN_FIELDS = tuple(
    f.name for f in dc_fields(tp.ParsedLine) if f.name not in {"kind", "framework"}
)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    return str(value)


def shown_log(
    rows: list[LogRow], shown: int = LOG_SHOWN, context: int = LOG_CONTEXT
) -> list[ShownLine]:
    """The newest `shown` lines, each with what `LogParser` (the detectors' parser) read of it,
    fed per stream (node, pid) as the window's log reading does."""
    parsers: dict[tuple[str, int | None], tp.LogParser] = {}
    start = max(0, len(rows) - shown)
    out = []
    for k, row in enumerate(rows[max(0, start - context) :], start=max(0, start - context)):
        p = parsers.setdefault((row.node, row.pid), tp.LogParser()).feed(row.line)
        if k < start:
            continue
        if p is None:
            out.append(ShownLine(row.ts, row.node, row.rank, row.stream, row.line))
            continue
        values = ((name, getattr(p, name)) for name in _SHOWN_FIELDS)
        read = [(name.replace("_", " "), _fmt(v)) for name, v in values if v is not None]
        out.append(ShownLine(row.ts, row.node, row.rank, row.stream, row.line, p.kind, read))
    return out


def last_log_rows(operator_id: int, job: Job, limit: int = LOG_READ) -> list[LogRow]:
    """The job's newest `limit` log lines, oldest first (one query on the (job, ts) index)."""
    rows = (
        LogLine.objects.for_tenant(operator_id)
        .filter(job=job)
        .order_by("-ts_us", "-id")
        .values_list("ts_us", "node__hostname", "pid", "rank", "step", "stream", "line")[:limit]
    )
    out = [
        LogRow(ts / 1e6, node or "", pid, rank, stream, line, step)
        for ts, node, pid, rank, step, stream, line in rows
    ]
    out.reverse()
    return out


# --- the page ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankView:
    rank: int
    node: str
    gpu: str
    gpu_index: int | None
    gpu_model: str


@dataclass(frozen=True)
class JobPage:
    job: Job
    span: tuple[float, float] | None  # first and last data time
    window: tuple[float, float] | None  # what the lanes and GPU charts cover
    ranks: list[RankView]
    lanes: Lanes | None
    training: list[Chart]
    gpu: list[Chart]
    hourly: list[Chart]
    log: list[ShownLine]
    log_total_read: int
    incidents: Sequence[Incident]
    price: RealPrice
    could_not_see: list[str]
    ranks_hidden: int = 0  # ranks not drawn (a large job without ?ranks=all)
    shown: frozenset[int] | None = None  # the ranks drawn (None: all)

    @property
    def shown_ranks(self) -> list[RankView]:
        return self.ranks if self.shown is None else [r for r in self.ranks if r.rank in self.shown]

    @property
    def charts(self) -> list[Chart]:
        return [*self.training, *self.gpu, *self.hourly]

    @property
    def duration_s(self) -> float | None:
        return None if self.span is None else self.span[1] - self.span[0]


def recent_seconds(steps: StepTable, gpus: int = 1) -> float:
    """How much of the newest data the lanes and GPU charts read: the log's last LANE_STEPS
    steps and a margin, within MIN_RECENT_S-RECENT_S (RECENT_S when the log gives no step
    time), and for a job of more than 64 GPUs at most RECENT_GPU_S ÷ its GPUs (so a 256-GPU
    job's lanes show the steps of its last 150 s)."""
    longest = max(MIN_RECENT_S, min(RECENT_S, RECENT_GPU_S / max(1, gpus)))
    step_s = table_step_seconds(steps)
    if not math.isfinite(step_s):
        return longest
    return min(longest, max(MIN_RECENT_S, LANE_STEPS * step_s * RECENT_STEP_MARGIN))


def _job_gpus(operator_id: int, job: Job) -> dict[str, tuple[str, int | None, str]]:
    """The job's GPUs as registered (uuid → node, index, model), in one query. Read by
    operator: the caller has already checked the principal may see the job. The GPUs are
    its processes' (`JobRank.gpu` can be blank: a rank's input-worker processes, which hold
    no GPU, are recorded on the same rank)."""
    held = Process.objects.for_tenant(operator_id).filter(job=job).exclude(gpu="").values("gpu")
    rows = (
        Gpu.objects.for_tenant(operator_id)
        .filter(uuid__in=held)
        .values_list("uuid", "node__hostname", "index", "model")
    )
    return {uuid: (node or "", index, model or "") for uuid, node, index, model in rows}


def job_page(principal: Principal, job_id: str, all_ranks: bool = False) -> JobPage:
    """Everything the job page shows; Http404 for a job the principal may not see. Of a job of
    more than MAX_SHOWN_RANKS ranks, `shown_ranks`' unless `all_ranks`."""
    job = ingest_selectors.job_for(principal, job_id)
    op = principal.operator_id
    span = (
        JobActivity.objects.for_tenant(op)
        .filter(job=job)
        .values_list("first_data_ts", "last_data_ts")
        .first()
    )
    gpus = _job_gpus(op, job)
    logs = last_log_rows(op, job)
    steps, checkpoints, _events = parse_logs(logs)
    window: JobWindow | None = None
    if span is not None:
        t1 = span[1]
        t0 = max(span[0], t1 - recent_seconds(steps, max(len(gpus), job.world_size or 0)))
        store = JobPageStore(
            op, job.job_id, span, logs, {u: (n, i) for u, (n, i, _m) in gpus.items()}
        )
        window = build_job_window(store, job.job_id, t0, t1)
    # The verdicts table shows the light columns; the verdict JSON (~7 KB each: 57 of them
    # on the bench's 256-rank job) is left in the database.
    incidents = list(
        Incident.objects.for_tenant(principal)
        .filter(job=job)
        .defer("verdict")
        .annotate(
            open_first=Case(
                When(state=IncidentState.OPEN, then=Value(0)),
                default=Value(1),
                output_field=IntegerField(),
            )
        )
        .order_by("open_first", "-last_seen", "-id")
    )
    ranks = []
    hourly: list[Chart] = []
    lanes = lanes_of(window) if window is not None else None
    shown: frozenset[int] | None = None
    if window is not None:
        ranks = [
            RankView(r.rank, r.node, r.gpu, r.gpu_index, gpus.get(r.gpu, ("", None, ""))[2])
            for r in window.ranks
        ]
        if not all_ranks:
            shown = shown_ranks(lanes, [r.rank for r in ranks])
        if lanes is not None and shown is not None:
            lanes = replace(lanes, shown=shown)
        if span is not None and span[1] - span[0] > RECENT_S:
            rank_of_gpu = {r.gpu: r.rank for r in window.ranks}
            start = max(span[0], span[1] - ROLLUP_S)
            hourly = rollup_charts(op, job, rank_of_gpu, start, span[1], shown)
    # The page's window reads the job's own series only (no node series, no events), so of
    # what it could not see only the job's own sources are said.
    missing = sorted(window.missing_sources & _OWN_SOURCES) if window is not None else []
    if not len(steps) and not checkpoints:
        missing.append(SRC_TRAINING_LOG)
    return JobPage(
        job=job,
        span=span,
        window=(window.t0, window.t1) if window is not None else None,
        ranks=ranks,
        lanes=lanes,
        training=training_charts(steps),
        gpu=gpu_charts(window, shown) if window is not None else [],
        hourly=hourly,
        log=shown_log(logs),
        log_total_read=len(logs),
        incidents=incidents,
        price=real_price_for(principal, job_pk=job.pk),
        could_not_see=[SOURCE_DESCRIPTIONS.get(m, m) for m in missing],
        ranks_hidden=0 if shown is None else len(ranks) - len(shown),
        shown=shown,
    )
