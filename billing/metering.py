"""Metering: the immutable daily usage rows and the meter reports owed for them.

A GPU counts for a UTC day when any agent of the operator reported it that day: it has a
sample in one of ingest's hourly rollups of that day (ingest.selectors.gpus_reported_between;
docs/billing.md says why rollups). Rows are inserted once per (operator, GPU, day) and never
changed; metering a day again inserts only GPUs it did not have (late data), and those new rows
get a meter report of their own (the next revision), so a unit is reported once, forever.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max

from billing.models import (
    BillingAccount,
    DailyUsage,
    MeterReport,
    ReportState,
    units_per_gpu_day,
)
from billing.pricing import days_in_month
from ingest import selectors as ingest_selectors
from tenants import selectors as tenant_selectors
from tenants.context import tenant_context

log = logging.getLogger(__name__)

# A day is metered once it has ended and its last hour's rollup is built (ingest rolls the last
# 3 hours every 15 min): 1 h after midnight UTC. Each pass re-meters the last 7 days for late
# data (an agent's spool shipped after an outage), well inside Stripe's 35-day window.
SETTLE = timedelta(hours=1)
LOOKBACK_DAYS = 7


def day_bounds_ms(day: date) -> tuple[int, int]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return int(start.timestamp() * 1000), int((start + timedelta(days=1)).timestamp() * 1000)


def identifier_for(operator_id: int, day: date, revision: int) -> str:
    """Stripe's dedupe key for one report: derived from (operator, month, day, revision) only,
    so every retry of it, from any worker, carries the same one (≤ 100 characters)."""
    return f"proof-op{operator_id}-{day:%Y-%m}-{day:%d}-r{revision}"


def stripe_enabled() -> bool:
    return bool(settings.BILLING_STRIPE_SECRET_KEY)


@dataclass(frozen=True)
class DayResult:
    day: date
    new_rows: int
    report: int | None  # the MeterReport written for them


def do_meter_day(operator_id: int, day: date, now: datetime | None = None) -> DayResult:
    """Insert the day's usage rows not yet there, and the meter report owed for them, in one
    transaction (the report is the outbox row of the Stripe event)."""
    now = now or datetime.now(UTC)
    t0, t1 = day_bounds_ms(day)
    reported = ingest_selectors.gpus_reported_between(operator_id, t0, t1)
    try:
        with transaction.atomic(), tenant_context(operator_id):
            have = set(
                DailyUsage.objects.for_tenant(operator_id)
                .filter(day=day)
                .values_list("gpu", flat=True)
            )
            new = sorted(set(reported) - have)
            if not new:
                return DayResult(day, 0, None)
            last = (
                MeterReport.objects.for_tenant(operator_id)
                .filter(day=day)
                .aggregate(m=Max("revision"))["m"]
            )
            revision = 0 if last is None else last + 1
            account = BillingAccount.objects.for_tenant(operator_id).first()
            to_stripe = stripe_enabled() and account is not None and account.stripe_customer_id
            report = MeterReport.objects.create(
                operator_id=operator_id,
                day=day,
                revision=revision,
                gpu_days=len(new),
                units=len(new) * units_per_gpu_day(days_in_month(day)),
                identifier=identifier_for(operator_id, day, revision),
                state=ReportState.PENDING if to_stripe else ReportState.LOCAL,
                next_attempt_at=now,
            )
            DailyUsage.objects.bulk_create(
                [
                    DailyUsage(
                        operator_id=operator_id,
                        day=day,
                        gpu=gpu,
                        gpu_model=reported[gpu][0],
                        nodes=sorted(reported[gpu][1]),
                        report=report,
                    )
                    for gpu in new
                ]
            )
            return DayResult(day, len(new), int(report.pk))
    except IntegrityError:
        # Another metering pass of the same day committed first: its rows stand, and the
        # next pass picks up anything it lacked.
        log.info("metering of operator %s day %s raced another pass; skipped", operator_id, day)
        return DayResult(day, 0, None)


def days_due(now: datetime) -> list[date]:
    """The completed days a pass meters: the last LOOKBACK_DAYS that ended SETTLE ago."""
    last = (now - SETTLE).date() - timedelta(days=1)
    return [last - timedelta(days=k) for k in range(LOOKBACK_DAYS)][::-1]


def do_meter_operator(operator_id: int, days: list[date]) -> list[DayResult]:
    return [do_meter_day(operator_id, day) for day in days]


def meter_all(now: datetime | None = None) -> int:
    """The periodic pass over every operator; the rows inserted."""
    now = now or datetime.now(UTC)
    days = days_due(now)
    total = 0
    for operator_id in tenant_selectors.operator_ids():
        total += sum(r.new_rows for r in do_meter_operator(operator_id, days))
    return total


def do_meter_range(operator_id: int, first: date, last: date) -> list[DayResult]:
    """Recompute from stored data (the rollups): every day in [first, last]. Existing rows
    stand; only what they lack is inserted."""
    days = [first + timedelta(days=k) for k in range((last - first).days + 1)]
    return do_meter_operator(operator_id, days)
