"""/settings/billing/: this month's GPUs and projection, invoices, the usage behind each line,
chargeback CSV; operator admins only (support, a customer admin of the same operator and
another operator refused); the past-due / paused banner on every console page for operator
users only; the page's query count pinned."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from billing import metering, selectors, services
from billing.bench import MODEL
from billing.models import Invoice, InvoiceState
from billing.tests.helpers import days_of, rollups
from frontend.tests.settings_helpers import BASE_QUERIES, sign_in
from ingest import services as ingest_services
from tenants.context import tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/settings/billing/"
# Pinned: a page that read per GPU or per day would grow with the fleet.
MAX_QUERIES = BASE_QUERIES + 9  # 20 measured: 9 of the page itself


def _world() -> tuple[Tenant, Tenant]:
    cache.clear()
    a = make_tenant("bill-a")
    b = make_tenant("bill-b")
    plan = services.do_upsert_plan("std", name="Standard", price_per_gpu_month=Decimal("60"))
    services.do_assign_plan(a.operator.pk, plan)
    today = datetime.now(UTC).date()
    month = today.replace(day=1)
    past = [d for d in days_of(month) if d < today]
    rollups(a.operator.pk, {"node-1": ["GPU-A1", "GPU-A2"]}, [*past, today])
    rollups(b.operator.pk, {"node-9": ["GPU-B-SECRET"]}, [today])
    # Their agents report now: today's GPUs are the inventory's (ingest moves last_seen_at).
    for op, node, gpus in ((a, "node-1", ["GPU-A1", "GPU-A2"]), (b, "node-9", ["GPU-B-SECRET"])):
        ingest_services.register_agent(
            op.operator.pk,
            agent_id=f"agent-{node}",
            hostname=node,
            agent_version="test",
            gpus=[{"uuid": g, "index": k, "model": MODEL} for k, g in enumerate(gpus)],
        )
    for d in past:
        metering.do_meter_day(a.operator.pk, d)
    last = (month - timedelta(days=1)).replace(day=1)
    with tenant_context(a.operator.pk):
        Invoice.objects.create(
            operator_id=a.operator.pk,
            month=last,
            gpu_days=62,
            gpu_months=Decimal("2"),
            amount=Decimal("120.00"),
            currency="USD",
            state=InvoiceState.PAID,
            hosted_url="https://invoice.example.test/in_1",
        )
    return a, b


def test_operator_admin_sees_usage_projection_invoices_and_lines(settings: Any) -> None:
    settings.BILLING_STRIPE_SECRET_KEY = None
    a, _b = _world()
    client = sign_in(Client(), a.operator_admin)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(URL)
    assert response.status_code == 200
    print(f"/settings/billing/: {len(queries)} queries")
    assert len(queries) <= MAX_QUERIES, len(queries)
    html = response.content.decode()
    assert 'data-testid="gpus-today">2<' in html
    # Projection: 2 GPUs every day of the month at 60 per GPU-month = 120.
    assert 'data-testid="projected">$120.00<' in html
    assert "GPU-A1" in html and "GPU-B-SECRET" not in html
    assert "Billing is local" in html  # no Stripe key: it says so
    assert "https://invoice.example.test/in_1" in html
    csv = client.get("/settings/billing/chargeback.csv")
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    assert csv.content.decode().startswith("month,customer,gpus")
    assert client.get(URL + "?month=2028-13").status_code == 400


def test_usage_lines_are_paged_by_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A month's GPU lines come a page at a time (keyset on the UUID): a 10,000-GPU month is
    310,000 usage rows, never read for one page; the query count stays the page's."""
    a, _b = _world()
    monkeypatch.setattr(selectors, "GPU_LINES_PAGE", 1)
    client = sign_in(Client(), a.operator_admin)
    with CaptureQueriesContext(connection) as queries:
        first = client.get(URL).content.decode()
    assert len(queries) <= MAX_QUERIES, len(queries)
    lines = first[first.index('data-testid="billing-gpus"') :]
    assert "GPU-A1" in lines and "GPU-A2" not in lines
    assert 'href="?month=' in lines and "after=GPU-A1" in lines
    month = datetime.now(UTC).date().strftime("%Y-%m")
    second = client.get(f"{URL}?month={month}&after=GPU-A1").content.decode()
    lines = second[second.index('data-testid="billing-gpus"') :]
    assert "GPU-A2" in lines and "GPU-A1" not in lines
    assert 'data-testid="billing-gpus-next"' not in second  # the last page
    past = client.get(f"{URL}?after=GPU-A2").content.decode()
    assert 'data-testid="billing-gpus"' not in past and "No GPU after GPU-A2" in past
    assert client.get(URL + "?after=" + "x" * 97).status_code == 400


def test_support_customer_and_other_operator_are_refused() -> None:
    a, b = _world()
    for user in (a.operator_support, a.customer_admin):
        client = sign_in(Client(), user)
        assert client.get(URL).status_code == 404
        assert client.get("/settings/billing/chargeback.csv").status_code == 404
    # Another operator's admin sees its own (empty) billing, never a's GPUs.
    other = sign_in(Client(), b.operator_admin).get(URL)
    assert other.status_code == 200 and "GPU-A1" not in other.content.decode()
    assert Client().get(URL).status_code == 302  # signed out: to the login page


def test_banner_for_past_due_and_paused_on_every_page_for_operator_users_only() -> None:
    a, b = _world()
    services.do_mark_past_due(a.operator.pk, "invoice in_1 payment failed")
    admin = sign_in(Client(), a.operator_admin)
    page = admin.get("/jobs/").content.decode()
    assert 'data-testid="billing-banner"' in page and "Payment overdue since" in page
    services.do_pause(a.operator.pk, "payment overdue, grace period over")
    page = admin.get("/incidents/").content.decode()
    assert "New verdicts are paused" in page and "grace period over" in page
    assert "Telemetry is still collected" in page
    customer = sign_in(Client(), a.customer_admin).get("/jobs/").content.decode()
    assert 'data-testid="billing-banner"' not in customer
    other = sign_in(Client(), b.operator_admin).get("/jobs/").content.decode()
    assert 'data-testid="billing-banner"' not in other
    services.do_mark_paid(a.operator.pk)
    assert 'data-testid="billing-banner"' not in admin.get("/jobs/").content.decode()
