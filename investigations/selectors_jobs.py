"""Reads of jobs with what Proof makes of them: GPU and node counts, data span, productive
share and real price, open verdicts; a job's ranks, GPUs and nodes; any signal of a job
downsampled to a resolution.

Shared by the console's jobs pages (frontend/selectors/jobs.py) and the REST API
(investigations/api/jobs.py). Every read is scoped by the principal (`for_tenant`): an
operator sees its jobs, a customer its own jobs only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
from django.db.models import (
    Count,
    Exists,
    F,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Cast, Coalesce, NullIf

from contract import signals
from contract.rows import SeriesInfo
from ingest import selectors as ingest_selectors
from ingest.models import Gpu, Job, JobRank, Node, Process, SeriesRollup
from investigations.models import Incident, IncidentState, JobActivity, JobGpuUsage
from investigations.pricing import RealPrice, UsageRow, real_price
from investigations.selectors import list_prices, real_price_for
from tenants.access import Principal

# --- the list's figures, computed by the database ----------------------------------------------


def _count_of(model: Any, expression: Any, **where: Any) -> Subquery:
    """A correlated count per job (NULL when it has no rows): a subquery, not a join, so that
    several counts on one row do not multiply each other."""
    rows = model.objects.filter(job=OuterRef("pk"), **where).order_by().values("job")
    return Subquery(rows.annotate(n=expression).values("n")[:1], output_field=IntegerField())


def annotated_jobs(principal: Principal) -> QuerySet[Job]:
    """The principal's jobs with the list's sortable figures, computed by the database."""
    return annotate_job_figures(Job.objects.for_tenant(principal))


def annotate_job_figures(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """`jobs` (already scoped) with gpu_count, node_count, duration_s, share and
    open_incidents, each a correlated subquery (one query for a whole page)."""
    usage = JobGpuUsage.objects.filter(job=OuterRef("pk")).order_by().values("job")
    share = usage.annotate(
        s=Cast(Sum("compute_seconds"), FloatField())
        / NullIf(Cast(Sum("gpu_seconds"), FloatField()), Value(0.0))
    ).values("s")[:1]
    activity = JobActivity.objects.filter(job=OuterRef("pk")).annotate(
        d=F("last_data_ts") - F("first_data_ts")
    )
    return jobs.select_related("customer").annotate(
        # Of its processes, not JobRank: a rank's input workers (no GPU) are recorded on
        # the same rank and can leave JobRank.gpu blank.
        gpu_count=Coalesce(
            _count_of(Process, Count("gpu", distinct=True), gpu__gt=""), F("world_size")
        ),
        node_count=_count_of(Process, Count("node", distinct=True)),
        duration_s=Subquery(activity.values("d")[:1], output_field=FloatField()),
        share=Subquery(share, output_field=FloatField()),
        open_incidents=Coalesce(
            _count_of(Incident, Count("pk"), state=IncidentState.OPEN), Value(0)
        ),
    )


def page_prices(operator_id: int, job_pks: list[int]) -> dict[int, RealPrice]:
    """The real price of each of these jobs (investigations.pricing.real_price over the job's
    usage) from one grouped query: usage summed per (job, GPU model, method) — the sums
    real_price takes — rather than one read per job."""
    grouped = (
        JobGpuUsage.objects.for_tenant(operator_id)
        .filter(job_id__in=job_pks)
        .order_by()
        .values("job_id", "gpu_model", "method")
        .annotate(
            g=Sum("gpu_seconds"),
            c=Sum("compute_seconds"),
            w=Sum("wait_seconds"),
            i=Sum("idle_seconds"),
        )
    )
    rows: dict[int, list[UsageRow]] = {pk: [] for pk in job_pks}
    for r in grouped:
        rows[r["job_id"]].append(
            UsageRow(r["gpu_model"], r["g"], r["c"], r["w"], r["i"], r["method"])
        )
    prices = list_prices(operator_id) if job_pks else {}
    return {pk: real_price(usage, prices) for pk, usage in rows.items()}


def node_count_of(job: Job, counted: int | None) -> int | None:
    """Distinct nodes of the job's ranks, else what the scheduler said (a count or a list)."""
    if counted:
        return counted
    nodes = job.nodes
    if isinstance(nodes, list):
        return len(nodes) or None
    if isinstance(nodes, int):
        return nodes
    return None


def list_price_per_gpu_hour(price: RealPrice) -> Decimal | None:
    """The list cost per GPU-hour of the job's GPUs (their models' prices, GPU-time
    weighted): what the effective price is compared with."""
    if price.list_cost is None or price.gpu_hours <= 0:
        return None
    return (price.list_cost / Decimal(str(price.gpu_hours))).quantize(Decimal("0.0001"))


