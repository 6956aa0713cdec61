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

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import (
    Count,
    QuerySet,
    Sum,
)

from ingest.models import Job
from investigations.models import Incident, IncidentState, JobGpuUsage
from investigations.pricing import RealPrice, UsageRow, real_price
from investigations.selectors import (
    list_prices,
    part_seconds,
    price_between,
    usage_between,
)
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


# --- usage in a period: investigations/selectors.py (the real-price API reads the same) --------


def usage_in_period(principal: Principal, period: Period) -> QuerySet[JobGpuUsage]:
    return usage_between(principal, period.t0, period.t1)


def period_price(principal: Principal, period: Period) -> RealPrice:
    return price_between(principal, period.t0, period.t1)


# --- the money the open verdicts' causes cost ------------------------------------------------


def open_losses(principal: Principal, period: Period) -> dict[int, tuple[int, float]]:
    """Job pk → (open incidents, GPU-hours their verdicts say were lost) of the open job
    incidents the principal may see whose interval overlaps the period (one query; the losses
    are the verdicts' `impact.gpu_hours_lost` as the incident's generated column keeps it, so
    no verdict JSON is read)."""
    rows = (
        Incident.objects.for_tenant(principal)
        .filter(
            state=IncidentState.OPEN,
            job__isnull=False,
            first_seen__lt=datetime.fromtimestamp(period.t1, UTC),
            last_seen__gte=datetime.fromtimestamp(period.t0, UTC),
        )
        .values("job_id")
        .annotate(n=Count("id"), hours=Sum("gpu_hours_lost"))
        .order_by()
        .values_list("job_id", "n", "hours")
    )
    return {int(j): (int(n), float(h or 0.0)) for j, n, h in rows}


@dataclass(frozen=True)
class Loss:
    incidents: int
    gpu_hours: float  # GPU-hours lost, as the verdicts state them
    money: Decimal | None  # at the jobs' list prices; None when nothing of it is priced


def _money(value: Decimal | None) -> Decimal | None:
    return None if value is None else value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


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


@dataclass
class _JobUsage:
    """One job's usage rows in the period (per GPU model and method), as read."""

    job_id: str
    customer_id: int | None
    rows: list[UsageRow]

    def gpu_seconds(self) -> float:
        return sum(r.gpu_seconds for r in self.rows)

    def compute_seconds(self) -> float:
        return sum(r.compute_seconds for r in self.rows)

    def price_per_gpu_hour(self, prices: Prices) -> Decimal | None:
        """The job's list price per GPU-hour: its GPUs' models weighted by their GPU time
        (None if a model of it has no price)."""
        g = self.gpu_seconds()
        cost = self.cost_key(prices)
        if g <= 0 or cost is None:
            return None
        return Decimal(str(cost / g))

    def cost_key(self, prices: Prices) -> float | None:
        if any(r.gpu_model not in prices for r in self.rows):
            return None
        return sum(r.gpu_seconds * float(prices[r.gpu_model][0]) for r in self.rows)


def _read_jobs(usage: QuerySet[JobGpuUsage]) -> dict[int, _JobUsage]:
    """Every job's usage in the period, per GPU model and method: one GROUP BY over the usage
    rows (a few rows a job), the rest is arithmetic on them. Names are read apart, for the
    rows shown (grouping by them cost more than the sums)."""
    jobs: dict[int, _JobUsage] = {}
    for pk, job_id, customer_id, model, method, g, c, w, i in (
        usage.values("job_id", "job__job_id", "job__customer_id", "gpu_model", "method")
        .annotate(
            g=part_seconds("gpu_seconds"),
            c=part_seconds("compute_seconds"),
            w=part_seconds("wait_seconds"),
            i=part_seconds("idle_seconds"),
        )
        .order_by()
        .values_list(
            "job_id", "job__job_id", "job__customer_id", "gpu_model", "method", "g", "c", "w", "i"
        )
    ):
        job = jobs.get(pk)
        if job is None:
            job = jobs[pk] = _JobUsage(job_id, customer_id, [])
        job.rows.append(UsageRow(model or "", g or 0.0, c or 0.0, w or 0.0, i or 0.0, method or ""))
    return jobs


def _collapsed(rows: Iterable[UsageRow]) -> list[UsageRow]:
    """The rows summed per GPU model and method: real_price is a sum over rows, so a fleet's
    or a customer's thousands of rows price the same as these few."""
    sums: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        acc = sums.setdefault((r.gpu_model, r.method), [0.0, 0.0, 0.0, 0.0])
        acc[0] += r.gpu_seconds
        acc[1] += r.compute_seconds
        acc[2] += r.wait_seconds
        acc[3] += r.idle_seconds
    return [UsageRow(m, g, c, w, i, method) for (m, method), (g, c, w, i) in sums.items()]


