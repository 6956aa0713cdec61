"""The small chart of every evidence row of a verdict (the console's verdict page, the API's
evidence series): the row's signal around its interval, with the baseline drawn, read from
ingest's storage for all rows together.

What a row charts depends on its `signal` (docs/design.md §7 evidence; the detectors' names):

- a stored series name (`DCGM_FI_PROF_SM_ACTIVE`), or one followed by words saying what was
  derived from it (`cuda.sync_ms lead over the median rank`): that series for the row's GPU,
  rank or node — or, with none of them, for the row's job (its GPUs, ranks and nodes). A
  job-wide counter is drawn as the sum over the job's GPUs or ports (what the clearance
  evidence states: the increase of the sum, the baseline the pre-existing sum); a row of one
  GPU or rank also draws the median of the job's other GPUs/ranks;
- `event: NAME` / `events`: the cumulative count of those events over the window;
- `log: loss`, `log: grad norm`, …: the value parsed from the job's log lines, or for log
  events (`log: checkpoint save`, `log: error`) their cumulative count;
- anything else (`impact: slowdown`, `slowest rank identity`): the row's own observed value
  over its interval.

The baseline drawn is the row's own `baseline` when it has a number in the series' units
(judged by its range); else, for a row of one GPU/rank, the median of the others over the
interval, else the series' median before the interval. Every spec says which it drew.

Reads, for a page of any number of rows: one series catalog query and one block read (the
union of the rows' windows over the nodes holding their series), one events query, one log
query — never one per row. Each line is downsampled to ≤ MAX_POINTS buckets (the evidence's
own lines keep each bucket's min or max, so a spike stays visible).

Customer users see the evidence of their own job: the series read are only the cited signals
of the job's own GPUs and nodes (series of another job excluded), and the chart windows are
clipped to the job's data span, so nothing of another customer's job on the same hardware is
drawn.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db.models import Q

from contract import signals
from contract.parsers import training as tp
from contract.rows import SeriesInfo, labels_key
from ingest import selectors as ingest_selectors
from ingest.models import Event, JobRank, LogLine, Process, Series
from investigations.models import Incident, JobActivity
from tenants.access import Principal

# A row's chart spans its interval ± twice its length, at least ±60 s (an instant's event
# still shows what came before and after), at most ±5 min: a clearance row covers the whole
# evaluation window (up to 30 min), and the page's one block read spans every row's window,
# so the read stays the evaluation window and 10 min (a 1-node job: ~240 blocks, ~50 ms of
# decoding), never the job's age.
MIN_PAD_S = 60.0
MAX_PAD_S = 300.0
# A sparkline is 260 px wide: more points than this draw nothing more.
MAX_POINTS = 150
# More lines than this in one sparkline are unreadable: the job's lines are averaged instead.
MAX_LINES = 8
# Clock-throttle bits that mean the hardware slowed the GPU (docs/design.md §4): HW slowdown,
# HW thermal, HW power brake. A throttle-reasons row charts "GPUs throttled by the hardware".
HW_THROTTLE_BITS = 0x8 | 0x40 | 0x80
LOG_ROWS_LIMIT = 20_000
EVENT_ROWS_LIMIT = 5_000
# `log: …` rows: the parsed value they chart, or the parsed line kinds they count.
LOG_VALUES = {
    "loss": "loss",
    "loss (rerun)": "loss",
    "grad norm": "grad_norm",
    "learning rate": "lr",
    "lr": "lr",
    "last step before the hang": "step",
    "step": "step",
}
LOG_COUNTS = {
    "checkpoint save": {tp.CHECKPOINT_BEGIN, tp.CHECKPOINT_END},
    "error": {tp.TRACEBACK_END, tp.NCCL_ERROR, tp.NCCL_TIMEOUT, tp.CUDA_OOM, tp.FATAL},
    "collective timeout": {tp.NCCL_TIMEOUT},
    "nccl watchdog": {tp.NCCL_TIMEOUT, tp.NCCL_ERROR},
}


@dataclass
class EvidenceRow:
    """One evidence entry as the page shows it, with its chart spec (charts.js format)."""

    evidence: dict[str, Any]
    chart_id: str
    chart: dict[str, Any]
    source: str  # "series", "events", "log", "value": what the chart draws
    baseline_source: str  # "verdict", "others", "before", "count before", "" (none)
    lines: int = 0
    place: list[dict[str, str]] = field(default_factory=list)  # node · GPU · rank, linked

    @property
    def interval(self) -> tuple[float, float]:
        return _interval(self.evidence)

    @property
    def duration(self) -> float:
        start, end = self.interval
        return end - start


@dataclass
class _Plan:
    row: dict[str, Any]
    index: int
    kind: str  # "series", "event", "log", "value"
    base: str  # series name, event name ("" = any), log key
    window: tuple[float, float]
    interval: tuple[float, float]
    derived: bool = False  # the signal names more than the series (`… lead over …`)
    job_pk: int | None = None
    job_id: str | None = None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _interval(row: Mapping[str, Any]) -> tuple[float, float]:
    iv = row.get("interval")
    start = _num(iv.get("start")) if isinstance(iv, dict) else None
    end = _num(iv.get("end")) if isinstance(iv, dict) else None
    if start is None:
        start = end
    if start is None:
        return (0.0, 0.0)
    if end is None:
        end = start
    return (min(start, end), max(start, end))


def chart_window(interval: tuple[float, float]) -> tuple[float, float]:
    start, end = interval
    pad = min(MAX_PAD_S, max(MIN_PAD_S, 2.0 * (end - start)))
    return (start - pad, end + pad)


def _series_name(signal: str) -> tuple[str, bool] | None:
    """The stored series a row's signal names (and whether it names something derived from
    it), or None when it names none."""
    if not signal or signal.startswith(("event:", "log:", "impact:")) or signal == "events":
        return None
    if signals.spec_for(signal) is not None or " " not in signal:
        return signal, False
    head = signal.split(" ", 1)[0]
    if signals.spec_for(head) is not None:
        return head, True
    return None


def _plan(
    row: dict[str, Any], index: int, incident: Incident, job_span: tuple[float, float] | None
) -> _Plan:
    signal = str(row.get("signal") or "")
    interval = _interval(row)
    window = chart_window(interval)
    if job_span is not None:
        # Clipped to the job's data, but always covering the row's own interval.
        window = (
            max(window[0], min(job_span[0], interval[0])),
            min(window[1], max(job_span[1], interval[1])),
        )
    row_job = row.get("job")
    incident_job = incident.job.job_id if incident.job is not None else None
    job_pk = incident.job_id if row_job in (None, incident_job) else None
    job_id = str(row_job) if row_job else incident_job
    plan = _Plan(row, index, "value", "", window, interval, job_pk=job_pk, job_id=job_id)
    named = _series_name(signal)
    if named is not None:
        plan.kind, (plan.base, plan.derived) = "series", named
    elif signal == "events":
        plan.kind = "event"
    elif signal.startswith("event:"):
        plan.kind, plan.base = "event", signal.removeprefix("event:").strip()
    elif signal.startswith("log:"):
        key = signal.removeprefix("log:").strip().lower()
        if key in LOG_VALUES or key in LOG_COUNTS:
            plan.kind, plan.base = "log", key
    return plan


class _JobScope:
    """The incident job's GPUs and nodes: its ranks' and its processes' (a rank's record may
    lack its GPU while its input workers' processes are recorded on it), in one query."""

    def __init__(self, operator_id: int, job_pk: int | None) -> None:
        self.job_pk = job_pk
        self.gpus: set[str] = set()
        self.nodes: set[int] = set()
        if job_pk is None:
            return
        ranks = JobRank.objects.for_tenant(operator_id).filter(job_id=job_pk)
        processes = Process.objects.for_tenant(operator_id).filter(job_id=job_pk)
        for gpu, node_id in ranks.values_list("gpu", "node_id").union(
            processes.values_list("gpu", "node_id")
        ):
            if gpu:
                self.gpus.add(str(gpu))
            if node_id is not None:
                self.nodes.add(int(node_id))

    def series(self) -> Q:
        """Every series of the job: its own, and its GPUs' and nodes' without a job key."""
        if self.job_pk is None:
            return Q(pk__in=[])
        return (
            Q(job_id=self.job_pk)
            | Q(job__isnull=True, gpu__in=sorted(self.gpus))
            | Q(job__isnull=True, gpu="", pid__isnull=True, node_id__in=sorted(self.nodes))
        )

    def holds(self, job_pk: int | None, gpu: str, pid: int | None, node_id: int | None) -> bool:
        """Whether a series (by its keys) is one of `series()`'s."""
        if self.job_pk is None:
            return False
        if job_pk is not None:
            return job_pk == self.job_pk
        if gpu:
            return gpu in self.gpus
        return pid is None and node_id in self.nodes