# --- API filters ---------------------------------------------------------------------------------


def on_node(jobs: QuerySet[Job], operator_id: int, hostname: str) -> QuerySet[Job]:
    """Jobs with a process on the node (an index probe per job: Process (job, node))."""
    ran = Process.objects.for_tenant(operator_id).filter(
        job=OuterRef("pk"), node__hostname=hostname
    )
    return jobs.filter(Exists(ran))


def on_gpu(jobs: QuerySet[Job], operator_id: int, uuid: str) -> QuerySet[Job]:
    ran = Process.objects.for_tenant(operator_id).filter(job=OuterRef("pk"), gpu=uuid)
    return jobs.filter(Exists(ran))


def matching(jobs: QuerySet[Job], text: str) -> QuerySet[Job]:
    return jobs.filter(Q(job_id__icontains=text) | Q(name__icontains=text))


def open_incident_ids(principal: Principal, job_pks: Iterable[int]) -> dict[int, list[str]]:
    """Public ids of the open incidents of each job the principal may see (one query)."""
    out: dict[int, list[str]] = {}
    rows = (
        Incident.objects.for_tenant(principal)
        .filter(job_id__in=list(job_pks), state=IncidentState.OPEN)
        .order_by("-last_seen", "-id")
        .values_list("job_id", "public_id")
    )
    for job_pk, public_id in rows:
        out.setdefault(int(job_pk), []).append(str(public_id))
    return out


# --- one job ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankRow:
    rank: int
    local_rank: int | None
    node: str
    gpu: str
    pid: int | None


@dataclass(frozen=True)
class GpuRow:
    uuid: str
    node: str
    index: int | None
    model: str


@dataclass(frozen=True)
class JobDetail:
    job: Job
    ranks: list[RankRow]
    gpus: list[GpuRow]
    nodes: list[str]
    data_span: tuple[float, float] | None  # first and last data time (seconds)
    price: RealPrice
    open_incidents: list[str]


def job_ranks(operator_id: int, job: Job) -> list[RankRow]:
    rows = (
        JobRank.objects.for_tenant(operator_id)
        .filter(job=job)
        .order_by("rank")
        .values_list("rank", "local_rank", "node__hostname", "gpu", "pid")
    )
    return [RankRow(r, lr, node or "", gpu, pid) for r, lr, node, gpu, pid in rows]


def job_gpus(operator_id: int, job: Job) -> list[GpuRow]:
    """The GPUs the job's processes held, as registered, in one query. Read by operator: the
    caller has already checked the principal may see the job. Processes, not JobRank: a
    rank's input-worker processes (no GPU) are recorded on the same rank."""
    held = Process.objects.for_tenant(operator_id).filter(job=job).exclude(gpu="").values("gpu")
    rows = (
        Gpu.objects.for_tenant(operator_id)
        .filter(uuid__in=held)
        .order_by("node__hostname", "index", "uuid")
        .values_list("uuid", "node__hostname", "index", "model")
    )
    return [GpuRow(uuid, node or "", index, model or "") for uuid, node, index, model in rows]


def job_nodes(operator_id: int, job: Job) -> list[str]:
    """Hostnames of the nodes the job's processes ran on, else the scheduler's node list."""
    hosts = sorted(
        set(
            Process.objects.for_tenant(operator_id)
            .filter(job=job)
            .values_list("node__hostname", flat=True)
        )
    )
    if hosts:
        return [h for h in hosts if h]
    return [str(n) for n in job.nodes] if isinstance(job.nodes, list) else []


def job_data_span(operator_id: int, job: Job) -> tuple[float, float] | None:
    return (
        JobActivity.objects.for_tenant(operator_id)
        .filter(job=job)
        .values_list("first_data_ts", "last_data_ts")
        .first()
    )


def job_detail(principal: Principal, job: Job) -> JobDetail:
    """Everything the API's job resource shows of a job the principal may see (its caller
    found it through the principal's scope): 7 queries whatever its size."""
    op = principal.operator_id
    return JobDetail(
        job=job,
        ranks=job_ranks(op, job),
        gpus=job_gpus(op, job),
        nodes=job_nodes(op, job),
        data_span=job_data_span(op, job),
        price=real_price_for(principal, job_pk=int(job.pk)),
        open_incidents=open_incident_ids(principal, [int(job.pk)]).get(int(job.pk), []),
    )


# --- a signal of a job, downsampled ------------------------------------------------------------------

