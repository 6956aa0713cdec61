"""Stripe's webhooks: the signature checked by the library (`stripe.Webhook.construct_event`:
the `Stripe-Signature` header's `t=…,v1=…`, HMAC-SHA256 of "t.payload" with the endpoint's
secret, within the library's tolerance), each event id processed once (a `StripeEvent` row
inserted in the transaction that applies it: a redelivery finds it and changes nothing).

Handled: invoice.paid, invoice.payment_failed, customer.subscription.updated,
customer.subscription.deleted. Others are acknowledged and recorded as ignored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import stripe
from django.conf import settings
from django.db import IntegrityError, transaction

from billing import services
from billing.models import BillingAccount, Invoice, InvoiceState, StripeEvent
from tenants.context import system_context, tenant_context

log = logging.getLogger(__name__)


class WebhookRefused(ValueError):
    """The request is not a genuine Stripe event (status 400, with the reason)."""


@dataclass(frozen=True)
class Processed:
    event_id: str
    type: str
    outcome: str
    duplicate: bool = False
    resume_operator: int | None = None  # verdicts to release (a task, after commit)


def verify(payload: bytes, signature: str) -> dict[str, Any]:
    secret = settings.BILLING_STRIPE_WEBHOOK_SECRET
    if not secret:
        raise WebhookRefused("PROOF_STRIPE_WEBHOOK_SECRET is not set: webhooks are not accepted")
    if not signature:
        raise WebhookRefused("missing Stripe-Signature header")
    try:
        text = payload.decode("utf-8")
        # The library's webhook helpers carry no annotations (stripe 13). It checks the
        # signature and the timestamp's tolerance; the verified text is then read as JSON.
        stripe.Webhook.construct_event(text, signature, secret)  # type: ignore[no-untyped-call]
        event = json.loads(text)
    except stripe.SignatureVerificationError as exc:
        raise WebhookRefused(f"bad signature: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise WebhookRefused(f"not a JSON event: {exc}") from None
    if not isinstance(event, dict):
        raise WebhookRefused("the event is not a JSON object")
    return event


def _operator_for(customer_id: str) -> int | None:
    with system_context():
        row = (
            BillingAccount.objects.filter(stripe_customer_id=customer_id)
            .values_list("operator_id", flat=True)
            .first()
        )
    return int(row) if row is not None else None


def _invoice_month(obj: dict[str, Any]) -> datetime:
    """The month an invoice bills: its lines' period start (a metered subscription invoices
    the period that just ended), else its own period start."""
    lines = (obj.get("lines") or {}).get("data") or []
    start = None
    for line in lines:
        period = line.get("period") or {}
        if period.get("start"):
            start = int(period["start"]) if start is None else min(start, int(period["start"]))
    start = start or int(obj.get("period_start") or obj.get("created") or 0)
    return datetime.fromtimestamp(start, UTC)


def _apply_invoice(operator_id: int, obj: dict[str, Any], state: str) -> None:
    month = _invoice_month(obj).date().replace(day=1)
    cents = int(obj.get("amount_paid") or obj.get("amount_due") or obj.get("total") or 0)
    with tenant_context(operator_id):
        Invoice.objects.update_or_create(
            operator_id=operator_id,
            month=month,
            defaults={
                "state": state,
                "stripe_invoice_id": str(obj.get("id") or ""),
                "hosted_url": str(obj.get("hosted_invoice_url") or ""),
                "amount": Decimal(cents) / 100,
                "currency": str(obj.get("currency") or "usd").upper(),
            },
            create_defaults={
                "state": state,
                "stripe_invoice_id": str(obj.get("id") or ""),
                "hosted_url": str(obj.get("hosted_invoice_url") or ""),
                "amount": Decimal(cents) / 100,
                "currency": str(obj.get("currency") or "usd").upper(),
                "gpu_days": 0,
                "gpu_months": Decimal(0),
                "lines": [],
            },
        )


def _on_invoice_paid(op: int, obj: dict[str, Any]) -> tuple[str, bool]:
    _apply_invoice(op, obj, InvoiceState.PAID)
    return "invoice paid; account active", services.do_mark_paid(op)


def _on_invoice_failed(op: int, obj: dict[str, Any]) -> tuple[str, bool]:
    _apply_invoice(op, obj, InvoiceState.FAILED)
    state = services.do_mark_past_due(op, f"invoice {obj.get('id')} payment failed")
    return f"payment failed; account {state}", False


def _on_subscription(op: int, obj: dict[str, Any]) -> tuple[str, bool]:
    status = str(obj.get("status") or "")
    if status in ("past_due",):
        return (
            f"subscription past_due; {services.do_mark_past_due(op, 'subscription past due')}",
            False,
        )
    if status in ("unpaid", "incomplete_expired"):
        # Stripe gave up collecting: no more grace.
        services.do_mark_past_due(op, f"subscription {status}")
        services.do_pause(op, f"subscription {status}: Stripe stopped retrying the payment")
        return f"subscription {status}; verdicts paused", False
    if status == "canceled":
        services.do_cancel(op)
        return "subscription cancelled; verdicts paused", False
    if status in ("active", "trialing"):
        return f"subscription {status}", services.do_mark_paid(op)
    return f"subscription {status}: no change", False


def _on_subscription_deleted(op: int, obj: dict[str, Any]) -> tuple[str, bool]:
    services.do_cancel(op)
    return "subscription deleted; verdicts paused", False


HANDLERS: dict[str, Callable[[int, dict[str, Any]], tuple[str, bool]]] = {
    "invoice.paid": _on_invoice_paid,
    "invoice.payment_failed": _on_invoice_failed,
    "customer.subscription.updated": _on_subscription,
    "customer.subscription.deleted": _on_subscription_deleted,
}


def process(event: dict[str, Any]) -> Processed:
    """Apply one verified event, once per event id."""
    event_id = str(event.get("id") or "")
    kind = str(event.get("type") or "")
    if not event_id.startswith("evt_"):
        raise WebhookRefused(f"event id {event_id!r} is not a Stripe event id")
    obj = ((event.get("data") or {}).get("object")) or {}
    try:
        with transaction.atomic():
            with system_context():
                StripeEvent.objects.create(event_id=event_id, type=kind)
            handler = HANDLERS.get(kind)
            customer = str(obj.get("customer") or "")
            op = _operator_for(customer) if customer else None
            resume = False
            if handler is None:
                outcome = "ignored (type not handled)"
            elif op is None:
                outcome = f"no operator has Stripe customer {customer!r}"
            else:
                outcome, resume = handler(op, obj)
            with system_context():
                StripeEvent.objects.filter(event_id=event_id).update(outcome=outcome[:300])
    except IntegrityError:
        return Processed(event_id, kind, "already processed", duplicate=True)
    return Processed(event_id, kind, outcome, resume_operator=op if resume else None)
