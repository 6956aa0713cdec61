"""Billing's reads: a month's usage (per day, per GPU), its priced invoice and projection, the
operator's chargeback per customer, the account and its invoices."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal

from django.db.models import Count

from billing.models import BillingAccount, DailyUsage, Invoice, MeterReport, Reconciliation
from billing.pricing import PlanTerms, Priced, days_in_month, next_month, price_month
from ingest import selectors as ingest_selectors
from investigations import selectors as inv_selectors
from investigations.pricing import UsageRow, real_price
from tenants.access import Principal
from tenants.context import tenant_context
from tenants.selectors import customer_names

# With no account (the operator was never given a plan), usage is still metered and shown at
# this price, so a projection is never missing; docs/billing.md.
DEFAULT_TERMS = PlanTerms(currency="USD", price_per_gpu_month=Decimal("0"))


def account_for(operator_id: int) -> BillingAccount | None:
    with tenant_context(operator_id):
        return BillingAccount.objects.for_tenant(operator_id).select_related("plan").first()


def terms_for(account: BillingAccount | None) -> PlanTerms:
    if account is None:
        return DEFAULT_TERMS
    plan = account.plan
    return PlanTerms(
        currency=plan.currency,
        price_per_gpu_month=(
            account.price_override
            if account.price_override is not None
            else plan.price_per_gpu_month
        ),
        # An overridden price replaces the plan's tiers: the override is the deal.
        tiers=[] if account.price_override is not None else list(plan.tiers or []),
        minimum_monthly=(
            account.minimum_override
            if account.minimum_override is not None
            else plan.minimum_monthly
        ),
        trial_ends_on=account.trial_ends_on,
    )


def day_counts(operator_id: int, month: date) -> dict[date, int]:
    """GPUs billed per day of the month (one GROUP BY)."""
    with tenant_context(operator_id):
        rows = (
            DailyUsage.objects.for_tenant(operator_id)
            .filter(day__gte=month, day__lt=next_month(month))
            .values("day")
            .annotate(n=Count("id"))
            .order_by("day")
            .values_list("day", "n")
        )
        return {d: int(n) for d, n in rows}


@dataclass(frozen=True)
class GpuLine:
    gpu: str
    gpu_model: str
    days: int
    nodes: list[str]
    first_day: date
    last_day: date


# GPUs a page of a month's usage lines shows: a 10,000-GPU fleet's month is 310,000 usage rows,
# never read whole for a page.
GPU_LINES_PAGE = 100


@dataclass(frozen=True)
class GpuLinesPage:
    lines: list[GpuLine]
    after: str  # the page starts after this GPU ("": the first page)
    next_after: str | None  # the last GPU shown, when more follow


def _merged_lines(rows: Iterable[tuple[str, str, date, list[str]]]) -> list[GpuLine]:
    """GPU lines from usage rows ordered by GPU, then day."""
    lines: dict[str, GpuLine] = {}
    for gpu, model, day, nodes in rows:
        line = lines.get(gpu)
        if line is None:
            lines[gpu] = GpuLine(gpu, model, 1, list(nodes), day, day)
        else:
            merged = line.nodes + [n for n in nodes if n not in line.nodes]
            lines[gpu] = GpuLine(
                gpu, line.gpu_model or model, line.days + 1, merged, line.first_day, day
            )
    return list(lines.values())


def gpu_lines(operator_id: int, month: date) -> list[GpuLine]:
    """The usage behind a month's invoice, every GPU: its days and where it ran (the signed
    usage report's; the console pages them, gpu_lines_page)."""
    with tenant_context(operator_id):
        return _merged_lines(
            DailyUsage.objects.for_tenant(operator_id)
            .filter(day__gte=month, day__lt=next_month(month))
            .order_by("gpu", "day")
            .values_list("gpu", "gpu_model", "day", "nodes")
        )


def gpu_lines_page(
    operator_id: int, month: date, after: str = "", limit: int | None = None
) -> GpuLinesPage:
    """`limit` of a month's GPU lines in UUID order from the GPU after `after` (keyset pages:
    the unique (operator, gpu, day) index is read in GPU order from there and stops at the
    page's GPUs, so a page costs the same at any depth and any fleet size). One query: the
    page's GPUs, one more to know whether others follow, as a subquery of their rows."""
    limit = limit or GPU_LINES_PAGE
    with tenant_context(operator_id):
        usage = DailyUsage.objects.for_tenant(operator_id).filter(
            day__gte=month, day__lt=next_month(month)
        )
        page_gpus = (
            usage.filter(gpu__gt=after)
            .order_by("gpu")
            .values_list("gpu", flat=True)
            .distinct()[: limit + 1]
        )
        shown = _merged_lines(
            usage.filter(gpu__in=page_gpus)
            .order_by("gpu", "day")
            .values_list("gpu", "gpu_model", "day", "nodes")
        )
    more = len(shown) > limit
    shown = shown[:limit]
    return GpuLinesPage(shown, after, shown[-1].gpu if more and shown else None)


def priced_month(operator_id: int, month: date) -> Priced:
    return price_month(month, day_counts(operator_id, month), terms_for(account_for(operator_id)))


@dataclass(frozen=True)
class Projection:
    priced: Priced  # the month as metered so far
    projected: Priced  # … with today's GPUs carried to the month's end
    gpus_today: int