# At most this many points (buckets, over all the returned series) in one response: ~1 MB of
# JSON. A request over it is refused naming the resolution that would fit.
MAX_POINTS = 10_000
# Raw samples: a node's blocks hold all of that node's series, so a read costs the nodes it
# touches × its range (1 s samples of an 8-GPU node are ~0.9 M values an hour; measured: 30
# min of a 2-node, 16-GPU run read and bucketed in 0.3-1.0 s, ~31 MB at its peak). A request
# may read this many node-seconds: 6 h of one node, 3 h of two, never under RAW_MIN_RANGE_S.
RAW_NODE_SECONDS = 6 * 3600.0
RAW_MIN_RANGE_S = 600.0
# A resolution of whole hours reads the hourly rollups instead (rebuilt every 15 minutes, so
# the newest hour may lag), over up to this long.
HOUR_S = 3600.0
ROLLUP_MAX_RANGE_S = 31 * 86400.0
# Reused by callers that name the raw limit of a one-node job (the schema's text).
MAX_RANGE_S = RAW_NODE_SECONDS


def raw_range_limit(nodes: int) -> float:
    """The longest range of raw samples one request may read across `nodes` nodes."""
    return max(RAW_MIN_RANGE_S, RAW_NODE_SECONDS / max(1, nodes))


def uses_rollups(resolution: float | None) -> bool:
    return resolution is not None and resolution >= HOUR_S and resolution % HOUR_S == 0


