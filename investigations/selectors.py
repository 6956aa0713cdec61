"""Reads of the live pipeline: what the fan-out evaluates, incidents, the real price (of
everything, or over a period: the console's /price/ and /fleet/ and the real-price API read the
same functions here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Case, F, FloatField, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Greatest, Least

from ingest import selectors as ingest_selectors
from investigations.models import GpuListPrice, JobActivity, JobGpuUsage
from investigations.pricing import RealPrice, UsageRow, real_price
from tenants.access import Principal
from tenants.context import system_context, tenant_context

# GPUs registered or seen by an agent in the last day get a fleet-health evaluation.
FLEET_ACTIVE = timedelta(days=1)


def jobs_due_for_evaluation(
    active_s: float, routine_s: float = 0.0, now: datetime | None = None
) -> list[tuple[int, int]]:
    """(operator id, job pk) of every job, of every operator, that stored data in the last
    `active_s` seconds and has data its last evaluation did not see — never evaluated, or
    evaluated more than `routine_s` seconds ago. Cross-tenant on purpose (the periodic
    fan-out): ids only."""
    now = now or datetime.now(UTC)
    with system_context():
        rows = JobActivity.objects.filter(
            received_at__gte=now - timedelta(seconds=active_s)
        ).filter(
            Q(evaluated_through_ts__isnull=True)
            | Q(
                last_data_ts__gt=F("evaluated_through_ts"),
                evaluated_at__lte=now - timedelta(seconds=routine_s),
            )
        )
        return [(int(o), int(j)) for o, j in rows.values_list("operator_id", "job_id")]


def gpus_due_for_fleet_health(now: datetime | None = None) -> list[tuple[int, str]]:
    """(operator id, GPU uuid) of every GPU an agent reported in the last day."""
    now = now or datetime.now(UTC)
    return ingest_selectors.gpus_seen_since(now - FLEET_ACTIVE)


def nodes_due_for_fleet_health(now: datetime | None = None) -> list[tuple[int, str]]:
    """(operator id, hostname) of every node with a GPU an agent reported in the last day:
    the fleet-health pass evaluates each node's GPUs from one read of the node's data."""
    now = now or datetime.now(UTC)
    return ingest_selectors.nodes_with_gpus_seen_since(now - FLEET_ACTIVE)


def list_prices(operator_id: int) -> dict[str, tuple[Decimal, str]]:
    return {
        p.gpu_model: (p.price_per_gpu_hour, p.currency)
        for p in GpuListPrice.objects.for_tenant(operator_id)
    }


def _rows(qs: QuerySet[JobGpuUsage]) -> list[UsageRow]:
    return [
        UsageRow(m, g, c, w, i, method)
        for m, g, c, w, i, method in qs.values_list(
            "gpu_model", "gpu_seconds", "compute_seconds", "wait_seconds", "idle_seconds", "method"
        )
    ]


def real_price_for(
    principal: Principal,
    *,
    job_pk: int | None = None,
    customer_id: int | None = None,
    gpu: str | None = None,
) -> RealPrice:
    """The real price of one job, one customer's jobs, one GPU, or (no filter) every job the
    principal may see — the fleet for an operator, its own jobs for a customer."""
    with tenant_context(principal.operator_id):
        qs = JobGpuUsage.objects.for_tenant(principal)
        if job_pk is not None:
            qs = qs.filter(job_id=job_pk)
        if customer_id is not None:
            qs = qs.filter(job__customer_id=customer_id)
        if gpu is not None:
            qs = qs.filter(gpu=gpu)
        return real_price(_rows(qs), list_prices(principal.operator_id))


def usage_by_customer(principal: Principal) -> dict[int | None, RealPrice]:
    """The real price per customer (None: jobs not attributed to a customer)."""
    with tenant_context(principal.operator_id):
        prices = list_prices(principal.operator_id)
        qs = JobGpuUsage.objects.for_tenant(principal)
        customers = set(qs.values_list("job__customer_id", flat=True).distinct())
        return {c: real_price(_rows(qs.filter(job__customer_id=c)), prices) for c in customers}


# --- the real price over a period --------------------------------------------------------------
# Usage rows are cumulative per (job, GPU) with the first and last sample time they count; a row
# that straddles the period's edge is counted pro rata of its sampled span inside the period
# (GPU time spread evenly over the span).


def _share_between(t0: float, t1: float) -> Any:
    """Share of a usage row's sampled span [first_ts, last_ts] inside [t0, t1) (1 for a row
    of one sample, which lies inside by the filter)."""
    span = F("last_ts") - F("first_ts")
    overlap = Least(F("last_ts"), Value(t1)) - Greatest(F("first_ts"), Value(t0))
    return Case(
        When(last_ts__gt=F("first_ts"), then=Greatest(overlap, Value(0.0)) / span),
        default=Value(1.0),
        output_field=FloatField(),
    )


def usage_between(principal: Principal, t0: float, t1: float) -> QuerySet[JobGpuUsage]:
    """The usage rows the principal may see that overlap [t0, t1), each with `part`: the share
    of it inside (inside the caller's tenant context)."""
    return (
        JobGpuUsage.objects.for_tenant(principal)
        .filter(first_ts__lt=t1, last_ts__gte=t0)
        .annotate(part=_share_between(t0, t1))
    )


def part_seconds(field: str) -> Sum:
    """The sum of a usage field counted pro rata of each row's `part` (usage_between)."""
    return Sum(F(field) * F("part"), output_field=FloatField())


def usage_rows(values: Any) -> list[tuple[Any, UsageRow]]:
    """(key, UsageRow) of grouped_usage's tuples."""
    return [
        (key, UsageRow(model or "", g or 0.0, c or 0.0, w or 0.0, i or 0.0, method or ""))
        for key, model, method, g, c, w, i in values
    ]


def grouped_usage(qs: QuerySet[JobGpuUsage], key: str) -> Any:
    """(key, model, method, gpu s, compute s, wait s, idle s) per key, model and method."""
    return (
        qs.values(key, "gpu_model", "method")
        .annotate(
            g=part_seconds("gpu_seconds"),
            c=part_seconds("compute_seconds"),
            w=part_seconds("wait_seconds"),
            i=part_seconds("idle_seconds"),
        )
        .order_by()
        .values_list(key, "gpu_model", "method", "g", "c", "w", "i")
    )


def price_between(
    principal: Principal,
    t0: float,
    t1: float,
    *,
    job_pk: int | None = None,
    customer_id: int | None = None,
    gpu: str | None = None,
) -> RealPrice:
    """The real price of everything the principal may see over [t0, t1), or of one job, one
    customer's jobs or one GPU (2 queries: the list prices, one GROUP BY of the usage)."""
    with tenant_context(principal.operator_id):
        prices = list_prices(principal.operator_id)
        qs = usage_between(principal, t0, t1)
        if job_pk is not None:
            qs = qs.filter(job_id=job_pk)
        if customer_id is not None:
            qs = qs.filter(job__customer_id=customer_id)
        if gpu is not None:
            qs = qs.filter(gpu=gpu)
        grouped = grouped_usage(qs, "gpu_model")
        return real_price([row for _key, row in usage_rows(grouped)], prices)
