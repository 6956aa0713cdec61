"""Fleet health (operators only): the GPUs degrading or failing, ranked by how urgently they
should be drained, each with the trend of the counters its verdicts cite. What the console's
/health/ page (frontend/selectors/health.py) and the API's /api/v1/fleet-health/ show.

Which GPUs: those with an open infrastructure incident naming the GPU of one of two families
— `gpu_degrading` (the fleet-health pass, investigations.services.evaluate_fleet_health: ≥ 2
independent signs on one GPU before any job failed, one incident per GPU) and
`hardware_fault` (a fault XID, a DBE or an uncorrectable remap that hit a job on it).

Urgency (docs/console.md, "Fleet health"), most urgent first:
1. drain now — a `hardware_fault`: the GPU has already failed a job;
2. drain at the next job boundary — `gpu_degrading` with ≥ 3 signs (its verdict cites one
   evidence entry per sign);
3. schedule diagnostics — `gpu_degrading` with 2 signs.
Within a tier: a GPU a running job holds now first (that job is what a failure would take
down: checkpoint and move it), then higher confidence, then the most recently seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    Func,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast

from contract import signals
from ingest import selectors as ingest_selectors
from ingest.models import Event, Gpu
from investigations.models import GPU_DEGRADING, Incident, IncidentState
from investigations.selectors_fleet import DEFAULT_SILENT_MIN, HARDWARE_FAULT, holding, jobs_holding
from tenants.access import Principal
from tenants.context import tenant_context

FAMILIES = (HARDWARE_FAULT, GPU_DEGRADING)
PER_PAGE = 25
DEFAULT_DAYS = 3
MAX_DAYS = 14  # 336 hourly points a line: within the charts' ~600
# A gpu_degrading verdict cites one evidence entry per sign (engine/detectors/hardware.py);
# three or more at once is the "drain at the next job boundary" tier.
MANY_SIGNS = 3
HOUR_S = 3600
HOUR_US = 3_600_000_000

TIERS = {
    1: (
        "Drain now",
        "A hardware fault already failed a job on this GPU: take it out of scheduling, run "
        "diagnostics (dcgmi diag -r 3), reset or RMA it.",
    ),
    2: (
        "Drain at the next job boundary",
        "Three or more independent signs of degradation: let the running job reach a "
        "checkpoint, then drain the GPU for diagnostics before it fails one.",
    ),
    3: (
        "Schedule diagnostics",
        "Two signs of degradation: schedule diagnostics in the next maintenance window and "
        "keep long jobs off it meanwhile.",
    ),
}

# An evidence signal and what is charted for it: cumulative hardware counters as their level
# per hour; throttle reasons (a bitmask, meaningless summed) as the SM clock they pull down.
COUNTERS = frozenset(ingest_selectors.GPU_COUNTERS)
THROTTLE_CHART = signals.DCGM_FI_DEV_SM_CLOCK


@dataclass(frozen=True)
class Trend:
    """One chart: a signal of one GPU over the page's days, hourly."""

    key: str  # what the evidence cited (a signal name, or "event: xid")
    label: str
    unit: str
    spec: dict[str, Any]  # charts.js spec
    first: float | None
    last: float | None
    increase: float | None  # last − first for counters, events counted for events
    last_day: float | None  # the same over the last 24 hours
    chart_id: str


@dataclass(frozen=True)
class Sign:
    signal: str
    observed: Any
    baseline: Any
    note: str


@dataclass(frozen=True)
class AtRiskIncident:
    public_id: str
    family: str
    title: str
    confidence: float
    first_seen: datetime
    last_seen: datetime
    recommendation: str
    job: str | None
    signs: list[Sign]


@dataclass
class AtRiskGpu:
    rank: int  # 1-based position in the drain advice
    gpu: str
    node: str
    index: int | None
    model: str
    tier: int
    action: str
    why: str
    confidence: float
    last_seen: datetime
    running_job: str | None
    running_customer: str | None
    incidents: list[AtRiskIncident] = field(default_factory=list)
    trends: list[Trend] = field(default_factory=list)


@dataclass(frozen=True)
class HealthSummary:
    gpus: int
    failing: int  # with an open hardware_fault
    degrading: int  # with an open gpu_degrading
    nodes: int


@dataclass(frozen=True)
class HealthPage:
    summary: HealthSummary
    gpus: list[AtRiskGpu]
    page: int
    pages: int
    days: int


def _at_risk(principal: Principal) -> QuerySet[Incident]:
    return (
        Incident.objects.for_tenant(principal)
        .filter(state=IncidentState.OPEN, category="infrastructure", family__in=FAMILIES)
        .exclude(subject_gpu="")
    )


class _JsonArrayLength(Func):
    """The length of a JSON array (the verdict's evidence), on both databases."""

    function = "json_array_length"  # SQLite
    output_field = IntegerField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, function="jsonb_array_length", **extra)


