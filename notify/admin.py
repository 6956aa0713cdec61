"""Staff admin for notification channels and the outbox (system_context via tenants'
middleware). Secrets are never shown: a webhook channel's secret is read once, at creation."""

from __future__ import annotations

from django.contrib import admin

from notify.models import NotificationChannel, OutboxDelivery, RoutingRule


class RoutingRuleInline(admin.TabularInline[RoutingRule, NotificationChannel]):
    model = RoutingRule
    extra = 0
    fields = ("families", "categories", "customer", "min_gpu_hours_lost", "min_money_lost")


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin[NotificationChannel]):
    list_display = ["name", "operator", "kind", "enabled", "disabled_reason", "created_at"]
    list_filter = ["kind", "enabled", "operator"]
    search_fields = ["name"]
    exclude = ["target"]  # an incoming-webhook URL or routing key is a credential
    inlines = [RoutingRuleInline]


@admin.register(OutboxDelivery)
class OutboxDeliveryAdmin(admin.ModelAdmin[OutboxDelivery]):
    list_display = [
        "event_id",
        "operator",
        "channel",
        "kind",
        "state",
        "attempts",
        "last_status",
        "next_attempt_at",
        "created_at",
    ]
    list_filter = ["state", "kind", "operator"]
    search_fields = ["event_id"]
    readonly_fields = [f.name for f in OutboxDelivery._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False
