"""Reads of the notify app."""

from __future__ import annotations

from django.db.models import QuerySet

from notify.models import NotificationChannel, OutboxDelivery
from tenants.access import Principal


def deliveries_of(principal: Principal, channel: NotificationChannel) -> QuerySet[OutboxDelivery]:
    """A channel's delivery log, newest first (the channel is the principal's: fetched with
    get_object_for_tenant)."""
    return (
        OutboxDelivery.objects.for_tenant(principal)
        .filter(channel=channel)
        .select_related("incident")
        .order_by("-created_at", "-id")
    )
