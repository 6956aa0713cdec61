"""Reads of the real-price page (/price/): the real price per job, per customer and for the
fleet over a period, the money the open verdicts' causes cost, and the calculator.

Where the numbers come from (docs/pricing.md): `JobGpuUsage` rows (a job's GPU time on one GPU,
split into compute / waiting / idle) priced with the operator's `GpuListPrice` per GPU model,
aggregated by `investigations.pricing.real_price` — the same function as the real-price API,
so the page and `/api/v1/real-price/` agree. Usage rows are cumulative per (job, GPU) with the
first and last sample time they count; a row that straddles the period's edge is counted
pro rata of its sampled span inside the period (GPU time spread evenly over the span).

Every aggregate is one SQL query over the rows the principal may see (`for_tenant`): an
operator's whole fleet, a customer's own jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    FloatField,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Greatest, Least

from investigations.models import Incident, IncidentState, JobGpuUsage
from investigations.pricing import RealPrice, UsageRow, real_price
from investigations.selectors import list_prices
from tenants.access import Principal
from tenants.context import tenant_context
from tenants.models import Customer

PAGE_SIZE = 50
DEFAULT_DAYS = 7
# The longest period one request may ask for: the page aggregates usage rows, not samples, so
# this bounds nothing expensive; it catches a typo'd year.
MAX_DAYS = 366

# ?sort= keys of the per-job table (prefix "-" for descending) and what each orders by.
JOB_SORTS = ("gpu_hours", "cost", "share", "job")
DEFAULT_JOB_SORT = "-gpu_hours"

Prices = dict[str, tuple[Decimal, str]]


@dataclass(frozen=True)
class Period:
    """Whole UTC days, `start` to `end` inclusive."""

    start: date
    end: date

    @property
    def t0(self) -> float:
        return datetime.combine(self.start, time(), UTC).timestamp()

    @property
    def t1(self) -> float:
        return datetime.combine(self.end + timedelta(days=1), time(), UTC).timestamp()

    @property
    def days(self) -> int:
        return (self.end - self.start).days + 1


def default_period(today: date | None = None) -> Period:
    """The last DEFAULT_DAYS days, today included."""
    today = today or datetime.now(UTC).date()
    return Period(today - timedelta(days=DEFAULT_DAYS - 1), today)


# --- usage in a period -----------------------------------------------------------------------


def _share_in_period(period: Period) -> Any:
    """Share of a usage row's sampled span [first_ts, last_ts] inside the period (1 for a row
    of one sample, which lies inside by the filter)."""
    t0, t1 = Value(period.t0), Value(period.t1)
    span = F("last_ts") - F("first_ts")
    overlap = Least(F("last_ts"), t1) - Greatest(F("first_ts"), t0)
    return Case(
        When(last_ts__gt=F("first_ts"), then=Greatest(overlap, Value(0.0)) / span),
        default=Value(1.0),
        output_field=FloatField(),
    )


def usage_in_period(principal: Principal, period: Period) -> QuerySet[JobGpuUsage]:
    """The usage rows the principal may see that overlap the period, each with `part`: the
    share of it inside the period (inside the caller's tenant context)."""
    return (
        JobGpuUsage.objects.for_tenant(principal)
        .filter(first_ts__lt=period.t1, last_ts__gte=period.t0)
        .annotate(part=_share_in_period(period))
    )


def _seconds(field: str) -> Sum:
    return Sum(F(field) * F("part"), output_field=FloatField())


def _price_case(prices: Prices) -> Any:
    """The row's list price per GPU-hour as a float (NULL for an unpriced model), for SQL
    ordering only: the money shown is computed in Decimal by real_price."""
    whens = [When(gpu_model=m, then=Value(float(p))) for m, (p, _c) in prices.items()]
    if not whens:
        return Value(None, output_field=FloatField())
    return Case(*whens, default=Value(None), output_field=FloatField())


def _usage_rows(values: Any) -> list[tuple[Any, UsageRow]]:
    return [
        (key, UsageRow(model or "", g or 0.0, c or 0.0, w or 0.0, i or 0.0, method or ""))
        for key, model, method, g, c, w, i in values
    ]


def _grouped_usage(qs: QuerySet[JobGpuUsage], key: str) -> Any:
    """(key, model, method, gpu s, compute s, wait s, idle s) per key, model and method."""
    return (
        qs.values(key, "gpu_model", "method")
        .annotate(
            g=_seconds("gpu_seconds"),
            c=_seconds("compute_seconds"),
            w=_seconds("wait_seconds"),
            i=_seconds("idle_seconds"),
        )
        .order_by()
        .values_list(key, "gpu_model", "method", "g", "c", "w", "i")
    )


def period_price(principal: Principal, period: Period) -> RealPrice:
    """The real price of everything the principal may see over the period (2 queries)."""
    with tenant_context(principal.operator_id):
        prices = list_prices(principal.operator_id)
        grouped = _grouped_usage(usage_in_period(principal, period), "gpu_model")
        return real_price([row for _key, row in _usage_rows(grouped)], prices)


# --- the money the open verdicts' causes cost ------------------------------------------------


def _lost_hours() -> Any:
    """An incident's `impact.gpu_hours_lost` (docs/verdicts.md), NULL where the verdict states
    none (hardware faults, fleet health)."""
    return Cast(KT("verdict__impact__gpu_hours_lost"), FloatField())


def _job_price_per_gpu_hour(prices: Prices) -> Subquery:
    """The job's mean list price per GPU-hour over all its usage (its GPUs' models weighted by
    their GPU time): what one GPU-hour of that job costs."""
    rows = (
        JobGpuUsage.objects.filter(job_id=OuterRef("job_id"))
        .values("job_id")
        .annotate(
            p=Sum(F("gpu_seconds") * _price_case(prices), output_field=FloatField())
            / Sum("gpu_seconds", output_field=FloatField())
        )
        .values("p")
    )
    return Subquery(rows, output_field=FloatField())


def open_incidents_in(
    principal: Principal, period: Period, usage: QuerySet[JobGpuUsage]
) -> QuerySet[Incident]:
    """Open job incidents the principal may see that overlap the period, on jobs with usage in
    it."""
    return Incident.objects.for_tenant(principal).filter(
        Exists(usage.filter(job_id=OuterRef("job_id"))),
        state=IncidentState.OPEN,
        job__isnull=False,
        first_seen__lt=datetime.fromtimestamp(period.t1, UTC),
        last_seen__gte=datetime.fromtimestamp(period.t0, UTC),
    )


@dataclass(frozen=True)
class Loss:
    incidents: int
    gpu_hours: float  # GPU-hours lost, as the verdicts state them
    money: Decimal | None  # at the jobs' list prices; None when nothing of it is priced


def _losses(incidents: QuerySet[Incident], key: str, prices: Prices) -> dict[Any, Loss]:
    lost = _lost_hours()
    rows = (
        incidents.values(key)
        .annotate(
            n=Count("id"),
            hours=Sum(lost, output_field=FloatField()),
            money=Sum(lost * _job_price_per_gpu_hour(prices), output_field=FloatField()),
        )
        .order_by()
        .values_list(key, "n", "hours", "money")
    )
    return {k: Loss(int(n), float(h or 0.0), _money(m)) for k, n, h, m in rows}


def _money(value: float | None) -> Decimal | None:
    if value is None:
        return None
    return Decimal(str(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


# --- the page --------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobPrice:
    job_pk: int
    job_id: str
    name: str
    customer: str
    price: RealPrice
    loss: Loss | None


@dataclass(frozen=True)
class CustomerPrice:
    customer_id: int | None
    name: str
    price: RealPrice
    loss: Loss | None


@dataclass(frozen=True)
class Calculator:
    """Effective price per productive GPU-hour for a list price and a productive share, and
    what it becomes when the GPU time the open verdicts say is lost is recovered."""

    list_price: Decimal
    share: Decimal  # 0 < share <= 1
    lost_share: float  # of the GPU time in scope, lost to the open verdicts' causes
    effective: Decimal
    share_after: Decimal
    effective_after: Decimal

    @property
    def saving(self) -> Decimal:
        return self.effective - self.effective_after


def calculate(list_price: Decimal, share: Decimal, lost_share: float) -> Calculator:
    """effective = list ÷ share. A fix that recovers the lost GPU time does the same work in
    (1 − lost) of the GPU time: share after = share ÷ (1 − lost), at most 1."""
    lost = min(max(lost_share, 0.0), float(1 - share))
    after = min(Decimal(1), share / Decimal(str(1.0 - lost)))
    q = Decimal("0.0001")
    return Calculator(
        list_price=list_price,
        share=share,
        lost_share=lost,
        effective=(list_price / share).quantize(q),
        share_after=after.quantize(q),
        effective_after=(list_price / after).quantize(q),
    )


@dataclass(frozen=True)
class PricePage:
    period: Period
    fleet: RealPrice
    fleet_loss: Loss
    customers: list[CustomerPrice]  # operators only; empty for a customer principal
    jobs: list[JobPrice]
    jobs_total: int
    page: int
    pages: int
    sort: str
    lost_share: float  # fleet_loss GPU-hours ÷ the period's GPU-hours

    @property
    def mean_list_price(self) -> Decimal | None:
        """List cost ÷ GPU-hours: the calculator's default list price."""
        if self.fleet.list_cost is None or self.fleet.gpu_hours <= 0:
            return None
        return (self.fleet.list_cost / Decimal(str(self.fleet.gpu_hours))).quantize(Decimal("0.01"))


def _order(sort: str) -> list[Any]:
    desc = sort.startswith("-")
    key = sort.lstrip("-")
    expr: Any = {
        "gpu_hours": F("g"),
        "cost": F("cost_key"),
        "share": F("c") / Greatest(F("g"), Value(1e-9)),
        "job": F("job__job_id"),
    }[key]
    ordered = expr.desc(nulls_last=True) if desc else expr.asc(nulls_last=True)
    return [ordered, "job_id"]


def price_page(principal: Principal, period: Period, *, sort: str, page: int) -> PricePage:
    """Everything /price/ shows for the principal over the period. `sort` is one of JOB_SORTS
    (optionally "-"-prefixed) and `page` ≥ 1, both validated by the view; a page past the end
    is empty."""
    with tenant_context(principal.operator_id):
        prices = list_prices(principal.operator_id)
        usage = usage_in_period(principal, period)
        by_customer: dict[int | None, list[UsageRow]] = {}
        for customer_id, row in _usage_rows(_grouped_usage(usage, "job__customer_id")):
            by_customer.setdefault(customer_id, []).append(row)
        all_rows = [r for rows in by_customer.values() for r in rows]
        fleet = real_price(all_rows, prices)
        incidents = open_incidents_in(principal, period, usage)
        customers: list[CustomerPrice] = []
        customer_losses: dict[Any, Loss] = {}
        if principal.is_operator:
            customer_losses = _losses(incidents, "job__customer_id", prices)
            names = _customer_names(principal, [c for c in by_customer if c is not None])
            customers = sorted(
                (
                    CustomerPrice(
                        c,
                        names.get(c, "(no customer)") if c is not None else "(no customer)",
                        real_price(rows, prices),
                        customer_losses.get(c),
                    )
                    for c, rows in by_customer.items()
                ),
                key=lambda cp: (-cp.price.gpu_hours, cp.name),
            )
            fleet_loss = _sum_losses(customer_losses.values())
        else:
            fleet_loss = _sum_losses(_losses(incidents, "job__customer_id", prices).values())
        jobs_total = usage.values("job_id").distinct().count()
        start = (page - 1) * PAGE_SIZE
        page_keys = list(
            usage.values("job_id")
            .annotate(
                g=_seconds("gpu_seconds"),
                c=_seconds("compute_seconds"),
                cost_key=Sum(
                    F("gpu_seconds") * F("part") * _price_case(prices), output_field=FloatField()
                ),
            )
            .order_by(*_order(sort))
            .values_list("job_id", flat=True)[start : start + PAGE_SIZE]
        )
        jobs = _job_rows(principal, usage, incidents, page_keys, prices)
    pages = max(1, -(-jobs_total // PAGE_SIZE))
    return PricePage(
        period=period,
        fleet=fleet,
        fleet_loss=fleet_loss,
        customers=customers,
        jobs=jobs,
        jobs_total=jobs_total,
        page=page,
        pages=pages,
        sort=sort,
        lost_share=(fleet_loss.gpu_hours / fleet.gpu_hours) if fleet.gpu_hours > 0 else 0.0,
    )


def _sum_losses(losses: Any) -> Loss:
    losses = list(losses)
    priced = [x.money for x in losses if x.money is not None]
    return Loss(
        sum(x.incidents for x in losses),
        sum(x.gpu_hours for x in losses),
        sum(priced, Decimal(0)) if priced else None,
    )


def _customer_names(principal: Principal, ids: list[int]) -> dict[int, str]:
    return dict(Customer.objects.for_tenant(principal).filter(pk__in=ids).values_list("pk", "name"))


def _job_rows(
    principal: Principal,
    usage: QuerySet[JobGpuUsage],
    incidents: QuerySet[Incident],
    job_pks: list[int],
    prices: Prices,
) -> list[JobPrice]:
    """The page's jobs, in `job_pks` order: their real price over the period (one query) and
    their open verdicts' loss (one query)."""
    if not job_pks:
        return []
    rows: dict[int, list[UsageRow]] = {}
    info: dict[int, tuple[str, str, str]] = {}
    grouped = (
        usage.filter(job_id__in=job_pks)
        .values("job_id", "job__job_id", "job__name", "job__customer__name", "gpu_model", "method")
        .annotate(
            g=_seconds("gpu_seconds"),
            c=_seconds("compute_seconds"),
            w=_seconds("wait_seconds"),
            i=_seconds("idle_seconds"),
        )
        .order_by()
        .values_list(
            "job_id",
            "job__job_id",
            "job__name",
            "job__customer__name",
            "gpu_model",
            "method",
            "g",
            "c",
            "w",
            "i",
        )
    )
    for pk, job_id, name, customer, model, method, g, c, w, i in grouped:
        info[pk] = (job_id, name or "", customer or "")
        rows.setdefault(pk, []).append(
            UsageRow(model or "", g or 0.0, c or 0.0, w or 0.0, i or 0.0, method or "")
        )
    losses = _losses(incidents.filter(job_id__in=job_pks), "job_id", prices)
    return [
        JobPrice(pk, *info[pk], real_price(rows[pk], prices), losses.get(pk))
        for pk in job_pks
        if pk in info
    ]


__all__ = [
    "DEFAULT_JOB_SORT",
    "JOB_SORTS",
    "MAX_DAYS",
    "PAGE_SIZE",
    "Calculator",
    "CustomerPrice",
    "JobPrice",
    "Loss",
    "Period",
    "PricePage",
    "calculate",
    "default_period",
    "period_price",
    "price_page",
    "usage_in_period",
]
