"""Billing: plans, each operator's account, the immutable daily GPU usage it is billed on, the
outbox of Stripe meter events, invoices, webhook receipts, reconciliations (docs/billing.md).

- `Plan`: Proof's price list (staff-managed, not tenant-owned): a price per GPU-month,
  optional graduated tiers, a minimum monthly commitment, a trial length.
- `BillingAccount`: one per operator: its plan, per-operator overrides, its Stripe customer and
  subscription, and the dunning state (active → past_due → paused → active).
- `DailyUsage`: one row per (operator, GPU uuid, UTC day) the GPU was reported; never updated
  (a PostgreSQL trigger refuses it, billing/migrations/0001). A month's GPU-months are its
  rows ÷ days in the month.
- `MeterReport`: the outbox of Stripe meter events: one per (operator, day, revision), written
  in the transaction that wrote the day's usage rows; `identifier` is what Stripe dedupes on.
- `Invoice`: a month's invoice (Stripe's, from its webhooks, or the local close).
- `StripeEvent`: one row per webhook event id processed (exactly-once).
- `Reconciliation`: Stripe's meter totals compared with ours for a month.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import models
from django.db.models import Q

from tenants.models import TenantOwned, operator_index, unique_per_operator

# The unit reported to Stripe: 1/377,580 of a GPU-month. 377,580 is the least common multiple
# of 28, 29, 30 and 31, so one GPU-day is a whole number of units in every month (13,020 in a
# 29-day February, 12,180 in a 31-day month) and a month of one GPU is exactly 377,580 units:
# Stripe's meters count integers, and a GPU-day's share of a month must not be rounded.
UNITS_PER_GPU_MONTH = 377_580


def units_per_gpu_day(days_in_month: int) -> int:
    return UNITS_PER_GPU_MONTH // days_in_month


class Plan(models.Model):
    """A price list entry. `tiers` are graduated: [{"up_to": 100, "price": "60.00"},
    {"up_to": null, "price": "45.00"}] prices the first 100 GPU-months at 60 and the rest at
    45; empty means every GPU-month at `price_per_gpu_month`."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    currency = models.CharField(max_length=3, default="USD")
    price_per_gpu_month = models.DecimalField(max_digits=12, decimal_places=4)
    tiers = models.JSONField(default=list, blank=True)
    minimum_monthly = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0"))
    trial_days = models.IntegerField(default=0)
    # The Stripe price (recurring, metered on the meter of PROOF_STRIPE_METER_EVENT) that bills
    # this plan's units; empty: the plan is billed locally only.
    stripe_price_id = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(price_per_gpu_month__gte=0), name="billing_plan_price_nonneg"
            )
        ]

    def __str__(self) -> str:
        return self.name


class AccountState(models.TextChoices):
    ACTIVE = "active", "Active"
    TRIALING = "trialing", "Trial"
    PAST_DUE = "past_due", "Payment overdue"
    PAUSED = "paused", "Verdicts paused"
    CANCELED = "canceled", "Cancelled"


class BillingAccount(TenantOwned):
    """The operator's billing: operator-only (no customer_path)."""

    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="accounts")
    # Per-operator overrides of the plan (None: the plan's).
    price_override = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    minimum_override = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    trial_ends_on = models.DateField(null=True, blank=True)
    stripe_customer_id = models.CharField(max_length=100, blank=True, default="")
    stripe_subscription_id = models.CharField(max_length=100, blank=True, default="")
    state = models.CharField(
        max_length=16, choices=AccountState.choices, default=AccountState.ACTIVE
    )
    past_due_since = models.DateTimeField(null=True, blank=True)
    paused_since = models.DateTimeField(null=True, blank=True)
    state_reason = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [unique_per_operator(name="billing_one_account")]

    def __str__(self) -> str:
        return f"account of operator {self.operator_id}"


class ImmutableRow(Exception):
    pass


