"""Stripe through the real `stripe` library against the local fake: customer and metered
subscription, meter events from the outbox, the retry storm (every call retried, connections
cut before and after Stripe stored the event, 500s) ending with 0 double-billed units, the
reconciliation finding a day that differs, the portal link, and billing staying local with
no key."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connections

from billing import metering, services, stripe_sync
from billing.models import BillingAccount, MeterReport, ReportState
from billing.pricing import days_in_month
from billing.tests.fake_stripe import FakeStripe
from billing.tests.helpers import rollups
from tenants.context import system_context, tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _customer(slug: str) -> Tenant:
    tenant = make_tenant(slug)
    plan = services.do_upsert_plan(
        "metered", name="Metered", price_per_gpu_month=Decimal("60"), stripe_price_id="price_1"
    )
    services.do_assign_plan(tenant.operator.pk, plan)
    stripe_sync.do_ensure_customer(tenant.operator.pk, tenant.operator.name)
    return tenant


def _recent_days(n: int) -> list[date]:
    today = datetime.now(UTC).date()
    return [today - timedelta(days=k) for k in range(n, 0, -1)]


def test_customer_subscription_and_meter_events(fake_stripe: FakeStripe) -> None:
    a = _customer("stripe-a")
    op = a.operator.pk
    # Creating again changes nothing (idempotency keys; ids kept).
    account = stripe_sync.do_ensure_customer(op, a.operator.name)
    assert len(fake_stripe.customers) == 1 and len(fake_stripe.subscriptions) == 1
    [sub] = fake_stripe.subscriptions.values()
    assert sub["customer"] == account.stripe_customer_id
    assert sub["items"]["0"]["price"] == "price_1"

    days = _recent_days(3)
    rollups(op, {"n1": ["G1", "G2"]}, days)
    for day in days:
        metering.do_meter_day(op, day)
    assert stripe_sync.deliver_due() == 3
    with tenant_context(op):
        states = set(MeterReport.objects.for_tenant(op).values_list("state", flat=True))
    assert states == {ReportState.SENT}
    for day in days:
        ident = metering.identifier_for(op, day, 0)
        event = fake_stripe.events[ident]
        assert event["event_name"] == "proof_gpu_month_units"
        assert event["payload"]["stripe_customer_id"] == account.stripe_customer_id
        assert int(event["payload"]["value"]) == 2 * (377_580 // _days(day))
    assert stripe_sync.deliver_due() == 0  # nothing owed any more
    url = stripe_sync.portal_url(op, "http://proof.test/settings/billing/")
    assert url is not None and account.stripe_customer_id in url


def _days(day: date) -> int:
    return days_in_month(day)


def test_retry_storm_bills_every_unit_exactly_once(fake_stripe: FakeStripe) -> None:
    a = _customer("storm-a")
    b = _customer("storm-b")
    days = _recent_days(12)
    for tenant, gpus in ((a, ["A1", "A2", "A3"]), (b, ["B1", "B2"])):
        rollups(tenant.operator.pk, {"n": gpus}, days)
        for day in days:
            metering.do_meter_day(tenant.operator.pk, day)
    # Every kind of failure, over and over: connections cut after Stripe stored the event
    # (the worst case: the sender cannot know), cut before, and 500s; the library retries
    # each call itself, and the outbox retries what still failed.
    fake_stripe.cut_after = 14
    fake_stripe.cut_before = 10
    fake_stripe.fail_5xx = 10
    now = datetime.now(UTC)
    passes = 0
    errors: list[BaseException] = []

    def worker(at: datetime) -> None:
        try:
            stripe_sync.deliver_due(at)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    while passes < 20:
        # Two workers at once: claims never hand one row to both.
        threads = [threading.Thread(target=worker, args=(now,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        passes += 1
        with system_context():
            owed = MeterReport.objects.exclude(state=ReportState.SENT).count()
        if not owed:
            break
        now += timedelta(hours=7)  # past any step of the retry schedule
    assert not errors
    assert owed == 0
    with system_context():
        customers = dict(BillingAccount.objects.values_list("operator_id", "stripe_customer_id"))
        ours: dict[tuple[str, str], int] = {}
        for r in MeterReport.objects.all():
            key = (customers[r.operator_id], f"{r.day:%Y-%m-%d}")
            ours[key] = ours.get(key, 0) + r.units
    accepted = fake_stripe.totals()
    double_billed = sum(accepted.values()) - sum(ours.values())
    calls = fake_stripe.calls["POST /v1/billing/meter_events"]
    print(
        f"retry storm: {calls} meter-event calls, {len(fake_stripe.events)} events accepted, "
        f"{fake_stripe.duplicates_refused} duplicates refused, {passes} outbox passes, "
        f"double-billed units {double_billed}"
    )
    assert accepted == ours and double_billed == 0
    assert len(fake_stripe.events) == 24
    assert calls > 24  # the storm really retried
    assert fake_stripe.duplicates_refused > 0  # a cut-after resend met its own first event


def test_reconciliation_reports_a_day_stripe_lacks(fake_stripe: FakeStripe) -> None:
    a = _customer("recon-a")
    op = a.operator.pk
    days = _recent_days(2)
    rollups(op, {"n": ["G1"]}, days)
    for day in days:
        metering.do_meter_day(op, day)
    stripe_sync.deliver_due()
    month = days[-1].replace(day=1)
    recon = stripe_sync.do_reconcile(op, month)
    assert recon.error == "" and recon.differences == {}
    lost = metering.identifier_for(op, days[-1], 0)
    del fake_stripe.events[lost]
    recon = stripe_sync.do_reconcile(op, month)
    units = 377_580 // _days(days[-1])
    assert recon.differences == {f"{days[-1]:%Y-%m-%d}": {"ours": units, "stripe": 0}}


def test_an_account_metered_locally_gets_its_customer_and_its_reports_sent(
    fake_stripe: FakeStripe, settings: Any
) -> None:
    # Metered while Stripe was not configured: local reports.
    settings.BILLING_STRIPE_SECRET_KEY = None
    a = make_tenant("later-a")
    plan = services.do_upsert_plan(
        "later", name="Later", price_per_gpu_month=Decimal("60"), stripe_price_id="price_1"
    )
    services.do_assign_plan(a.operator.pk, plan)
    day = _recent_days(1)[0]
    rollups(a.operator.pk, {"n": ["G1"]}, [day])
    metering.do_meter_day(a.operator.pk, day)
    # Configured: the next pass creates the customer and sends what was kept locally.
    settings.BILLING_STRIPE_SECRET_KEY = "sk_test_fake"
    assert stripe_sync.deliver_due() == 1
    assert len(fake_stripe.customers) == 1
    assert list(fake_stripe.events) == [metering.identifier_for(a.operator.pk, day, 0)]


def test_without_a_key_billing_stays_local(settings: Any) -> None:
    settings.BILLING_STRIPE_SECRET_KEY = None
    a = make_tenant("local-a")
    rollups(a.operator.pk, {"n": ["G1"]}, _recent_days(1))
    metering.do_meter_day(a.operator.pk, _recent_days(1)[0])
    assert stripe_sync.deliver_due() == 0
    assert stripe_sync.reconcile_all() == 0
    assert stripe_sync.portal_url(a.operator.pk, "http://x/") is None
    with pytest.raises(stripe_sync.StripeNotConfigured, match="local"):
        stripe_sync.configure()
    with tenant_context(a.operator.pk):
        assert MeterReport.objects.for_tenant(a.operator.pk).get().state == ReportState.LOCAL