class SeriesRequestError(ValueError):
    """A series request the job cannot answer; `name` is the parameter at fault."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


@dataclass(frozen=True)
class Buckets:
    """One series downsampled: per bucket that holds samples, its start time (seconds), the
    mean, minimum and maximum of its samples and how many there were."""

    start: np.ndarray
    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    count: np.ndarray

    def __len__(self) -> int:
        return len(self.start)


def no_buckets() -> Buckets:
    empty = np.zeros(0)
    return Buckets(empty, empty, empty, empty, np.zeros(0, dtype=np.int64))


def bucket_stats(ts: np.ndarray, values: np.ndarray, start: float, resolution: float) -> Buckets:
    """Samples (ts seconds, values) cut into buckets of `resolution` seconds from `start`:
    per non-empty bucket the mean, min, max and count of its finite samples. Vectorised: one
    sort-free pass when the samples are in time order (as reads return them), with
    `ufunc.reduceat` over the bucket boundaries."""
    ts = np.asarray(ts, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(values) & (ts >= start)
    ts, values = ts[keep], values[keep]
    if not len(ts):
        return no_buckets()
    index = np.floor((ts - start) / resolution).astype(np.int64)
    if len(index) > 1 and np.any(np.diff(index) < 0):
        order = np.argsort(index, kind="stable")
        index, values = index[order], values[order]
    first = np.flatnonzero(np.concatenate(([True], index[1:] != index[:-1])))
    counts = np.diff(np.append(first, len(index)))
    sums = np.add.reduceat(values, first)
    return Buckets(
        start=start + index[first] * resolution,
        mean=sums / counts,
        min=np.minimum.reduceat(values, first),
        max=np.maximum.reduceat(values, first),
        count=counts,
    )


@dataclass(frozen=True)
class SignalSeries:
    info: SeriesInfo
    rank: int | None  # the series' rank, or the rank that held its GPU
    buckets: Buckets


@dataclass(frozen=True)
class JobSignal:
    signal: str
    unit: str
    start: float
    end: float
    resolution: float
    series: list[SignalSeries]
    source: str = "raw samples"  # or "hourly rollups"

    @property
    def points(self) -> int:
        return sum(len(s.buckets) for s in self.series)


def buckets_per_series(start: float, end: float, resolution: float) -> int:
    return math.floor((end - start) / resolution) + 1


def smallest_resolution(start: float, end: float, series: int) -> float:
    """The smallest whole number of seconds (at least 1) whose buckets over [start, end] for
    `series` series (at most MAX_POINTS of them) stay within MAX_POINTS."""
    per_series = MAX_POINTS // max(1, series)
    if per_series <= 1:  # one bucket a series: any resolution covering the range
        return float(max(1, math.floor(end - start) + 1))
    # floor(R / s) + 1 <= per_series  <=>  s >= R / (per_series - 1)
    seconds = max(1.0, float(math.ceil((end - start) / (per_series - 1))))
    while buckets_per_series(start, end, seconds) * series > MAX_POINTS:  # float rounding
        seconds += 1.0
    return seconds


def rollup_buckets(
    hour_ms: np.ndarray,
    count: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    total: np.ndarray,
    start: float,
    resolution: float,
) -> Buckets:
    """Hourly rollup rows of one series (bucket start in ms, count, min, max, sum) merged into
    buckets of `resolution` seconds (whole hours) from `start` (an hour's start)."""
    keep = count > 0
    hour_ms, count, low, high, total = (a[keep] for a in (hour_ms, count, low, high, total))
    if not len(hour_ms):
        return no_buckets()
    order = np.argsort(hour_ms, kind="stable")
    hour_ms, count, low, high, total = (a[order] for a in (hour_ms, count, low, high, total))
    index = np.floor((hour_ms / 1000.0 - start) / resolution).astype(np.int64)
    first = np.flatnonzero(np.concatenate(([True], index[1:] != index[:-1])))
    counts = np.add.reduceat(count.astype(np.int64), first)
    return Buckets(
        start=start + index[first] * resolution,
        mean=np.add.reduceat(total.astype(np.float64), first) / counts,
        min=np.minimum.reduceat(low.astype(np.float64), first),
        max=np.maximum.reduceat(high.astype(np.float64), first),
        count=counts,
    )


def job_signal(
    principal: Principal,
    job: Job,
    *,
    signal: str,
    rank: int | None = None,
    gpu: str | None = None,
    start: float | None = None,
    end: float | None = None,
    resolution: float | None = None,
) -> JobSignal:
    """`signal` of a job the principal may see (its caller found it through the principal's
    scope), per series — one per rank or GPU (and label set) — narrowed to `rank` and/or `gpu`,
    over [start, end] (default: the newest data that a raw read may cover, `raw_range_limit`),
    in buckets of `resolution` seconds (default: the finest within MAX_POINTS); a resolution
    of whole hours reads the hourly rollups, over up to ROLLUP_MAX_RANGE_S. SeriesRequestError names
    the parameter it cannot use. The series are the job's own and the GPU-scope series of
    the GPUs its ranks ran on (ingest.selectors.job_series_catalog)."""
    op = principal.operator_id
    catalog = ingest_selectors.job_series_catalog(op, job.job_id)
    available = sorted({info.name for info in catalog.infos.values()})
    if signal not in available:
        listed = ", ".join(available) if available else "none stored"
        raise SeriesRequestError(
            "signal", f"job {job.job_id} has no signal {signal!r}; its signals: {listed}"
        )
    ranks = job_ranks(op, job)
    rank_of_gpu = {r.gpu: r.rank for r in ranks if r.gpu}
    if rank is not None and rank not in {r.rank for r in ranks}:
        known = ", ".join(str(r.rank) for r in ranks) or "none"
        raise SeriesRequestError("rank", f"job {job.job_id} has no rank {rank}; its ranks: {known}")
    chosen: dict[int, tuple[SeriesInfo, int | None]] = {}
    for sid, info in catalog.infos.items():
        if info.name != signal:
            continue
        series_rank = info.rank if info.rank is not None else rank_of_gpu.get(info.gpu)
        if rank is not None and series_rank != rank:
            continue
        if gpu is not None and info.gpu != gpu:
            continue
        chosen[sid] = (info, series_rank)
    if gpu is not None and not chosen:
        gpus = sorted({i.gpu for i in catalog.infos.values() if i.name == signal and i.gpu})
        raise SeriesRequestError(
            "gpu",
            f"job {job.job_id} has no {signal} series on GPU {gpu!r}"
            + (f"; its GPUs with it: {', '.join(gpus)}" if gpus else ""),
        )
    if len(chosen) > MAX_POINTS:
        raise SeriesRequestError(
            "rank", f"{len(chosen)} series of {signal}: narrow them with rank or gpu"
        )
    rollups = uses_rollups(resolution)
    node_ids = catalog.node_ids
    if not rollups:
        node_ids = _nodes_holding(op, [info for info, _r in chosen.values()], catalog.node_ids)
    limit = ROLLUP_MAX_RANGE_S if rollups else raw_range_limit(len(node_ids))
    t0, t1 = _range(op, job, start, end, limit, rollups)
    t0_raw = t0
    if rollups:
        t0 = math.floor(t0 / HOUR_S) * HOUR_S  # the rollups' buckets are whole hours
    count = max(1, len(chosen))
    if resolution is None:
        resolution = smallest_resolution(t0, t1, count)
    elif buckets_per_series(t0, t1, resolution) * count > MAX_POINTS:
        raise SeriesRequestError(
            "resolution",
            f"{resolution:g} s over {t1 - t0:g} s of {count} series is more than "
            f"{MAX_POINTS} points; use at least {smallest_resolution(t0, t1, count):g}",
        )
    if rollups:
        # Series without the job's key (its GPUs' own) count only the hours wholly inside the
        # job's data: an hour it shares with an earlier or later job would mix that job's in.
        foreign = [sid for sid, (info, _r) in chosen.items() if info.job != job.job_id]
        buckets = _rollup_read(op, list(chosen), t0, t1, resolution, foreign, span=(t0_raw, t1))
        series = [
            SignalSeries(info, r, buckets.get(sid) or no_buckets())
            for sid, (info, r) in chosen.items()
        ]
    else:
        read = ingest_selectors.catalog_samples(
            op,
            ingest_selectors.SeriesCatalog({sid: v[0] for sid, v in chosen.items()}, node_ids),
            t0,
            t1,
        )
        rank_by_info = {info: r for info, r in chosen.values()}
        series = [
            SignalSeries(
                d.info, rank_by_info.get(d.info), bucket_stats(d.ts, d.values, t0, resolution)
            )
            for d in read
        ]
    series.sort(key=lambda s: (s.rank is None, s.rank or 0, s.info.gpu, s.info.labels))
    spec = signals.spec_for(signal)
    source = "hourly rollups" if rollups else "raw samples"
    return JobSignal(signal, spec.unit if spec else "", t0, t1, resolution, series, source)


def _nodes_holding(op: int, infos: list[SeriesInfo], node_ids: frozenset[int]) -> frozenset[int]:
    """Of the job's nodes, those whose blocks hold these series (one query): a rank's series
    need one node's blocks, not the whole job's."""
    hostnames = {info.node for info in infos}
    if not infos or "" in hostnames:
        return node_ids
    return frozenset(
        int(pk)
        for pk in Node.objects.for_tenant(op)
        .filter(pk__in=list(node_ids), hostname__in=sorted(hostnames))
        .values_list("pk", flat=True)
    )


def _rollup_read(
    op: int,
    series_ids: list[int],
    t0: float,
    t1: float,
    resolution: float,
    whole_hours_only: list[int],
    span: tuple[float, float],
) -> dict[int, Buckets]:
    """The series' hourly rollups over [t0, t1] merged per bucket (one query); of the
    `whole_hours_only` series, only the hours wholly inside `span`."""
    rows = np.array(
        list(
            SeriesRollup.objects.for_tenant(op)
            .filter(
                series_id__in=series_ids,
                bucket_start_ms__gte=int(t0 * 1000),
                bucket_start_ms__lte=int(t1 * 1000),
            )
            .values_list("series_id", "bucket_start_ms", "count", "min", "max", "sum")
        ),
        dtype=np.float64,
    ).reshape(-1, 6)
    if whole_hours_only and len(rows):
        partial = (rows[:, 1] < span[0] * 1000) | (rows[:, 1] + HOUR_S * 1000 > span[1] * 1000)
        rows = rows[~(np.isin(rows[:, 0], whole_hours_only) & partial)]
    out = {}
    for sid in np.unique(rows[:, 0]).astype(np.int64).tolist():
        r = rows[rows[:, 0] == sid]
        out[int(sid)] = rollup_buckets(r[:, 1], r[:, 2], r[:, 3], r[:, 4], r[:, 5], t0, resolution)
    return out


def _range(
    op: int, job: Job, start: float | None, end: float | None, limit: float, rollups: bool
) -> tuple[float, float]:
    """[start, end] within the job's own data span. Clamped, not only defaulted: the GPU-scope
    series of its GPUs carry no job key, and outside the job's span they are whichever job
    (of whichever customer) held the GPU then."""
    lo, hi = job_data_span(op, job) or (
        job.first_seen_at.timestamp(),
        job.last_seen_at.timestamp(),
    )
    lo, hi = float(lo), float(hi)
    if start is not None and start > hi:
        raise SeriesRequestError("start", f"after the job's newest data ({hi:.3f})")
    if end is not None and end < lo:
        raise SeriesRequestError("end", f"before the job's first data ({lo:.3f})")
    t1 = hi if end is None else min(end, hi)
    t0 = max(lo, t1 - limit) if start is None else max(start, lo)
    if t1 <= t0:
        raise SeriesRequestError("end", f"must be after start ({t0:.3f}), not {t1:.3f}")
    if t1 - t0 > limit:
        hint = (
            "several requests"
            if rollups
            else "several requests, or a resolution of whole hours (3600, 7200, ...) to read "
            f"the hourly rollups over up to {ROLLUP_MAX_RANGE_S / 86400:g} days"
        )
        raise SeriesRequestError(
            "start", f"at most {limit:g} s before end here, not {t1 - t0:g} s; use {hint}"
        )
    return t0, t1