def _selectors(plan: _Plan) -> list[tuple[str, str]]:
    """Which of the page's series reads a row needs, as (scope, key) pairs: ("job", "") the
    incident job's series, ("gpu", uuid), ("node", hostname), ("job_id", another job's id)."""
    row = plan.row
    gpu, rank, node = row.get("gpu"), row.get("rank"), row.get("node")
    in_job = [("job", "")] if plan.job_pk is not None else []
    other_job = [("job_id", str(plan.job_id))] if plan.job_pk is None and plan.job_id else []
    if gpu:
        # The GPU's whole signal (keyed by the job while it ran, unkeyed between jobs), and the
        # job's other GPUs for the peers' median.
        return [("gpu", str(gpu)), *in_job]
    if rank is not None and plan.job_id:
        return in_job or other_job
    if node:
        return [("node", str(node))]
    return in_job or other_job


def _series_filter(plans: list[_Plan], scope: _JobScope) -> Q:
    """One filter for every series row's reads: the names wanted per scope, OR-ed."""
    names: dict[tuple[str, str], set[str]] = {}
    for plan in plans:
        for selector in _selectors(plan):
            names.setdefault(selector, set()).add(plan.base)
    query = Q(pk__in=[])
    for (kind, key), wanted in sorted(names.items()):
        by_name = Q(name__in=sorted(wanted))
        if kind == "job":
            query |= by_name & scope.series()
        elif kind == "gpu":
            query |= by_name & Q(gpu=key)
        elif kind == "node":
            query |= by_name & Q(node__hostname=key)
        else:
            query |= by_name & Q(job__job_id=key)
    return query


