"""Staff admin for billing (system_context via tenants' middleware): plans and each operator's
account are edited here (plan, overrides, trial); usage rows, reports and invoices are shown
read-only — usage rows are immutable (docs/billing.md)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from billing.models import BillingAccount, DailyUsage, Invoice, MeterReport, Plan


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin[Plan]):
    list_display = [
        "slug",
        "name",
        "price_per_gpu_month",
        "currency",
        "minimum_monthly",
        "trial_days",
    ]


@admin.register(BillingAccount)
class BillingAccountAdmin(admin.ModelAdmin[BillingAccount]):
    list_display = ["operator", "plan", "state", "past_due_since", "stripe_customer_id"]
    list_filter = ["state", "plan"]
    readonly_fields = [
        "stripe_customer_id",
        "stripe_subscription_id",
        "past_due_since",
        "paused_since",
    ]


class _ReadOnly(admin.ModelAdmin[Any]):
    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(DailyUsage)
class DailyUsageAdmin(_ReadOnly):
    list_display = ["operator", "day", "gpu", "gpu_model", "nodes"]
    list_filter = ["operator"]
    search_fields = ["gpu"]


@admin.register(MeterReport)
class MeterReportAdmin(_ReadOnly):
    list_display = ["operator", "day", "revision", "gpu_days", "units", "state", "attempts"]
    list_filter = ["state", "operator"]


@admin.register(Invoice)
class InvoiceAdmin(_ReadOnly):
    list_display = ["operator", "month", "state", "gpu_months", "amount", "currency"]
    list_filter = ["state", "operator"]
