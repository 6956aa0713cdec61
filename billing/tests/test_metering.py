"""Metering: immutable daily rows per (operator, GPU uuid, day) from the stored rollups, month
boundaries, a leap February, a GPU moving between nodes, a node re-registered, late data as a
new revision, recomputation, another tenant's GPUs never counted; the plan's price."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from billing import metering, selectors, services
from billing.models import DailyUsage, ImmutableRow, MeterReport, ReportState
from billing.pricing import PlanTerms, gpu_months, price_month
from billing.tests.helpers import days_of, rollups, stream
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def test_leap_february_and_month_boundaries() -> None:
    a = make_tenant("meter-a")
    b = make_tenant("meter-b")
    op = a.operator.pk
    feb = date(2028, 2, 1)
    # Two GPUs every day of February 2028 (29 days), a third only on Feb 29 and Mar 1; the
    # other operator has GPUs with the same UUIDs (uuids are per operator).
    rollups(op, {"node-1": ["GPU-a", "GPU-b"]}, days_of(feb))
    rollups(op, {"node-2": ["GPU-c"]}, [date(2028, 2, 29), date(2028, 3, 1)])
    rollups(b.operator.pk, {"node-1": ["GPU-a", "GPU-b", "GPU-z"]}, [date(2028, 2, 29)])
    for day in [*days_of(feb), date(2028, 3, 1)]:
        metering.do_meter_day(op, day)
    counts = selectors.day_counts(op, feb)
    assert len(counts) == 29 and sum(counts.values()) == 2 * 29 + 1
    assert counts[date(2028, 2, 29)] == 3
    assert selectors.day_counts(op, date(2028, 3, 1)) == {date(2028, 3, 1): 1}
    # GPU-months = GPU-days / 29: 59 / 29.
    assert gpu_months(59, feb) == Decimal(59) / Decimal(29)
    # A meter report per day; a GPU-day of February is 377,580 / 29 = 13,020 units and a whole
    # month of one GPU is exactly 377,580.
    feb29 = MeterReport.objects.filter(operator_id=op, day=date(2028, 2, 29))
    with tenant_context(op):
        [report] = list(feb29)
        assert (report.gpu_days, report.units, report.revision) == (3, 3 * 13_020, 0)
        assert report.identifier == f"proof-op{op}-2028-02-29-r0"
        assert report.state == ReportState.LOCAL  # no Stripe configured: local
        total = sum(r.units for r in MeterReport.objects.for_tenant(op).filter(day__month=2))
    assert total == 59 * 13_020 and 29 * 13_020 == 377_580
    # The other operator's GPUs never reach this one's rows.
    assert selectors.day_counts(b.operator.pk, feb) == {}


def test_moved_gpu_and_reregistered_node_count_once_and_late_data_is_a_new_revision() -> None:
    a = make_tenant("meter-move")
    op = a.operator.pk
    now = datetime.now(UTC)
    day = now.date()
    start = datetime.combine(day, datetime.min.time(), UTC).timestamp() + 60
    # GPU-x runs on node-1, then moves to node-2 the same day; node-1's agent re-registers
    # (re-imaged: a new agent id) and reports GPU-y.
    stream(op, "agent-1", "node-1", "GPU-x", start)
    stream(op, "agent-2", "node-2", "GPU-x", start + 30)
    result = metering.do_meter_day(op, day)
    assert result.new_rows == 1
    with tenant_context(op):
        [row] = DailyUsage.objects.for_tenant(op).filter(day=day)
    assert (row.gpu, row.nodes) == ("GPU-x", ["node-1", "node-2"])
    stream(op, "agent-1-reimaged", "node-1", "GPU-y", start + 60)
    # Metering again: only the GPU not yet counted, as revision 1; nothing counted twice.
    again = metering.do_meter_day(op, day)
    assert again.new_rows == 1
    assert metering.do_meter_day(op, day).new_rows == 0
    with tenant_context(op):
        reports = list(MeterReport.objects.for_tenant(op).filter(day=day).order_by("revision"))
        assert [(r.revision, r.gpu_days) for r in reports] == [(0, 1), (1, 1)]
        assert DailyUsage.objects.for_tenant(op).filter(day=day).count() == 2


def test_rows_are_immutable_and_recomputation_changes_nothing() -> None:
    a = make_tenant("meter-imm")
    op = a.operator.pk
    month = date(2027, 11, 1)
    rollups(op, {"node-1": ["GPU-1", "GPU-2"]}, days_of(month)[:10])
    first = metering.do_meter_range(op, month, date(2027, 11, 30))
    assert sum(r.new_rows for r in first) == 20
    again = metering.do_meter_range(op, month, date(2027, 11, 30))
    assert sum(r.new_rows for r in again) == 0
    with tenant_context(op):
        row = DailyUsage.objects.for_tenant(op).first()
        assert row is not None
        row.gpu_model = "changed"
        with pytest.raises(ImmutableRow):
            row.save()
        if transaction.get_connection().vendor == "postgresql":
            with pytest.raises(Exception, match="immutable"), transaction.atomic():
                DailyUsage.objects.for_tenant(op).update(gpu_model="changed")
        # One row per (operator, GPU, day), whatever inserts it.
        with pytest.raises(IntegrityError), transaction.atomic():
            DailyUsage.objects.create(operator_id=op, day=month, gpu="GPU-1", nodes=[])


def test_days_due_are_complete_days_within_the_lookback() -> None:
    now = datetime(2028, 3, 1, 0, 30, tzinfo=UTC)
    # 00:30: Feb 29 has not settled (its last hour's rollup is 1 h behind): up to Feb 28.
    assert metering.days_due(now)[-1] == date(2028, 2, 28)
    later = metering.days_due(now + timedelta(hours=1))
    assert later[-1] == date(2028, 2, 29) and len(later) == metering.LOOKBACK_DAYS


def test_plan_tiers_minimum_trial_and_override() -> None:
    month = date(2028, 2, 1)
    terms = PlanTerms(
        "USD",
        Decimal("60"),
        tiers=[{"up_to": 10, "price": "60"}, {"up_to": None, "price": "40"}],
        minimum_monthly=Decimal("500"),
    )
    # 29 GPUs all month = 29 GPU-months: 10 × 60 + 19 × 40 = 1,360.
    priced = price_month(month, {d: 29 for d in days_of(month)}, terms)
    assert priced.gpu_months == 29 and priced.total == Decimal("1360.00")
    # One GPU for 29 days = 1 GPU-month = 60, below the 500 minimum: topped up.
    small = price_month(month, {d: 1 for d in days_of(month)}, terms)
    assert small.total == Decimal("500.00")
    assert small.lines[-1].description == "Minimum monthly commitment"
    # A trial to Feb 14: those days are free, and no minimum in a trial month.
    trial = PlanTerms("USD", Decimal("60"), trial_ends_on=date(2028, 2, 14))
    t = price_month(month, {d: 29 for d in days_of(month)}, trial)
    assert t.billable_gpu_days == 29 * 15 and t.total == Decimal("900.00")

    a = make_tenant("meter-plan")
    plan = services.do_upsert_plan(
        "standard", name="Standard", price_per_gpu_month=Decimal("60"), tiers=terms.tiers
    )
    services.do_assign_plan(a.operator.pk, plan, price_override=Decimal("50"))
    rollups(a.operator.pk, {"n": ["G1", "G2"]}, days_of(month))
    metering.do_meter_range(a.operator.pk, month, date(2028, 2, 29))
    # The override replaces the tiers: 2 GPU-months × 50.
    assert selectors.priced_month(a.operator.pk, month).total == Decimal("100.00")
    with pytest.raises(services.BillingError, match="last tier"):
        services.do_upsert_plan(
            "bad",
            name="Bad",
            price_per_gpu_month=Decimal(1),
            tiers=[{"up_to": None, "price": "1"}, {"up_to": 5, "price": "1"}],
        )
