"""Stripe, through the real `stripe` library: the customer and subscription per operator, the
meter-event outbox worker, the reconciliation of Stripe's totals with ours, the portal link.

Exactly-once billing rests on three things (docs/billing.md, "Stripe"):
- each MeterReport's `identifier` derives from (operator, month, day, revision) only, and
  Stripe keeps one event per identifier: a resend after a lost answer is a duplicate Stripe
  drops, never a second charge;
- reports are claimed with `SELECT … FOR UPDATE SKIP LOCKED` and a lease, so two workers never
  send the same row at once; a row is `sent` only once Stripe answered (or said it already had
  the identifier);
- every retry happens well inside Stripe's dedupe window (24 h): the schedule ends after
  ~12 h, and a row still unsent then is left to the reconciliation, which compares Stripe's
  per-day totals with ours and says which days differ.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import stripe
from django.conf import settings
from django.db import transaction

from billing import metering
from billing.models import (
    BillingAccount,
    MeterReport,
    Reconciliation,
    ReportState,
)
from billing.pricing import next_month
from tenants.context import system_context, tenant_context
from tenants.selectors import operator_ids

log = logging.getLogger(__name__)

# Seconds between attempts of one report (the last ends ~12 h after the first): Stripe keeps
# an identifier for at least 24 h, so every resend is still recognised as the same event.
RETRY_SCHEDULE_S = (5, 30, 120, 600, 1800, 3600, 3 * 3600, 6 * 3600)
CLAIM_BATCH = 100
LEASE_S = 60.0
# Stripe accepts meter events up to 35 days old; a report older than this is not sent (the
# reconciliation shows the day), and the month's invoice carries it as metered locally.
MAX_EVENT_AGE = timedelta(days=35)
# The library's own retries (network errors, 409/429/5xx) before our schedule takes over.
LIBRARY_RETRIES = 2


class StripeNotConfigured(RuntimeError):
    pass


def configure() -> None:
    """Point the library at the configured key and base (a test's fake, or Stripe)."""
    if not settings.BILLING_STRIPE_SECRET_KEY:
        raise StripeNotConfigured(
            "PROOF_STRIPE_SECRET_KEY is not set: billing is local (no Stripe calls)"
        )
    stripe.api_key = settings.BILLING_STRIPE_SECRET_KEY
    stripe.api_base = settings.BILLING_STRIPE_API_BASE
    stripe.max_network_retries = LIBRARY_RETRIES


# --- customer and subscription ---------------------------------------------------------------


def do_ensure_customer(operator_id: int, name: str) -> BillingAccount:
    """Create the operator's Stripe customer and its metered subscription, once. The
    idempotency keys make a retried creation return the first one's object."""
    configure()
    with tenant_context(operator_id):
        account = BillingAccount.objects.for_tenant(operator_id).select_related("plan").get()
    if not account.stripe_customer_id:
        customer = stripe.Customer.create(
            name=name,
            metadata={"proof_operator_id": str(operator_id)},
            idempotency_key=f"proof-customer-op{operator_id}",
        )
        account.stripe_customer_id = str(customer.id)
    if not account.stripe_subscription_id and account.plan.stripe_price_id:
        params: dict[str, Any] = {
            "customer": account.stripe_customer_id,
            "items": [{"price": account.plan.stripe_price_id}],
            "metadata": {"proof_operator_id": str(operator_id)},
        }
        if account.trial_ends_on:
            end = datetime.combine(account.trial_ends_on + timedelta(days=1), time(0), UTC)
            params["trial_end"] = int(end.timestamp())
        subscription = stripe.Subscription.create(
            **params, idempotency_key=f"proof-subscription-op{operator_id}"
        )
        account.stripe_subscription_id = str(subscription.id)
    with tenant_context(operator_id):
        BillingAccount.objects.for_tenant(operator_id).filter(pk=account.pk).update(
            stripe_customer_id=account.stripe_customer_id,
            stripe_subscription_id=account.stripe_subscription_id,
        )
        # Reports written while the operator had no customer were local: owed to Stripe now.
        MeterReport.objects.for_tenant(operator_id).filter(state=ReportState.LOCAL).update(
            state=ReportState.PENDING
        )
    return account


def portal_url(operator_id: int, return_url: str) -> str | None:
    """A Stripe customer-portal session for the operator; None without Stripe."""
    if not metering.stripe_enabled():
        return None
    with tenant_context(operator_id):
        account = BillingAccount.objects.for_tenant(operator_id).first()
    if account is None or not account.stripe_customer_id:
        return None
    configure()
    session = stripe.billing_portal.Session.create(
        customer=account.stripe_customer_id, return_url=return_url
    )
    return str(session.url)


# --- the meter-event outbox ------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    row_id: int
    attempt: int
    operator_id: int
    customer: str
    identifier: str
    units: int
    timestamp: int


def event_timestamp(day: date) -> int:
    """Noon UTC of the day: inside the day (and so its billing period) whatever the time
    zone Stripe shows it in."""
    return int(datetime.combine(day, time(12), UTC).timestamp())


def claim(now: datetime | None = None, limit: int = CLAIM_BATCH) -> list[Claimed]:
    now = now or datetime.now(UTC)
    out: list[Claimed] = []
    with transaction.atomic(), system_context():
        rows = list(
            MeterReport.objects.filter(
                state__in=[ReportState.PENDING, ReportState.FAILED], next_attempt_at__lte=now
            )
            .order_by("next_attempt_at", "id")
            .select_for_update(skip_locked=True)[:limit]
        )
        customers = dict(
            BillingAccount.objects.filter(
                operator_id__in={r.operator_id for r in rows}
            ).values_list("operator_id", "stripe_customer_id")
        )
        for row in rows:
            customer = customers.get(row.operator_id) or ""
            too_old = now - datetime.combine(row.day, time(0), UTC) > MAX_EVENT_AGE
            if not customer or too_old:
                row.state = ReportState.LOCAL if not customer else ReportState.GAVE_UP
                row.last_error = (
                    "no Stripe customer" if not customer else "older than Stripe's 35 days"
                )
                row.save(update_fields=["state", "last_error"])
                continue
            row.attempts += 1
            row.next_attempt_at = now + timedelta(seconds=LEASE_S)
            row.save(update_fields=["attempts", "next_attempt_at"])
            out.append(
                Claimed(
                    int(row.pk),
                    row.attempts,
                    row.operator_id,
                    customer,
                    row.identifier,
                    row.units,
                    event_timestamp(row.day),
                )
            )
    return out


@dataclass(frozen=True)
class Outcome:
    ok: bool
    retry: bool
    error: str = ""


def _duplicate(exc: stripe.InvalidRequestError) -> bool:
    """Stripe already has an event with this identifier: our earlier attempt reached it."""
    code = getattr(exc, "code", None) or ""
    return code in ("resource_already_exists", "duplicate_meter_event") or (
        "identifier" in str(exc).lower() and "already" in str(exc).lower()
    )


def send(item: Claimed) -> Outcome:
    try:
        stripe.billing.MeterEvent.create(
            event_name=settings.BILLING_STRIPE_METER_EVENT,
            payload={"stripe_customer_id": item.customer, "value": str(item.units)},
            identifier=item.identifier,
            timestamp=item.timestamp,
        )
    except stripe.InvalidRequestError as exc:
        if _duplicate(exc):
            return Outcome(True, False)
        return Outcome(False, False, f"refused: {exc}"[:500])
    except stripe.AuthenticationError as exc:
        return Outcome(False, True, f"authentication: {exc}"[:500])
    except stripe.StripeError as exc:  # network cut, 429, 5xx: the same identifier again
        return Outcome(False, True, f"{type(exc).__name__}: {exc}"[:500])
    return Outcome(True, False)


def record(item: Claimed, outcome: Outcome, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    update: dict[str, Any] = {"last_error": outcome.error}
    if outcome.ok:
        update.update(state=ReportState.SENT, sent_at=now, last_error="")
    elif outcome.retry and item.attempt <= len(RETRY_SCHEDULE_S):
        delay = RETRY_SCHEDULE_S[item.attempt - 1]
        update.update(state=ReportState.FAILED, next_attempt_at=now + timedelta(seconds=delay))
    else:
        update.update(state=ReportState.GAVE_UP)
    with transaction.atomic(), system_context():
        MeterReport.objects.filter(pk=item.row_id, attempts=item.attempt).update(**update)
    if not outcome.ok:
        log.warning("meter report %s attempt %s: %s", item.identifier, item.attempt, outcome.error)
    return str(update["state"])


def ensure_customers() -> int:
    """Create the Stripe customer (and subscription) of every account that has none yet —
    an account given a plan since the last pass, or every one when Stripe was just
    configured; the accounts done. One failing is logged and left for the next pass."""
    with system_context():
        pending = list(
            BillingAccount.objects.filter(stripe_customer_id="").values_list(
                "operator_id", "operator__name"
            )
        )
    done = 0
    for operator_id, name in pending:
        try:
            do_ensure_customer(operator_id, name)
            done += 1
        except stripe.StripeError as exc:
            log.warning("Stripe customer of operator %s not created yet: %s", operator_id, exc)
    return done


def deliver_due(now: datetime | None = None) -> int:
    """One pass of the outbox: customers owed first, then claim, send, record; the rows
    attempted."""
    if not metering.stripe_enabled():
        return 0
    configure()
    ensure_customers()
    items = claim(now)
    for item in items:
        record(item, send(item), now)
    return len(items)


# --- reconciliation --------------------------------------------------------------------------


def _ours_by_day(operator_id: int, month: date) -> dict[date, int]:
    with tenant_context(operator_id):
        rows = MeterReport.objects.for_tenant(operator_id).filter(
            day__gte=month, day__lt=next_month(month)
        )
        out: dict[date, int] = {}
        for day, units in rows.values_list("day", "units"):
            out[day] = out.get(day, 0) + int(units)
        return out


def do_reconcile(operator_id: int, month: date, now: datetime | None = None) -> Reconciliation:
    """Stripe's per-day meter totals for the operator's customer against our reports."""
    now = now or datetime.now(UTC)
    ours = _ours_by_day(operator_id, month)
    theirs: dict[date, int] = {}
    error = ""
    stripe_total: int | None = None
    with tenant_context(operator_id):
        account = BillingAccount.objects.for_tenant(operator_id).first()
    try:
        configure()
        if account is None or not account.stripe_customer_id:
            raise StripeNotConfigured("the operator has no Stripe customer")
        if not settings.BILLING_STRIPE_METER_ID:
            raise StripeNotConfigured("PROOF_STRIPE_METER_ID is not set")
        start = datetime.combine(month, time(0), UTC)
        end = min(
            datetime.combine(next_month(month), time(0), UTC),
            now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1),
        )
        summaries = stripe.billing.Meter.list_event_summaries(
            settings.BILLING_STRIPE_METER_ID,
            customer=account.stripe_customer_id,
            start_time=int(start.timestamp()),
            end_time=int(end.timestamp()),
            value_grouping_window="day",
        )
        for s in summaries.auto_paging_iter():
            day = datetime.fromtimestamp(int(s["start_time"]), UTC).date()
            theirs[day] = theirs.get(day, 0) + round(float(s["aggregated_value"]))
        stripe_total = sum(theirs.values())
    except (stripe.StripeError, StripeNotConfigured) as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    differences = {
        f"{d:%Y-%m-%d}": {"ours": ours.get(d, 0), "stripe": theirs.get(d, 0)}
        for d in sorted(set(ours) | set(theirs))
        if stripe_total is not None and ours.get(d, 0) != theirs.get(d, 0)
    }
    with tenant_context(operator_id):
        recon = Reconciliation.objects.create(
            operator_id=operator_id,
            month=month,
            checked_at=now,
            ours_units=sum(ours.values()),
            stripe_units=stripe_total,
            differences=differences,
            error=error,
        )
    if differences or error:
        log.warning(
            "billing reconciliation of operator %s %s: %s",
            operator_id,
            f"{month:%Y-%m}",
            error or differences,
        )
    return recon


def reconcile_all(now: datetime | None = None) -> int:
    """This month (and last month during its first days: well inside the 35 days) for every
    operator with a Stripe customer; the reconciliations with a difference or an error."""
    if not metering.stripe_enabled():
        return 0
    now = now or datetime.now(UTC)
    months = {now.date().replace(day=1), (now - timedelta(days=5)).date().replace(day=1)}
    flagged = 0
    for op in operator_ids():
        with tenant_context(op):
            has_customer = (
                BillingAccount.objects.for_tenant(op).exclude(stripe_customer_id="").exists()
            )
        if not has_customer:
            continue
        for month in sorted(months):
            recon = do_reconcile(op, month, now)
            flagged += bool(recon.differences or recon.error)
    return flagged