def _sort_key(sort: str, prices: Prices) -> Any:
    key = sort.lstrip("-")
    if key == "gpu_hours":
        return lambda item: item[1].gpu_seconds()
    if key == "cost":
        return lambda item: item[1].cost_key(prices)
    if key == "share":
        return lambda item: item[1].compute_seconds() / max(item[1].gpu_seconds(), 1e-9)
    return lambda item: item[1].job_id


def _sorted(jobs: dict[int, _JobUsage], sort: str, prices: Prices) -> list[int]:
    """Job pks in `sort` order (unpriced jobs last either way; ties by pk)."""
    key = _sort_key(sort, prices)
    keyed = [(key(item), item[0]) for item in sorted(jobs.items())]
    known = [(k, pk) for k, pk in keyed if k is not None]
    known.sort(key=lambda kp: kp[0], reverse=sort.startswith("-"))
    return [pk for _k, pk in known] + [pk for k, pk in keyed if k is None]


def _loss(jobs: list[tuple[_JobUsage, tuple[int, float]]], prices: Prices) -> Loss:
    """The loss of these jobs' open incidents: GPU-hours at each job's list price."""
    money: Decimal | None = None
    for job, (_n, hours) in jobs:
        price = job.price_per_gpu_hour(prices)
        if price is not None and hours:
            money = (money or Decimal(0)) + Decimal(str(hours)) * price
    return Loss(sum(n for _j, (n, _h) in jobs), sum(h for _j, (_n, h) in jobs), _money(money))


def _customer_names(principal: Principal) -> dict[int | None, str]:
    with tenant_context(principal.operator_id):
        return dict(Customer.objects.for_tenant(principal).values_list("pk", "name"))


def _job_labels(principal: Principal, job_pks: list[int]) -> dict[int, tuple[str, str]]:
    """Job pk → (name, customer name) of the jobs shown."""
    if not job_pks:
        return {}
    with tenant_context(principal.operator_id):
        rows = (
            Job.objects.for_tenant(principal)
            .filter(pk__in=job_pks)
            .values_list("pk", "name", "customer__name")
        )
        return {pk: (name or "", customer or "") for pk, name, customer in rows}


def price_page(principal: Principal, period: Period, *, sort: str, page: int) -> PricePage:
    """Everything /price/ shows for the principal over the period (5 queries: list prices,
    the usage per job × GPU model × method, the open verdicts' loss per job, customer names
    (operators), the shown jobs' names). `sort` is one
    of JOB_SORTS (optionally "-"-prefixed) and `page` ≥ 1, both validated by the view; a page
    past the end is empty."""
    with tenant_context(principal.operator_id):
        prices = list_prices(principal.operator_id)
        jobs = _read_jobs(usage_in_period(principal, period))
        losses = open_losses(principal, period)
    fleet = real_price(_collapsed(r for job in jobs.values() for r in job.rows), prices)
    lost = [(job, losses[pk]) for pk, job in jobs.items() if pk in losses]
    fleet_loss = _loss(lost, prices)
    customers: list[CustomerPrice] = []
    if principal.is_operator:
        by_customer: dict[int | None, list[tuple[int, _JobUsage]]] = {}
        for pk, job in jobs.items():
            by_customer.setdefault(job.customer_id, []).append((pk, job))
        names = _customer_names(principal)
        for customer_id, members in by_customer.items():
            name = names.get(customer_id, "(no customer)") if customer_id else "(no customer)"
            customer_loss = _loss([(j, losses[pk]) for pk, j in members if pk in losses], prices)
            customers.append(
                CustomerPrice(
                    customer_id,
                    name,
                    real_price(_collapsed(r for _pk, j in members for r in j.rows), prices),
                    customer_loss if customer_loss.incidents else None,
                )
            )
        customers.sort(key=lambda cp: (-cp.price.gpu_hours, cp.name))
    start = (page - 1) * PAGE_SIZE
    shown = _sorted(jobs, sort, prices)[start : start + PAGE_SIZE]
    labels = _job_labels(principal, shown)
    page_jobs = []
    for pk in shown:
        job = jobs[pk]
        loss = _loss([(job, losses[pk])], prices) if pk in losses else None
        name, customer = labels.get(pk, ("", ""))
        page_jobs.append(
            JobPrice(pk, job.job_id, name, customer, real_price(job.rows, prices), loss)
        )
    return PricePage(
        period=period,
        fleet=fleet,
        fleet_loss=fleet_loss,
        customers=customers,
        jobs=page_jobs,
        jobs_total=len(jobs),
        page=page,
        pages=max(1, -(-len(jobs) // PAGE_SIZE)),
        sort=sort,
        lost_share=(fleet_loss.gpu_hours / fleet.gpu_hours) if fleet.gpu_hours > 0 else 0.0,
    )


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
    "price_between",
    "price_page",
    "usage_between",
    "usage_in_period",
]
