"""The local monthly close (a draft invoice from the month's rows, updated while a draft,
never once paid), Stripe's invoice webhook taking it over, and the staff admin's billing
pages under row-level security."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from billing import metering, services
from billing.models import Invoice, InvoiceState
from billing.tests.helpers import days_of, rollups
from tenants.context import tenant_context
from tenants.testing import TEST_PASSWORD, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

FEB = date(2028, 2, 1)


def test_close_month_is_a_draft_until_paid_and_admin_pages_render() -> None:
    a = make_tenant("inv-a")
    op = a.operator.pk
    plan = services.do_upsert_plan("inv", name="Inv", price_per_gpu_month=Decimal("29"))
    services.do_assign_plan(op, plan)
    rollups(op, {"n": ["G1"]}, days_of(FEB)[:20])
    metering.do_meter_range(op, FEB, date(2028, 2, 29))
    draft = services.do_close_month(op, FEB)
    # 20 GPU-days / 29 × 29 USD = 20.00.
    assert (draft.state, draft.gpu_days, draft.amount) == (InvoiceState.DRAFT, 20, Decimal("20.00"))
    assert draft.lines[0]["description"] == "GPU-months"
    # A late day metered: the draft follows it.
    rollups(op, {"n": ["G1"]}, [date(2028, 2, 25)])
    metering.do_meter_day(op, date(2028, 2, 25))
    assert services.do_close_month(op, FEB).gpu_days == 21
    with tenant_context(op):
        Invoice.objects.for_tenant(op).update(state=InvoiceState.PAID)
    rollups(op, {"n": ["G2"]}, [date(2028, 2, 26)])
    metering.do_meter_day(op, date(2028, 2, 26))
    assert services.do_close_month(op, FEB).gpu_days == 21  # paid: never rewritten
    assert services.previous_month(date(2028, 3, 1)) == FEB
    assert services.previous_month(date(2028, 1, 15)) == date(2027, 12, 1)

    get_user_model().objects.create_user(
        username="billing-staff", password=TEST_PASSWORD, is_staff=True, is_superuser=True
    )
    staff = Client()
    assert staff.login(username="billing-staff", password=TEST_PASSWORD)
    for page in ("plan", "billingaccount", "dailyusage", "meterreport", "invoice"):
        response = staff.get(f"/admin/billing/{page}/")
        assert response.status_code == 200, page
    assert "G1" in staff.get("/admin/billing/dailyusage/").content.decode()
