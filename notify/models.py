"""Notification channels (per operator), their routing rules and signing secrets, and the
outbox of deliveries (docs/notifications.md, "Chat and paging").

An `OutboxDelivery` row is written in the evaluation's own transaction, beside the
`NotificationLog` claim (notify/receivers.py), and sent later by the worker (notify/tasks.py):
the row is the promise to deliver, so a verdict committed is a delivery owed, and a rolled-back
evaluation owes none. `(channel, event_id)` is unique: one event is never queued twice for one
channel, however often the evaluation that reaches it is retried.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q

from investigations.models import Incident
from tenants.models import Customer, TenantOwned, operator_index


class ChannelKind(models.TextChoices):
    SLACK = "slack"
    TEAMS = "teams"
    PAGERDUTY = "pagerduty"
    WEBHOOK = "webhook"
    EMAIL = "email"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # the last attempt failed; another is scheduled (next_attempt_at)
    GAVE_UP = "gave_up"  # a 4xx, a 410, or the retry schedule ran out: never tried again


class DeliveryKind(models.TextChoices):
    NEW = "new"
    CHANGED = "changed"
    RESOLVED = "resolved"
    TEST = "test"
    # A component's days-ahead forecast rose into drain or urgent (docs/fleet-health.md): no
    # incident, the forecast row is the subject.
    FORECAST = "forecast"


class NotificationChannel(TenantOwned):
    """Where an operator's verdicts go. `target` is the incoming-webhook URL (slack, teams,
    webhook) or the Events API v2 routing key (pagerduty); `addresses` the recipients (email).
    Operator-only (no customer_path): customers never see channels."""

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    target = models.CharField(max_length=2000, blank=True, default="")
    addresses = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    # Why the channel was disabled (a 410 from the receiver), shown in the API.
    disabled_reason = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        indexes = [operator_index("enabled", name="notify_channel_enabled")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


class ChannelSecret(TenantOwned):
    """A webhook channel's signing secret (`whsec_` + base64 of 32 random bytes), kept in
    plaintext because signing needs it (as any Standard Webhooks sender must). Several are
    active during a rotation: every active one signs, so the receiver may switch at leisure."""

    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="secrets"
    )
    secret = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # None: active until rotated; a rotation sets the old secrets' expiry.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"secret {self.pk} of channel {self.channel_id}"


class RoutingRule(TenantOwned):
    """A channel receives a notification when any of its rules matches (a channel without
    rules receives all). Within a rule every set condition must hold; empty lists match all."""

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="rules")
    families = models.JSONField(default=list, blank=True)
    categories = models.JSONField(default=list, blank=True)
    customer = models.ForeignKey(
        Customer, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    min_gpu_hours_lost = models.FloatField(null=True, blank=True)
    min_money_lost = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"rule {self.pk} of channel {self.channel_id}"


class OutboxDelivery(TenantOwned):
    """One event owed to one channel, and its delivery log (attempts, last status/error)."""

    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="deliveries"
    )
    incident = models.ForeignKey(
        Incident, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    kind = models.CharField(max_length=16, choices=DeliveryKind.choices)
    # The Standard Webhooks message id (webhook-id), the same on every attempt.
    event_id = models.CharField(max_length=64)
    payload = models.JSONField()
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    customer_path: ClassVar[str | None] = None

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["channel", "event_id"], name="notify_event_once"),
        ]
        indexes = [
            # The worker's claim: due rows of every operator, oldest due first.
            models.Index(
                fields=["next_attempt_at"],
                name="notify_outbox_due",
                condition=Q(state__in=["pending", "failed"]),
            ),
            operator_index("channel", "-created_at", name="notify_outbox_channel_log"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_id} → channel {self.channel_id}"
