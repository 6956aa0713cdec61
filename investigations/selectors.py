"""Reads of the live pipeline: what the fan-out evaluates, incidents, the real price."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import F, Q, QuerySet

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