def _tier() -> Case:
    return Case(
        When(family=HARDWARE_FAULT, then=Value(1)),
        When(signs__gte=MANY_SIGNS, then=Value(2)),
        default=Value(3),
        output_field=IntegerField(),
    )


def _with_signs(incidents: QuerySet[Incident]) -> QuerySet[Incident]:
    """Each incident with `signs`: how many evidence entries its verdict cites."""
    return incidents.annotate(signs=_JsonArrayLength(KeyTransform("evidence", "verdict")))


def _event_hour() -> Cast:
    """The hour an event's timestamp (µs) falls in, in hours since the epoch (integer
    division on both databases)."""
    return Cast(F("ts_us") / HOUR_US, IntegerField())


def _hours(t0: float, t1: float) -> list[float]:
    start = int(t0) // HOUR_S * HOUR_S
    return [float(h) for h in range(start, int(t1) + 1, HOUR_S)]


def _event_name(signal: str) -> str | None:
    """ "event: xid (warning)" → "xid"."""
    if not signal.startswith("event: "):
        return None
    return signal[len("event: ") :].split(" (")[0].strip() or None


def _chartable(signal: str) -> bool:
    return (
        signal in COUNTERS
        or signal == signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
        or (_event_name(signal) is not None)
    )


def _implicating(evidence: list[dict[str, Any]], gpu: str) -> list[Sign]:
    """The evidence entries that point at this GPU: on it (or on no particular GPU) and with
    something observed (a hardware verdict's clearance rows that read 0 cleared it)."""
    out = []
    seen: set[tuple[str, str]] = set()
    for e in evidence:
        observed = e.get("observed")
        key = (str(e.get("signal") or ""), str(observed))
        if key in seen:  # a hardware verdict cites a counter again in its clearance rows
            continue
        seen.add(key)
        if e.get("gpu") not in (None, "", gpu):
            continue
        if observed is None or (isinstance(observed, int | float) and observed == 0):
            continue
        out.append(
            Sign(str(e.get("signal") or ""), observed, e.get("baseline"), str(e.get("note") or ""))
        )
    return out


def _trend(
    key: str,
    label: str,
    unit: str,
    xs: list[float],
    values: list[float | None],
    chart_id: str,
    interval: tuple[float, float] | None,
    *,
    events: bool,
) -> Trend:
    known = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
    day_ago = xs[-1] - 24 * HOUR_S if xs else 0.0
    if events:
        increase: float | None = float(sum(v for _x, v in known))
        last_day: float | None = float(sum(v for x, v in known if x >= day_ago))
        first = last = None
    else:
        first = known[0][1] if known else None
        last = known[-1][1] if known else None
        increase = (last - first) if first is not None and last is not None else None
        recent = [v for x, v in known if x >= day_ago]
        before = [v for x, v in known if x < day_ago]
        start = before[-1] if before else (recent[0] if recent else None)
        last_day = (last - start) if last is not None and start is not None else None
    spec = {
        "x": xs,
        "series": [{"label": label, "values": values, "unit": unit}],
        "interval": list(interval) if interval else None,
        "baseline": None,
        "y_label": unit,
    }
    return Trend(key, label, unit, spec, first, last, increase, last_day, chart_id)


