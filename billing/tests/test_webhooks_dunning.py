"""Stripe's webhooks at /billing/stripe/webhook/, signed as Stripe signs them (t=…,v1=HMAC-SHA256
of "t.payload"), processed once per event id; dunning: past_due → grace → verdicts paused
(ingest goes on) → paid → the paused period evaluated and verdicts flowing again."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from billing import services, stripe_sync, tasks
from billing.models import AccountState, BillingAccount, Invoice, StripeEvent
from billing.tests.conftest import WEBHOOK_SECRET
from billing.tests.fake_stripe import FakeStripe
from investigations import notifications
from investigations import services as inv_services
from investigations.models import Incident, VerdictHold
from investigations.tests.live_helpers import job_pk, store_sim
from tenants.context import system_context, tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/billing/stripe/webhook/"


def _signed(payload: str, secret: str = WEBHOOK_SECRET, at: int | None = None) -> str:
    t = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{t}.{payload}".encode(), hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def _event(event_id: str, kind: str, obj: dict[str, Any]) -> str:
    return json.dumps(
        {"id": event_id, "object": "event", "type": kind, "data": {"object": obj}, "created": 1}
    )


def _post(client: Client, payload: str, signature: str | None = None) -> Any:
    return client.post(
        URL,
        data=payload,
        content_type="application/json",
        headers={"Stripe-Signature": signature if signature is not None else _signed(payload)},
    )


def _account(slug: str) -> Tenant:
    tenant = make_tenant(slug)
    plan = services.do_upsert_plan(
        "dunning", name="Dunning", price_per_gpu_month=Decimal("60"), stripe_price_id="price_1"
    )
    services.do_assign_plan(tenant.operator.pk, plan)
    stripe_sync.do_ensure_customer(tenant.operator.pk, tenant.operator.name)
    return tenant


def _state(tenant: Tenant) -> BillingAccount:
    with tenant_context(tenant.operator.pk):
        return BillingAccount.objects.for_tenant(tenant.operator.pk).get()


def test_signature_is_checked_and_each_event_is_processed_once(fake_stripe: FakeStripe) -> None:
    a = _account("hook-a")
    customer = _state(a).stripe_customer_id
    client = Client()
    payload = _event(
        "evt_1",
        "invoice.payment_failed",
        {
            "id": "in_1",
            "customer": customer,
            "amount_due": 12000,
            "currency": "usd",
            "period_start": int(datetime(2028, 2, 1, tzinfo=UTC).timestamp()),
        },
    )
    # Forged (another secret), stale (beyond the library's 5-minute tolerance), missing.
    assert _post(client, payload, _signed(payload, "whsec_other")).status_code == 400
    stale = _post(client, payload, _signed(payload, at=int(time.time()) - 3600))
    assert stale.status_code == 400 and "signature" in stale.json()["error"]["message"]
    assert _post(client, payload, "").status_code == 400
    assert _state(a).state == AccountState.ACTIVE
    first = _post(client, payload)
    assert first.status_code == 200 and not first.json()["duplicate"]
    assert _state(a).state == AccountState.PAST_DUE
    # Redelivered (Stripe retries): acknowledged, changes nothing.
    since = _state(a).past_due_since
    again = _post(client, payload)
    assert again.status_code == 200 and again.json()["duplicate"]
    assert _state(a).past_due_since == since
    with system_context():
        assert StripeEvent.objects.filter(event_id="evt_1").count() == 1
    with tenant_context(a.operator.pk):
        invoice = Invoice.objects.for_tenant(a.operator.pk).get()
    assert (invoice.state, invoice.amount, f"{invoice.month:%Y-%m}") == (
        "failed",
        Decimal("120"),
        "2028-02",
    )
    # An event for a customer no operator has: acknowledged, recorded, nothing changed.
    other = _event("evt_2", "invoice.paid", {"id": "in_2", "customer": "cus_nobody"})
    assert "no operator" in _post(client, other).json()["outcome"]


def test_past_due_grace_pause_and_resume_with_the_paused_period_evaluated(
    fake_stripe: FakeStripe, settings: Any, fired: list[notifications.Notification]
) -> None:
    settings.BILLING_GRACE_DAYS = 14
    a = _account("dun-a")
    b = _account("dun-b")
    op = a.operator.pk
    customer = _state(a).stripe_customer_id
    client = Client()
    failed_at = datetime.now(UTC) - timedelta(days=15)
    services.do_mark_past_due(op, "invoice in_1 payment failed", now=failed_at)
    # Within the grace period: nothing paused.
    assert services.advance_dunning(now=failed_at + timedelta(days=13)) == []
    # Past it: paused (b, never past due, is not).
    assert services.advance_dunning() == [op]
    account = _state(a)
    assert account.state == AccountState.PAUSED and "grace period" in account.state_reason
    assert _state(b).state == AccountState.ACTIVE
    # Ingest goes on while paused; evaluations account GPU time and publish nothing.
    sim = store_sim(op, "sequence_imbalance")
    job = job_pk(op, sim.jobs[0])
    assert inv_services.evaluate_job(op, job).verdicts
    with tenant_context(op):
        assert not Incident.objects.for_tenant(op).exists()
    # Paid: active at once; the task evaluates the paused period and lifts the hold.
    paid = _event(
        "evt_paid",
        "invoice.paid",
        {"id": "in_1", "customer": customer, "amount_paid": 6000, "currency": "usd"},
    )
    assert _post(client, paid).json()["outcome"].startswith("invoice paid")
    assert _state(a).state == AccountState.ACTIVE
    assert tasks.resume_verdicts(op) >= 1
    with tenant_context(op):
        assert not VerdictHold.objects.for_tenant(op).exists()
        assert Incident.objects.for_tenant(op).filter(job_id=job).count() == 1
    assert [n.kind for n in fired if n.operator_id == op] == ["new"]


def test_subscription_updates_and_deletion(fake_stripe: FakeStripe) -> None:
    a = _account("sub-a")
    op = a.operator.pk
    customer = _state(a).stripe_customer_id
    client = Client()
    sub = {"id": "sub_1", "customer": customer}
    _post(client, _event("evt_s1", "customer.subscription.updated", {**sub, "status": "past_due"}))
    assert _state(a).state == AccountState.PAST_DUE
    _post(client, _event("evt_s2", "customer.subscription.updated", {**sub, "status": "active"}))
    assert _state(a).state == AccountState.ACTIVE
    _post(client, _event("evt_s3", "customer.subscription.updated", {**sub, "status": "unpaid"}))
    assert _state(a).state == AccountState.PAUSED
    with tenant_context(op):
        assert VerdictHold.objects.for_tenant(op).exists()
    _post(client, _event("evt_s4", "customer.subscription.deleted", {**sub, "status": "canceled"}))
    assert _state(a).state == AccountState.CANCELED
    # Cancelled: the hold stays (resuming refuses while cancelled).
    assert services.do_resume_verdicts(op) is None
