"""Billing's writes: plans and accounts, the dunning state machine, the local monthly close.

Dunning (docs/billing.md, "Dunning"): active/trialing → past_due (a failed payment, or Stripe
says so) → after PROOF_BILLING_GRACE_DAYS, paused (new verdicts held through
investigations.verdict_hold; ingest never stops) → active again on payment, when the paused
period's verdicts are computed. Every transition is idempotent: webhooks and the periodic pass
may repeat any of them.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from billing import banner, selectors
from billing.models import AccountState, BillingAccount, Invoice, InvoiceState, Plan
from investigations import verdict_hold
from tenants.context import system_context, tenant_context
from tenants.selectors import operator_ids

log = logging.getLogger(__name__)


class BillingError(ValueError):
    """Bad billing input, with a message naming what was wrong."""


def do_upsert_plan(
    slug: str,
    *,
    name: str,
    price_per_gpu_month: Decimal,
    currency: str = "USD",
    tiers: list[dict[str, Any]] | None = None,
    minimum_monthly: Decimal = Decimal("0"),
    trial_days: int = 0,
    stripe_price_id: str = "",
) -> Plan:
    if price_per_gpu_month < 0:
        raise BillingError(f"plan {slug}: price_per_gpu_month must be ≥ 0")
    for k, tier in enumerate(tiers or []):
        if "price" not in tier or Decimal(str(tier["price"])) < 0:
            raise BillingError(f"plan {slug}: tier {k} needs a price ≥ 0")
        if tier.get("up_to") is None and k != len(tiers or []) - 1:
            raise BillingError(f"plan {slug}: only the last tier may be open-ended (up_to null)")
    plan, _ = Plan.objects.update_or_create(
        slug=slug,
        defaults={
            "name": name,
            "price_per_gpu_month": price_per_gpu_month,
            "currency": currency.upper(),
            "tiers": tiers or [],
            "minimum_monthly": minimum_monthly,
            "trial_days": trial_days,
            "stripe_price_id": stripe_price_id,
        },
    )
    return plan


def do_assign_plan(
    operator_id: int,
    plan: Plan,
    *,
    price_override: Decimal | None = None,
    minimum_override: Decimal | None = None,
    today: date | None = None,
) -> BillingAccount:
    """Give the operator its plan (a new account starts its trial today)."""
    today = today or datetime.now(UTC).date()
    with tenant_context(operator_id):
        account = BillingAccount.objects.for_tenant(operator_id).first()
        if account is None:
            trial = today + timedelta(days=plan.trial_days - 1) if plan.trial_days else None
            account = BillingAccount.objects.create(
                operator_id=operator_id,
                plan=plan,
                trial_ends_on=trial,
                state=AccountState.TRIALING if trial else AccountState.ACTIVE,
            )
        else:
            account.plan = plan
        account.price_override = price_override
        account.minimum_override = minimum_override
        account.save()
        return account


# --- dunning -------------------------------------------------------------------------------


def _locked_account(operator_id: int) -> BillingAccount | None:
    return BillingAccount.objects.for_tenant(operator_id).select_for_update().first()


def do_mark_past_due(operator_id: int, reason: str, now: datetime | None = None) -> str | None:
    """A payment failed: past_due (its start kept if already so); the new state."""
    now = now or datetime.now(UTC)
    with transaction.atomic(), tenant_context(operator_id):
        account = _locked_account(operator_id)
        if account is None:
            return None
        if account.state in (AccountState.ACTIVE, AccountState.TRIALING):
            account.state = AccountState.PAST_DUE
            account.past_due_since = now
            account.state_reason = reason[:300]
            account.save(update_fields=["state", "past_due_since", "state_reason"])
            transaction.on_commit(lambda: banner.publish(account))
        return str(account.state)


def grace_ends(account: BillingAccount) -> datetime | None:
    if account.past_due_since is None:
        return None
    return account.past_due_since + timedelta(days=settings.BILLING_GRACE_DAYS)


def do_pause(operator_id: int, reason: str, now: datetime | None = None) -> bool:
    """Hold new verdicts (ingest goes on); True if the account was not paused before."""
    now = now or datetime.now(UTC)
    with transaction.atomic(), tenant_context(operator_id):
        account = _locked_account(operator_id)
        if account is None or account.state == AccountState.PAUSED:
            return False
        account.state = AccountState.PAUSED
        account.paused_since = now
        account.state_reason = reason[:300]
        account.save(update_fields=["state", "paused_since", "state_reason"])
        verdict_hold.do_hold_verdicts(operator_id, reason, now=now)
        transaction.on_commit(lambda: banner.publish(account))
    return True


def advance_dunning(now: datetime | None = None) -> list[int]:
    """Pause every past-due account whose grace period is over; the operators paused."""
    now = now or datetime.now(UTC)
    with system_context():
        accounts = list(BillingAccount.objects.exclude(state=AccountState.ACTIVE))
    for account in accounts:  # the banners of a cache that lost them (billing/banner.py)
        banner.publish(account)
    due = [
        a for a in accounts if a.state == AccountState.PAST_DUE and (grace_ends(a) or now) <= now
    ]
    paused = []
    for account in due:
        if do_pause(
            account.operator_id,
            f"payment overdue since {account.past_due_since:%Y-%m-%d}, grace period of "
            f"{settings.BILLING_GRACE_DAYS} days over",
            now,
        ):
            paused.append(account.operator_id)
    return paused


def do_mark_paid(operator_id: int) -> bool:
    """Payment received: active again. True when verdicts were paused (the caller then runs
    `do_resume_verdicts`, which evaluates the paused period; it may take a while, so not
    inside a webhook's request)."""
    with transaction.atomic(), tenant_context(operator_id):
        account = _locked_account(operator_id)
        if account is None:
            return False
        was_paused = account.state == AccountState.PAUSED
        if account.state in (AccountState.PAST_DUE, AccountState.PAUSED, AccountState.TRIALING):
            account.state = AccountState.ACTIVE
            account.past_due_since = None
            account.state_reason = ""
            account.save(update_fields=["state", "past_due_since", "state_reason"])
            transaction.on_commit(lambda: banner.publish(account))
        return was_paused


def do_resume_verdicts(operator_id: int) -> verdict_hold.HeldPeriodResult | None:
    """Evaluate the paused period and lift the hold, unless the account is paused again."""
    account = selectors.account_for(operator_id)
    if account is not None and account.state in (AccountState.PAUSED, AccountState.CANCELED):
        return None
    result = verdict_hold.do_release_verdicts(operator_id)
    with tenant_context(operator_id):
        BillingAccount.objects.for_tenant(operator_id).update(paused_since=None)
    return result


def do_cancel(operator_id: int, now: datetime | None = None) -> None:
    """The subscription ended: verdicts are held at once (data is still ingested and kept)."""
    do_pause(operator_id, "subscription cancelled", now)
    with tenant_context(operator_id):
        BillingAccount.objects.for_tenant(operator_id).update(state=AccountState.CANCELED)
        account = BillingAccount.objects.for_tenant(operator_id).get()
    banner.publish(account)


# --- invoices ------------------------------------------------------------------------------


def do_close_month(operator_id: int, month: date) -> Invoice:
    """The local invoice of a finished month (no Stripe: the site's record; with Stripe, its
    draft until Stripe's invoice webhook fills in the real one). Idempotent."""
    priced = selectors.priced_month(operator_id, month)
    with transaction.atomic(), tenant_context(operator_id):
        invoice, created = Invoice.objects.get_or_create(
            operator_id=operator_id,
            month=month,
            defaults={
                "gpu_days": priced.gpu_days,
                "gpu_months": priced.gpu_months.quantize(Decimal("0.0001")),
                "amount": priced.total,
                "currency": priced.currency,
                "state": InvoiceState.DRAFT,
                "lines": [line.as_dict() for line in priced.lines],
            },
        )
        if not created and invoice.state == InvoiceState.DRAFT:
            invoice.gpu_days = priced.gpu_days
            invoice.gpu_months = priced.gpu_months.quantize(Decimal("0.0001"))
            invoice.amount = priced.total
            invoice.lines = [line.as_dict() for line in priced.lines]
            invoice.save()
        return invoice


def previous_month(today: date) -> date:
    first = today.replace(day=1)
    return (first - timedelta(days=1)).replace(day=1)


def close_previous_months(today: date | None = None) -> int:
    """Close last month for every operator (the periodic pass; idempotent)."""
    today = today or datetime.now(UTC).date()
    month = previous_month(today)
    return len([do_close_month(op, month) for op in operator_ids()])


DEMO_PLAN = "demo"


def ensure_demo_plan(operator_id: int) -> BillingAccount:
    """The demo operator's plan (proof demo): 45 USD per GPU-month, 35 above 100 GPU-months,
    a 500 USD minimum; kept as it is if the operator already has an account."""
    account = selectors.account_for(operator_id)
    if account is not None:
        return account
    plan = do_upsert_plan(
        DEMO_PLAN,
        name="Demo: per GPU-month",
        price_per_gpu_month=Decimal("45"),
        tiers=[{"up_to": 100, "price": "45"}, {"up_to": None, "price": "35"}],
        minimum_monthly=Decimal("500"),
    )
    return do_assign_plan(operator_id, plan)