def _line_key(info: SeriesInfo) -> tuple[Any, ...]:
    if info.gpu:
        return ("gpu", info.gpu)
    if info.rank is not None:
        return ("rank", info.job, info.rank)
    if info.pid is not None:
        return ("pid", info.node, info.pid)
    return ("node", info.node, info.labels)


def _line_label(info: SeriesInfo) -> str:
    if info.gpu:
        where = f"GPU {info.gpu_index}" if info.gpu_index is not None else info.gpu[:12]
        return f"{where} · {info.node}" if info.node else where
    if info.rank is not None:
        return f"rank {info.rank}"
    labels = "/".join(v for _, v in info.labels)
    return " ".join(p for p in (info.node, labels) if p) or info.name


def _is_own(plan: _Plan, info: SeriesInfo) -> bool:
    row = plan.row
    if row.get("gpu"):
        return bool(info.gpu == row["gpu"])
    if row.get("rank") is not None:
        return info.rank == row["rank"] and (not plan.job_id or info.job == plan.job_id)
    if row.get("node"):
        return bool(info.node == row["node"])
    return True


@dataclass
class _Line:
    label: str
    ts: np.ndarray
    values: np.ndarray
    own: bool


def _transform(name: str, note: str, ts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """What a line draws of a series: counters as read (the level the clearance evidence's
    increase and baseline are stated in) unless the row states a rate; throttle reasons as 1
    while a hardware reason is set."""
    spec = signals.spec_for(name)
    if spec is not None and spec.kind is signals.Kind.BITMASK:
        flags: np.ndarray = ((values.astype(np.int64) & HW_THROTTLE_BITS) != 0).astype(np.float64)
        return flags
    if spec is not None and spec.kind is signals.Kind.COUNTER and "/s" in note:
        scale = 1e-9 if "GB/s" in note else 1e-6 if "MB/s" in note else 1.0
        if len(ts) < 2:
            return np.full(len(ts), np.nan)
        rate = np.diff(values) / np.maximum(np.diff(ts), 1e-3) * scale
        rate[rate < 0] = np.nan  # a counter reset
        return np.concatenate(([np.nan], rate))
    return values


def _grid(window: tuple[float, float], spacings: Iterable[float]) -> tuple[np.ndarray, float]:
    """Bucket starts over the window: MAX_POINTS buckets, or fewer where the data is sparser
    (a bucket narrower than the sampling interval would break the line into dots)."""
    w0, w1 = window
    span = max(w1 - w0, 1.0)
    width = span / MAX_POINTS
    known = [s for s in spacings if s > 0 and math.isfinite(s)]
    if known:
        width = max(width, float(np.median(known)))
    n = max(2, min(MAX_POINTS, math.ceil(span / width)))
    return w0 + np.arange(n) * (span / n), span / n


def _bucket(
    ts: np.ndarray, values: np.ndarray, w0: float, width: float, n: int, how: str
) -> np.ndarray:
    out = np.full(n, np.nan)
    keep = np.isfinite(values) & (ts >= w0) & (ts < w0 + width * n)
    if not keep.any():
        return out
    idx = ((ts[keep] - w0) // width).astype(np.int64).clip(0, n - 1)
    v = values[keep]
    if how == "last":
        out[idx] = v  # ts ascending: the last assignment per bucket wins
        return out
    sums = np.bincount(idx, weights=v, minlength=n)
    counts = np.bincount(idx, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums / counts
    if how == "extreme":
        # Each bucket's sample farthest from the bucket's mean (its min or its max): a mean
        # would flatten a one-sample spike — often the evidence itself — into the line.
        order = np.lexsort((np.abs(v - mean[idx]), idx))
        out[idx[order]] = v[order]  # sorted by deviation within a bucket: the largest wins
        return out
    out[counts > 0] = mean[counts > 0]
    return out


def _ffill(values: np.ndarray) -> np.ndarray:
    """A counter's buckets carried forward over the buckets between two readings (a counter
    holds its value between them), never before its first reading or past its last."""
    seen = np.flatnonzero(np.isfinite(values))
    if not len(seen):
        return values
    idx = np.where(np.isfinite(values), np.arange(len(values)), 0)
    np.maximum.accumulate(idx, out=idx)
    filled: np.ndarray = values[idx]
    filled[: seen[0]] = np.nan
    filled[seen[-1] + 1 :] = np.nan
    return filled


def _jsonable(values: np.ndarray) -> list[float | None]:
    """Values as JSON can hold them: rounded, with None for a gap (NaN is not JSON)."""
    rounded = np.round(np.where(np.isfinite(values), values, np.nan), 6).tolist()
    return [None if v != v else v for v in rounded]


def _spacing(ts: np.ndarray) -> float:
    """A line's typical sampling interval (its mean: the lines are sorted in time)."""
    return float(ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 2 else 0.0


def _baseline_from(
    plan: _Plan,
    own: list[np.ndarray],
    peers: list[np.ndarray],
    x: np.ndarray,
    width: float,
) -> tuple[float | None, str]:
    """The baseline to draw (see the module doc) and where it came from."""
    given = _num(plan.row.get("baseline"))
    finite = [v[np.isfinite(v)] for v in own]
    drawn = np.concatenate(finite) if finite else np.zeros(0)
    if given is not None and not plan.derived:
        if not len(drawn):
            return given, "verdict"
        lo, hi = float(drawn.min()), float(drawn.max())
        span = max(hi - lo, abs(hi), abs(lo), 1e-9)
        if lo - 3 * span <= given <= hi + 3 * span:
            return given, "verdict"
    start, end = plan.interval
    inside = (x + width >= start) & (x <= end)
    if peers:
        pooled = np.concatenate([p[inside] for p in peers])
        pooled = pooled[np.isfinite(pooled)]
        if not len(pooled):
            pooled = np.concatenate(peers)
            pooled = pooled[np.isfinite(pooled)]
        if len(pooled):
            return round(float(np.median(pooled)), 6), "others"
    before = np.concatenate([v[x + width <= start] for v in own]) if own else np.zeros(0)
    before = before[np.isfinite(before)]
    if len(before):
        return round(float(np.median(before)), 6), "before"
    if given is not None:
        return given, "verdict"
    return None, ""


def _spec(
    plan: _Plan,
    x: np.ndarray,
    width: float,
    series: list[tuple[str, np.ndarray]],
    unit: str,
    baseline: float | None,
) -> dict[str, Any]:
    centres = [round(float(t + width / 2), 3) for t in x]
    # The first and last points sit on the window's edges, so the x range is the window.
    centres[0], centres[-1] = round(plan.window[0], 3), round(plan.window[1], 3)
    return {
        "x": centres,
        "series": [{"label": label, "values": _jsonable(v), "unit": unit} for label, v in series],
        "interval": [plan.interval[0], plan.interval[1]],
        "baseline": baseline,
        "y_label": str(plan.row.get("signal") or ""),
        "window": [round(plan.window[0], 3), round(plan.window[1], 3)],
    }


def _series_chart(plan: _Plan, lines: list[_Line]) -> EvidenceRow:
    note = str(plan.row.get("note") or "")
    spec_of = signals.spec_for(plan.base)
    counter = spec_of is not None and spec_of.kind is signals.Kind.COUNTER and "/s" not in note
    flags = spec_of is not None and spec_of.kind is signals.Kind.BITMASK
    how = "last" if counter else "mean"
    x, width = _grid(plan.window, (_spacing(line.ts) for line in lines))
    own = [line for line in lines if line.own]
    peers = [line for line in lines if not line.own]

    def buckets(group: list[_Line], how: str) -> list[np.ndarray]:
        out = [_bucket(line.ts, line.values, plan.window[0], width, len(x), how) for line in group]
        return [_ffill(b) for b in out] if counter else out

    # The evidence's own lines keep their spikes (min/max-preserving); the others' median and
    # the lines averaged over many GPUs are of bucket means.
    spiky = "extreme" if how == "mean" and not flags and len(own) <= MAX_LINES else how
    own_b, peer_b = buckets(own, spiky), buckets(peers, how)
    job_wide = not (plan.row.get("gpu") or plan.row.get("rank") is not None or plan.row.get("node"))
    drawn: list[tuple[str, np.ndarray]]
    if job_wide and (counter or flags) and len(own_b) > 1:
        # What the job-wide evidence states: the counters' sum (its increase and pre-existing
        # baseline are of the sum), or how many GPUs the hardware throttled.
        stacked = np.vstack(own_b)
        total = np.nansum(stacked, axis=0)
        total[~np.isfinite(stacked).any(axis=0)] = np.nan
        label = f"GPUs throttled (of {len(own_b)})" if flags else f"sum of {len(own_b)}"
        drawn = [(label, total)]
    elif len(own_b) > MAX_LINES:
        stacked = np.vstack(own_b)
        with np.errstate(invalid="ignore"), _quiet():
            drawn = [(f"mean of {len(own_b)}", np.nanmean(stacked, axis=0))]
    else:
        drawn = [(line.label, b) for line, b in zip(own, own_b, strict=True)]
    if not drawn:  # nothing stored for it in the window: the axes, interval and baseline only
        drawn = [("no samples", np.full(len(x), np.nan))]
    if peer_b:
        with _quiet():
            drawn.append(
                (f"others' median ({len(peer_b)})", np.nanmedian(np.vstack(peer_b), axis=0))
            )
    baseline, source = _baseline_from(
        plan, [v for _, v in drawn[:1]] if drawn else [], peer_b, x, width
    )
    unit = "" if spec_of is None or flags else spec_of.unit
    return EvidenceRow(
        plan.row,
        _chart_id(plan),
        _spec(plan, x, width, drawn, unit, baseline),
        "series",
        source,
        len(own),
    )


@contextmanager
def _quiet() -> Iterator[None]:
    """np.nanmean/nanmedian warn on an all-NaN column (a bucket nobody sampled): expected."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _count_chart(plan: _Plan, times: list[float], source: str) -> EvidenceRow:
    """The cumulative count of occurrences (events, log lines) over the window."""
    x, width = _grid(plan.window, ())
    ts = np.sort(np.asarray(times, dtype=np.float64))
    ends = x + width
    counts = np.searchsorted(ts, ends, side="right").astype(np.float64)
    given = _num(plan.row.get("baseline"))
    before = float(np.searchsorted(ts, plan.interval[0], side="left"))
    baseline, bsource = (given, "verdict") if given is not None else (before, "count before")
    spec = _spec(plan, x, width, [("count", counts)], "", baseline)
    return EvidenceRow(plan.row, _chart_id(plan), spec, source, bsource, 1)


def _log_value_chart(plan: _Plan, points: list[tuple[float, float]]) -> EvidenceRow:
    ts = np.asarray([p[0] for p in points], dtype=np.float64)
    values = np.asarray([p[1] for p in points], dtype=np.float64)
    x, width = _grid(plan.window, (_spacing(ts),))
    b = _bucket(ts, values, plan.window[0], width, len(x), "extreme")
    line = _Line("log", ts, values, True)
    baseline, source = _baseline_from(plan, [b], [], x, width)
    spec = _spec(plan, x, width, [(plan.base, b)], "", baseline)
    return EvidenceRow(plan.row, _chart_id(plan), spec, "log", source, 1 if len(line.ts) else 0)


def _value_chart(plan: _Plan) -> EvidenceRow:
    """A row that names no stored signal: its own observed value over its interval."""
    w0, w1 = plan.window
    s, e = plan.interval
    observed = _num(plan.row.get("observed"))
    x = [w0, s, e, w1] if e > s else [w0, s, w1]
    values: list[float | None] = (
        [None, observed, observed, None] if e > s else [None, observed, None]
    )
    baseline = _num(plan.row.get("baseline"))
    spec = {
        "x": [round(v, 3) for v in x],
        "series": [{"label": "observed", "values": values, "unit": ""}],
        "interval": [s, e],
        "baseline": baseline,
        "y_label": str(plan.row.get("signal") or ""),
        "window": [round(w0, 3), round(w1, 3)],
    }
    return EvidenceRow(
        plan.row, _chart_id(plan), spec, "value", "verdict" if baseline is not None else ""
    )


def _chart_id(plan: _Plan) -> str:
    safe = "".join(c for c in str(plan.row.get("id") or "") if c.isalnum())
    return f"evidence-chart-{plan.index}-{safe}"


def _job_span(principal: Principal, incident: Incident) -> tuple[float, float] | None:
    """A customer user's charts are clipped to the job's data (module doc); operators' are not."""
    if principal.is_operator or incident.job_id is None:
        return None
    span = (
        JobActivity.objects.for_tenant(principal)
        .filter(job_id=incident.job_id)
        .values_list("first_data_ts", "last_data_ts")
        .first()
    )
    # No data span recorded: each chart is clipped to its row's own interval.
    return (float(span[0]), float(span[1])) if span else (math.inf, -math.inf)


def _read_series(
    principal: Principal, plans: list[_Plan], scope: _JobScope
) -> dict[int, tuple[SeriesInfo, bool, np.ndarray, np.ndarray]]:
    """Every series row's series in one catalog query and one block read (over the union of
    their windows, on the nodes holding them): series id → (identity, of the incident's job,
    timestamps, values)."""
    wanted = [p for p in plans if p.kind == "series"]
    if not wanted:
        return {}
    qs = Series.objects.for_tenant(principal.operator_id).filter(_series_filter(wanted, scope))
    if principal.customer_id is not None:
        # Read in the operator's scope (the job's GPUs' unkeyed series have no customer), so
        # narrowed here to the job's own data and the customer's other jobs (module doc).
        qs = qs.filter(scope.series() | Q(job__customer_id=principal.customer_id))
    rows = list(
        qs.values_list(
            "id",
            "name",
            "node_id",
            "node__hostname",
            "gpu",
            "gpu_index",
            "pid",
            "job_id",
            "job__job_id",
            "rank",
            "local_rank",
            "labels",
        )
    )
    infos: dict[int, SeriesInfo] = {}
    of_job: dict[int, bool] = {}
    node_ids: set[int] = set()
    for sid, name, node_id, host, gpu, gidx, pid, job_pk, job, rank, lrank, labels in rows:
        labels_dict = labels if isinstance(labels, dict) else None
        infos[int(sid)] = SeriesInfo(
            name, host or "", gpu or "", gidx, pid, job or "", rank, lrank, labels_key(labels_dict)
        )
        of_job[int(sid)] = scope.holds(job_pk, gpu or "", pid, node_id)
        if node_id is not None:
            node_ids.add(int(node_id))
    if not infos:
        return {}
    t0 = min(p.window[0] for p in wanted)
    t1 = max(p.window[1] for p in wanted)
    data = ingest_selectors.read_samples(principal.operator_id, infos, node_ids, t0, t1)
    return {
        sid: (info, of_job[sid], d.ts, d.values)
        for (sid, info), d in zip(infos.items(), data, strict=True)
    }


def _belongs(plan: _Plan, info: SeriesInfo, in_job: bool) -> bool:
    """Whether a series read for the page belongs to this row's chart: the Python twin of
    _selectors over the catalog rows (the page reads every row's series together)."""
    if info.name != plan.base:
        return False
    row = plan.row
    if row.get("gpu"):
        return bool(info.gpu == row["gpu"]) or (plan.job_pk is not None and in_job)
    if row.get("rank") is not None and plan.job_id:
        return in_job if plan.job_pk is not None else info.job == plan.job_id
    if row.get("node"):
        return bool(info.node == row["node"])
    if plan.job_pk is not None:
        return in_job
    return bool(plan.job_id) and info.job == plan.job_id


def _lines(
    plan: _Plan, read: Mapping[int, tuple[SeriesInfo, bool, np.ndarray, np.ndarray]]
) -> list[_Line]:
    """The row's series merged into lines (one per GPU, rank, process or node port: a GPU's
    signal is stored under the job while it ran and unkeyed between jobs), clipped to the
    row's window."""
    note = str(plan.row.get("note") or "")
    groups: dict[tuple[Any, ...], list[tuple[SeriesInfo, np.ndarray, np.ndarray]]] = {}
    for info, in_job, ts, values in read.values():
        if _belongs(plan, info, in_job):
            keep = (ts >= plan.window[0]) & (ts <= plan.window[1])
            groups.setdefault(_line_key(info), []).append((info, ts[keep], values[keep]))
    lines = []
    for parts in groups.values():
        ts = np.concatenate([p[1] for p in parts])
        order = np.argsort(ts, kind="stable")
        values = np.concatenate([p[2] for p in parts])[order]
        ts = ts[order]
        info = parts[0][0]
        own = any(_is_own(plan, p[0]) for p in parts)
        lines.append(_Line(_line_label(info), ts, _transform(plan.base, note, ts, values), own))
    lines.sort(key=lambda line: (not line.own, line.label))
    return lines


def _read_events(
    principal: Principal, plans: list[_Plan], scope: _JobScope
) -> list[tuple[float, str, str, str]]:
    """Every event row's events in one query: (ts, name, node, gpu)."""
    wanted = [p for p in plans if p.kind == "event"]
    if not wanted:
        return []
    query = Q(pk__in=[])
    for plan in wanted:
        q = Q(ts_us__gte=int(plan.window[0] * 1e6), ts_us__lte=int(plan.window[1] * 1e6))
        if plan.base:
            q &= Q(name=plan.base)
        else:  # `events`: what the detectors count as errors (throttling is not one)
            q &= ~Q(name=signals.EVENT_THROTTLE)
        row = plan.row
        if row.get("gpu"):
            q &= Q(gpu=row["gpu"])
        elif row.get("node"):
            q &= Q(node__hostname=row["node"])
        elif scope.job_pk is not None:
            q &= (
                Q(job_id=scope.job_pk)
                | Q(gpu__in=sorted(scope.gpus))
                | Q(node_id__in=sorted(scope.nodes))
            )
        else:
            continue
        query |= q
    qs = Event.objects.for_tenant(principal.operator_id).filter(query)
    if principal.customer_id is not None:
        # Events of the job, of its GPUs, and of its nodes themselves (not of their other GPUs).
        qs = qs.filter(
            Q(job_id=scope.job_pk)
            | Q(job__isnull=True, gpu__in=sorted(scope.gpus))
            | Q(job__isnull=True, gpu="", node_id__in=sorted(scope.nodes))
        )
    return [
        (ts / 1e6, name, host or "", gpu or "")
        for ts, name, host, gpu in qs.order_by("ts_us").values_list(
            "ts_us", "name", "node__hostname", "gpu"
        )[:EVENT_ROWS_LIMIT]
    ]


def _event_times(plan: _Plan, events: list[tuple[float, str, str, str]]) -> list[float]:
    row = plan.row
    out = []
    for ts, name, node, gpu in events:
        if not plan.window[0] <= ts <= plan.window[1]:
            continue
        if plan.base and name != plan.base:
            continue
        if not plan.base and name == signals.EVENT_THROTTLE:
            continue
        if row.get("gpu") and gpu != row["gpu"]:
            continue
        if not row.get("gpu") and row.get("node") and node != row["node"]:
            continue
        out.append(ts)
    return out


def _read_logs(
    principal: Principal, plans: list[_Plan]
) -> dict[str, list[tuple[float, tp.ParsedLine]]]:
    """Every log row's job's parsed lines over the union of their windows, in one query:
    job id → (ts, parsed line), oldest first. Log lines are the job's own: the principal's
    scope reads them (a customer's rerun job included)."""
    wanted = [p for p in plans if p.kind == "log" and p.job_id]
    if not wanted:
        return {}
    jobs = {str(p.job_id) for p in wanted}
    t0 = min(p.window[0] for p in wanted)
    t1 = max(p.window[1] for p in wanted)
    rows = (
        LogLine.objects.for_tenant(principal)
        .filter(job__job_id__in=jobs, ts_us__gte=int(t0 * 1e6), ts_us__lte=int(t1 * 1e6))
        .order_by("ts_us", "id")
        .values_list("job__job_id", "node_id", "pid", "stream", "ts_us", "line")[:LOG_ROWS_LIMIT]
    )
    out: dict[str, list[tuple[float, tp.ParsedLine]]] = {}
    # One parser per output stream: a traceback spans lines (its end carries the error).
    parsers: dict[tuple[Any, ...], tp.LogParser] = {}
    for job, node_id, pid, stream, ts_us, line in rows:
        parsed = parsers.setdefault((job, node_id, pid, stream), tp.LogParser()).feed(line)
        if parsed is not None:
            out.setdefault(str(job), []).append((ts_us / 1e6, parsed))
    return out


def _log_chart(plan: _Plan, parsed: list[tuple[float, tp.ParsedLine]]) -> EvidenceRow:
    inside = [(ts, p) for ts, p in parsed if plan.window[0] <= ts <= plan.window[1]]
    if plan.base in LOG_COUNTS:
        kinds = LOG_COUNTS[plan.base]
        return _count_chart(plan, [ts for ts, p in inside if p.kind in kinds], "log")
    attr = LOG_VALUES[plan.base]
    points = []
    for ts, p in inside:
        value = getattr(p, attr, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            points.append((ts, float(value)))
    return _log_value_chart(plan, points)


def evidence_rows(
    principal: Principal, incident: Incident, verdict: Mapping[str, Any]
) -> list[EvidenceRow]:
    """Every evidence entry of the verdict with its chart (see the module doc for the reads)."""
    rows = [r for r in verdict.get("evidence") or [] if isinstance(r, dict)]
    if not rows:
        return []
    span = _job_span(principal, incident)
    plans = [_plan(row, i, incident, span) for i, row in enumerate(rows)]
    scope = _JobScope(principal.operator_id, incident.job_id)
    series = _read_series(principal, plans, scope)
    events = _read_events(principal, plans, scope)
    logs = _read_logs(principal, plans)
    out = []
    for plan in plans:
        if plan.kind == "series":
            out.append(_series_chart(plan, _lines(plan, series)))
        elif plan.kind == "event":
            out.append(_count_chart(plan, _event_times(plan, events), "events"))
        elif plan.kind == "log":
            out.append(_log_chart(plan, logs.get(str(plan.job_id), [])))
        else:
            out.append(_value_chart(plan))
    return out