class DailyUsage(TenantOwned):
    """One GPU billed for one UTC day. Inserted once, never changed."""

    day = models.DateField()
    gpu = models.CharField(max_length=96)
    gpu_model = models.CharField(max_length=128, blank=True, default="")
    # Where the GPU was that day (several when it moved): the trace behind an invoice line.
    nodes = models.JSONField(default=list)
    report = models.ForeignKey(
        "MeterReport", on_delete=models.PROTECT, related_name="usage", null=True
    )
    computed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [unique_per_operator("gpu", "day", name="billing_usage_once")]
        indexes = [operator_index("day", name="billing_usage_day")]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRow("daily usage rows are never changed (docs/billing.md)")
        super().save(*args, **kwargs)


class ReportState(models.TextChoices):
    PENDING = "pending"  # owed to Stripe
    SENT = "sent"  # Stripe accepted it (or already had it: same identifier)
    FAILED = "failed"  # the last attempt failed; another is scheduled
    GAVE_UP = "gave_up"  # Stripe refused it for good, or it is past Stripe's 35 days
    LOCAL = "local"  # no Stripe for this operator: the row is the ledger only


class MeterReport(TenantOwned):
    """One Stripe meter event owed: the GPU-days of one day first metered (revision 0), or
    rows of that day that arrived after it was metered (revision 1, 2, …)."""

    day = models.DateField()
    revision = models.IntegerField(default=0)
    gpu_days = models.IntegerField()
    units = models.BigIntegerField()
    identifier = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=16, choices=ReportState.choices)
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.CharField(max_length=500, blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [unique_per_operator("day", "revision", name="billing_report_once")]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="billing_report_due")]


class InvoiceState(models.TextChoices):
    DRAFT = "draft"
    OPEN = "open"
    PAID = "paid"
    FAILED = "failed"


class Invoice(TenantOwned):
    month = models.DateField()  # the first day of the month billed
    gpu_days = models.IntegerField()
    gpu_months = models.DecimalField(max_digits=14, decimal_places=4)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    currency = models.CharField(max_length=3)
    state = models.CharField(max_length=16, choices=InvoiceState.choices)
    stripe_invoice_id = models.CharField(max_length=100, blank=True, default="")
    hosted_url = models.URLField(max_length=1000, blank=True, default="")
    # The lines as priced (tiers, minimum), each with the GPU-months behind it.
    lines = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-month"]
        constraints = [unique_per_operator("month", name="billing_invoice_month")]


class StripeEvent(models.Model):
    """A webhook event processed: its id is the key that makes processing exactly-once. Not
    tenant-owned: an event is received before its operator is known (and some have none)."""

    event_id = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=100)
    received_at = models.DateTimeField(auto_now_add=True)
    outcome = models.CharField(max_length=300, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.type} {self.event_id}"


class Reconciliation(TenantOwned):
    month = models.DateField()
    checked_at = models.DateTimeField()
    ours_units = models.BigIntegerField()
    stripe_units = models.BigIntegerField(null=True)
    # Per day: {"2028-02-29": {"ours": 13020, "stripe": 0}} for each day that differs.
    differences = models.JSONField(default=dict)
    error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-checked_at"]
        indexes = [operator_index("month", name="billing_recon_month")]


class LicenceStatus(models.Model):
    """The last check of the air-gapped licence (one row): what the console and the daily
    check show. Not tenant-owned: the licence is the site's."""

    checked_at = models.DateTimeField()
    valid = models.BooleanField()
    operator_slug = models.CharField(max_length=64, blank=True, default="")
    gpu_cap = models.IntegerField(null=True)
    expires_on = models.DateField(null=True)
    gpus_now = models.IntegerField(default=0)
    # When the licence first stopped covering the site (past the cap or expiry): verdicts
    # continue for PROOF_LICENCE_GRACE_DAYS from then.
    lapsed_since = models.DateTimeField(null=True)
    message = models.CharField(max_length=500)

    def __str__(self) -> str:
        return self.message