def projection(
    operator_id: int, today: date | None = None, account: BillingAccount | None = None
) -> Projection:
    """This month so far (metered days), plus today's GPUs counted for today and each day left:
    the GPUs the inventory saw today (ingest moves a GPU's last_seen_at with every batch that
    carries its samples), or today's metered count once there is one. Not today's rollups, as
    the day's metering reads them: on a 10,000-GPU fleet that read is every series of the day
    (350,000 buckets by the morning, 50,000 series ids) — 1.7 s of the page on the console
    bench — for a count the inventory gives from one index (a few ms), and the rollups lag the
    inventory by up to 15 minutes anyway."""
    today = today or datetime.now(UTC).date()
    month = today.replace(day=1)
    counts = day_counts(operator_id, month)
    start = datetime.combine(today, time(0), tzinfo=UTC)
    seen = ingest_selectors.gpus_seen_count(operator_id, start)
    gpus_today = max(seen, counts.get(today, 0))
    projected = dict(counts)
    for k in range(today.day, days_in_month(month) + 1):
        day = month.replace(day=k)
        projected[day] = max(projected.get(day, 0), gpus_today)
    terms = terms_for(account if account is not None else account_for(operator_id))
    return Projection(
        price_month(month, counts, terms), price_month(month, projected, terms), gpus_today
    )


def invoices(operator_id: int, limit: int = 24) -> list[Invoice]:
    with tenant_context(operator_id):
        return list(Invoice.objects.for_tenant(operator_id).order_by("-month")[:limit])


def reports_of_month(operator_id: int, month: date) -> list[MeterReport]:
    with tenant_context(operator_id):
        return list(
            MeterReport.objects.for_tenant(operator_id)
            .filter(day__gte=month, day__lt=next_month(month))
            .order_by("day", "revision")
        )


def latest_reconciliation(operator_id: int) -> Reconciliation | None:
    with tenant_context(operator_id):
        return Reconciliation.objects.for_tenant(operator_id).first()


# --- chargeback: the operator's own customers ----------------------------------------------


@dataclass(frozen=True)
class CustomerUsage:
    customer_id: int | None
    customer: str
    gpus: int
    gpu_hours: float
    productive_share: float | None
    list_cost: Decimal | None
    effective_price: Decimal | None
    currency: str | None


def chargeback(principal: Principal, month: date) -> list[CustomerUsage]:
    """Per customer of the operator, over the month: GPUs used, GPU-hours, productive share,
    the list cost and the real price per productive GPU-hour (investigations' accounting,
    docs/pricing.md). Operator principals only (a customer sees none)."""
    if principal.customer_id is not None:
        return []
    t0 = datetime.combine(month, time(0), tzinfo=UTC).timestamp()
    t1 = datetime.combine(next_month(month), time(0), tzinfo=UTC).timestamp()
    with tenant_context(principal.operator_id):
        prices = inv_selectors.list_prices(principal.operator_id)
        qs = inv_selectors.usage_between(principal, t0, t1)
        grouped = inv_selectors.usage_rows(inv_selectors.grouped_usage(qs, "job__customer_id"))
        gpus: dict[int | None, int] = dict(
            qs.values("job__customer_id")
            .annotate(n=Count("gpu", distinct=True))
            .order_by()
            .values_list("job__customer_id", "n")
        )
        names = customer_names(principal.operator_id)
    by_customer: dict[int | None, list[UsageRow]] = {}
    for key, row in grouped:
        by_customer.setdefault(key, []).append(row)
    out = []
    for key, rows in by_customer.items():
        price = real_price(rows, prices)
        out.append(
            CustomerUsage(
                key,
                "(no customer)" if key is None else names.get(key, "(no customer)"),
                int(gpus.get(key) or 0),
                price.gpu_hours,
                price.productive_share,
                price.list_cost,
                price.effective_price_per_productive_gpu_hour,
                price.currency,
            )
        )
    return sorted(out, key=lambda c: (-c.gpu_hours, c.customer))


CHARGEBACK_COLUMNS = [
    "month",
    "customer",
    "gpus",
    "gpu_hours",
    "productive_share",
    "list_cost",
    "real_price_per_productive_gpu_hour",
    "currency",
]


def chargeback_csv(principal: Principal, month: date) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CHARGEBACK_COLUMNS)
    for c in chargeback(principal, month):
        writer.writerow(
            [
                f"{month:%Y-%m}",
                c.customer,
                c.gpus,
                f"{c.gpu_hours:.4f}",
                "" if c.productive_share is None else f"{c.productive_share:.4f}",
                "" if c.list_cost is None else str(c.list_cost),
                "" if c.effective_price is None else str(c.effective_price),
                c.currency or "",
            ]
        )
    return buf.getvalue()


# --- the console's /settings/billing/ ------------------------------------------------------


@dataclass(frozen=True)
class BillingPage:
    account: BillingAccount | None
    projection: Projection
    month: date  # the month whose usage is shown line by line
    month_priced: Priced
    lines: GpuLinesPage
    reports: list[MeterReport]
    invoices: list[Invoice]
    reconciliation: Reconciliation | None
    chargeback: list[CustomerUsage]


def billing_page(
    principal: Principal, month: date | None, today: date | None = None, after: str = ""
) -> BillingPage:
    """Everything /settings/billing/ shows, read in one tenant context (operator principals)."""
    today = today or datetime.now(UTC).date()
    shown = month or today.replace(day=1)
    op = principal.operator_id
    with tenant_context(op):
        account = account_for(op)
        proj = projection(op, today, account)
        priced = proj.priced if shown == today.replace(day=1) else priced_month(op, shown)
        return BillingPage(
            account=account,
            projection=proj,
            month=shown,
            month_priced=priced,
            lines=gpu_lines_page(op, shown, after),
            reports=reports_of_month(op, shown),
            invoices=invoices(op),
            reconciliation=latest_reconciliation(op),
            chargeback=chargeback(principal, shown),
        )


def current_month(today: date | None = None) -> date:
    return (today or datetime.now(UTC).date()).replace(day=1)