def health_page(
    principal: Principal,
    *,
    days: int,
    page: int,
    now: float | None = None,
    per_page: int = PER_PAGE,
) -> HealthPage:
    """Page `page` (of `per_page` GPUs) of the fleet's GPUs at risk, with `days` of trends
    (8 queries, whatever the page holds)."""
    now = datetime.now(UTC).timestamp() if now is None else now
    t0 = now - days * 86400.0
    cutoff = datetime.fromtimestamp(now, UTC) - timedelta(minutes=DEFAULT_SILENT_MIN)
    with tenant_context(principal.operator_id):
        incidents = _at_risk(principal)
        totals = incidents.aggregate(
            gpus=Count("subject_gpu", distinct=True),
            failing=Count("subject_gpu", distinct=True, filter=Q(family=HARDWARE_FAULT)),
            degrading=Count("subject_gpu", distinct=True, filter=Q(family=GPU_DEGRADING)),
            nodes=Count("subject_node", distinct=True),
        )
        summary = HealthSummary(
            totals["gpus"], totals["failing"], totals["degrading"], totals["nodes"]
        )
        held = holding(principal, cutoff).filter(gpu=OuterRef("subject_gpu"))
        start = (page - 1) * per_page
        ranked = list(
            _with_signs(incidents)
            .values("subject_gpu")
            .annotate(
                tier=Min(_tier()),
                conf=Max("confidence"),
                last=Max("last_seen"),
                busy=Exists(held),
            )
            .order_by("tier", "-busy", "-conf", "-last", "subject_gpu")
            .values_list("subject_gpu", "tier", "conf", "last")[start : start + per_page]
        )
        gpus = [r[0] for r in ranked]
        rows = _details(principal, ranked, start, t0, now, cutoff) if gpus else []
    pages = max(1, -(-summary.gpus // per_page))
    return HealthPage(summary, rows, page, pages, days)


def _details(
    principal: Principal,
    ranked: list[tuple[str, int, float, datetime]],
    start: int,
    t0: float,
    now: float,
    cutoff: datetime,
) -> list[AtRiskGpu]:
    """The page's GPUs: where they are, who runs on them, their incidents and trends (5
    queries)."""
    gpus = [r[0] for r in ranked]
    where = {
        uuid: (node or "", index, model)
        for uuid, node, index, model in Gpu.objects.for_tenant(principal)
        .filter(uuid__in=gpus)
        .values_list("uuid", "node__hostname", "index", "model")
    }
    jobs = jobs_holding(principal, gpus, cutoff)
    by_gpu: dict[str, list[Incident]] = {}
    for incident in (
        _with_signs(_at_risk(principal))
        .filter(subject_gpu__in=gpus)
        .select_related("job")
        .order_by(_tier().asc(), "-confidence", "-last_seen")
    ):
        by_gpu.setdefault(incident.subject_gpu, []).append(incident)
    out: list[AtRiskGpu] = []
    wanted: dict[str, set[str]] = {}
    for k, (gpu, tier, conf, last) in enumerate(ranked):
        node, index, model = where.get(gpu, ("", None, ""))
        job, customer = jobs.get(gpu, (None, None))
        row = AtRiskGpu(
            rank=start + k + 1,
            gpu=gpu,
            node=node or next((i.subject_node for i in by_gpu.get(gpu, [])), ""),
            index=index,
            model=model,
            tier=tier,
            action=TIERS[tier][0],
            why=TIERS[tier][1],
            confidence=conf,
            last_seen=last,
            running_job=job,
            running_customer=customer,
        )
        for incident in by_gpu.get(gpu, []):
            verdict = incident.verdict or {}
            signs = _implicating(list(verdict.get("evidence") or []), gpu)
            row.incidents.append(
                AtRiskIncident(
                    str(incident.public_id),
                    incident.family,
                    incident.title,
                    incident.confidence,
                    incident.first_seen,
                    incident.last_seen,
                    str(verdict.get("recommendation") or ""),
                    incident.job.job_id if incident.job else None,
                    signs,
                )
            )
            wanted.setdefault(gpu, set()).update(s.signal for s in signs if _chartable(s.signal))
        out.append(row)
    _add_trends(principal, out, wanted, t0, now)
    return out


def _add_trends(
    principal: Principal,
    rows: list[AtRiskGpu],
    wanted: dict[str, set[str]],
    t0: float,
    now: float,
) -> None:
    """Every row's trend charts, from one rollup query and one event query for the page."""
    names = {s for cited in wanted.values() for s in cited}
    rollup_names = {s for s in names if s in COUNTERS}
    if signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS in names:
        rollup_names.add(THROTTLE_CHART)
    event_names = {n for n in (_event_name(s) for s in names) if n}
    gpus = list(wanted)
    buckets = (
        ingest_selectors.gpu_buckets(principal.operator_id, gpus, sorted(rollup_names), t0)
        if rollup_names and gpus
        else {}
    )
    counts: dict[tuple[str, str], dict[float, int]] = {}
    if event_names and gpus:
        for gpu, name, h, n in (
            Event.objects.for_tenant(principal)
            .filter(gpu__in=gpus, name__in=sorted(event_names), ts_us__gte=int(t0 * 1e6))
            .annotate(hour=_event_hour())
            .values("gpu", "name", "hour")
            .annotate(n=Count("id"))
            .order_by()
            .values_list("gpu", "name", "hour", "n")
        ):
            counts.setdefault((gpu, name), {})[float(h) * HOUR_S] = int(n)
    xs = _hours(t0, now)
    for row in rows:
        interval = (
            (
                min(i.first_seen for i in row.incidents).timestamp(),
                max(i.last_seen for i in row.incidents).timestamp(),
            )
            if row.incidents
            else None
        )
        for k, signal in enumerate(sorted(wanted.get(row.gpu, set()))):
            chart_id = f"trend-{row.rank}-{k}"
            event = _event_name(signal)
            if event is not None:
                per_hour = counts.get((row.gpu, event), {})
                values: list[float | None] = [float(per_hour.get(x, 0)) for x in xs]
                row.trends.append(
                    _trend(
                        signal,
                        f"{event} events per hour",
                        "events",
                        xs,
                        values,
                        chart_id,
                        interval,
                        events=True,
                    )
                )
                continue
            name = (
                THROTTLE_CHART if signal == signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS else signal
            )
            at = {b.bucket_start: b for b in buckets.get((row.gpu, name), [])}
            if name == THROTTLE_CHART:
                values = [at[x].min if x in at else None for x in xs]
                label, unit = "SM clock, lowest in the hour (throttling)", "MHz"
            else:
                values = [at[x].max if x in at else None for x in xs]
                label, unit = signal.removeprefix("DCGM_FI_DEV_"), "count"
            row.trends.append(
                _trend(signal, label, unit, xs, values, chart_id, interval, events=False)
            )
