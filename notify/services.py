"""Writes of the notify app: channels (with their rules and secrets), the outbox rows owed for a
notification, and test events. Each write owns its transaction (or joins the evaluation's, for
`enqueue_for_notification`, which must write in it)."""

from __future__ import annotations

import base64
import secrets as random_secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Min
from django.utils import timezone

from investigations.models import GpuListPrice
from investigations.notifications import Notification
from notify.formats import SECRET_PREFIX
from notify.models import (
    ChannelKind,
    ChannelSecret,
    DeliveryKind,
    DeliveryState,
    NotificationChannel,
    OutboxDelivery,
    RoutingRule,
)
from tenants.access import Principal
from tenants.audit import record_audit
from tenants.context import tenant_context
from tenants.models import Customer, Role
from tenants.services import NotAllowed, TenancyError

# Standard Webhooks asks for > 24 bytes of key; 32 is what its libraries generate.
SECRET_BYTES = 32
# How long the secrets a rotation replaces keep signing (receivers switch at leisure).
ROTATION_OVERLAP_S = 24 * 3600
EVENT_NAMESPACE = uuid.UUID("5b0c8f0e-6c1e-4c7a-9a55-2f3cf1b0e6a1")
URL_KINDS = (ChannelKind.SLACK, ChannelKind.TEAMS, ChannelKind.WEBHOOK)


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(random_secrets.token_bytes(SECRET_BYTES)).decode()


def _require_admin(principal: Principal) -> None:
    if principal.role != Role.OPERATOR_ADMIN:
        raise NotAllowed("only operator admins manage notification channels")


def _check_target(kind: str, target: str, addresses: list[str]) -> None:
    if kind in URL_KINDS and not target.startswith(("https://", "http://")):
        raise TenancyError(f"a {kind} channel's target is its webhook URL (http:// or https://)")
    if kind == ChannelKind.PAGERDUTY and not target:
        raise TenancyError("a pagerduty channel's target is its Events API v2 routing key")
    if kind == ChannelKind.EMAIL and not addresses:
        raise TenancyError("an email channel needs at least one address")


def _set_rules(channel: NotificationChannel, rules: list[dict[str, Any]]) -> None:
    channel.rules.all().delete()
    for rule in rules:
        customer_id = rule.get("customer")
        if (
            customer_id is not None
            and not Customer.objects.for_tenant(channel.operator_id).filter(pk=customer_id).exists()
        ):
            raise TenancyError(f"customer {customer_id} is not one of this operator's")
        RoutingRule.objects.create(
            operator_id=channel.operator_id,
            channel=channel,
            families=list(rule.get("families") or []),
            categories=list(rule.get("categories") or []),
            customer_id=customer_id,
            min_gpu_hours_lost=rule.get("min_gpu_hours_lost"),
            min_money_lost=rule.get("min_money_lost"),
        )


@dataclass(frozen=True)
class CreatedChannel:
    channel: NotificationChannel
    secret: str | None  # a webhook channel's signing secret: shown once, at creation


def do_create_channel(
    principal: Principal,
    *,
    name: str,
    kind: str,
    target: str = "",
    addresses: list[str] | None = None,
    enabled: bool = True,
    rules: list[dict[str, Any]] | None = None,
) -> CreatedChannel:
    _require_admin(principal)
    addresses = list(addresses or [])
    _check_target(kind, target, addresses)
    with tenant_context(principal.operator_id):
        channel = NotificationChannel.objects.create(
            operator_id=principal.operator_id,
            name=name,
            kind=kind,
            target=target,
            addresses=addresses,
            enabled=enabled,
        )
        _set_rules(channel, rules or [])
        secret = None
        if kind == ChannelKind.WEBHOOK:
            secret = new_secret()
            ChannelSecret.objects.create(
                operator_id=principal.operator_id, channel=channel, secret=secret
            )
        record_audit(principal, "channel.create", "channel", channel.pk, detail={"name": name, "kind": kind})  # fmt: skip
    return CreatedChannel(channel, secret)


def do_update_channel(
    principal: Principal, channel: NotificationChannel, **changes: Any
) -> NotificationChannel:
    _require_admin(principal)
    rules = changes.pop("rules", None)
    changes.pop("kind", None)  # a channel's kind never changes: make a new channel
    with tenant_context(principal.operator_id):
        for name, value in changes.items():
            setattr(channel, name, value)
        _check_target(channel.kind, channel.target, list(channel.addresses or []))
        if changes.get("enabled"):
            channel.disabled_reason = ""
        channel.save()
        if rules is not None:
            _set_rules(channel, rules)
    return channel


def do_delete_channel(principal: Principal, channel: NotificationChannel) -> None:
    _require_admin(principal)
    with tenant_context(principal.operator_id):
        record_audit(principal, "channel.delete", "channel", channel.pk, detail={"name": channel.name, "kind": channel.kind})  # fmt: skip
        channel.delete()


def do_rotate_secret(
    principal: Principal, channel: NotificationChannel, overlap_s: int = ROTATION_OVERLAP_S
) -> str:
    """A new signing secret (returned once); the current ones keep signing for `overlap_s`."""
    _require_admin(principal)
    if channel.kind != ChannelKind.WEBHOOK:
        raise TenancyError("only webhook channels have signing secrets")
    now = timezone.now()
    with tenant_context(principal.operator_id):
        ChannelSecret.objects.for_tenant(principal.operator_id).filter(
            channel=channel, expires_at__isnull=True
        ).update(expires_at=now + timedelta(seconds=overlap_s))
        secret = new_secret()
        ChannelSecret.objects.create(
            operator_id=principal.operator_id, channel=channel, secret=secret
        )
    return secret


def do_send_test(principal: Principal, channel: NotificationChannel) -> OutboxDelivery:
    """A test event through the same outbox and worker as a real one."""
    _require_admin(principal)
    event_id = f"msg_test_{uuid.uuid4().hex}"
    verdict = {
        "id": event_id,
        "family": "test",
        "category": "test",
        "title": f"Test notification to {channel.name}",
        "summary": "A test event sent from Proof's notification settings.",
        "recommendation": "Nothing to do: this confirms the channel receives Proof's verdicts.",
        "confidence": 1.0,
        "subject": {"job": None, "node": None, "gpu": None, "rank": None, "mount": None},
        "interval": None,
        "impact": {"slowdown_pct": None, "gpu_hours_lost": None},
        "evidence": [],
        "cleared": [],
        "explanation": "",
    }
    payload = {
        "kind": DeliveryKind.TEST.value,
        "incident": None,
        "event_id": event_id,
        "verdict": verdict,
        "url": public_url("/incidents/"),
        "money_lost": None,
    }
    with tenant_context(principal.operator_id):
        return OutboxDelivery.objects.create(
            operator_id=principal.operator_id,
            channel=channel,
            kind=DeliveryKind.TEST,
            event_id=event_id,
            payload=payload,
            next_attempt_at=timezone.now(),
        )


# --- the outbox rows of a notification (in the evaluation's transaction) -----------------------


def public_url(path: str) -> str:
    return str(settings.PROOF_PUBLIC_URL).rstrip("/") + path


def event_id_for(note: Notification) -> str:
    """The same notification gives the same id (the NotificationLog key), a retried
    evaluation included: the unique (channel, event_id) then keeps it from being queued twice."""
    key = f"{note.incident_public_id}|{note.kind}|{note.family}|{note.category}"
    return "msg_" + uuid.uuid5(EVENT_NAMESPACE, key).hex


def money_lost(operator_id: int, verdict: dict[str, Any]) -> tuple[Decimal | None, str]:
    """GPU-hours lost × the operator's lowest list price per GPU-hour (a floor: the verdict
    does not say which models its hours ran on). None without a price or lost hours."""
    hours = (verdict.get("impact") or {}).get("gpu_hours_lost")
    if hours is None:
        return None, "USD"
    row = GpuListPrice.objects.for_tenant(operator_id).aggregate(
        price=Min("price_per_gpu_hour"), currency=Min("currency")
    )
    if row["price"] is None:
        return None, "USD"
    return (Decimal(str(hours)) * row["price"]).quantize(Decimal("0.01")), str(row["currency"])


def rule_matches(
    rule: RoutingRule, note: Notification, gpu_hours: float | None, money: Decimal | None
) -> bool:
    if rule.families and note.family not in rule.families:
        return False
    if rule.categories and note.category not in rule.categories:
        return False
    if rule.customer_id is not None and rule.customer_id != note.customer_id:
        return False
    if rule.min_gpu_hours_lost is not None and (gpu_hours or 0.0) < rule.min_gpu_hours_lost:
        return False
    return rule.min_money_lost is None or (money or Decimal(0)) >= rule.min_money_lost


def enqueue_for_notification(note: Notification) -> int:
    """Insert the outbox rows this notification owes, in the caller's (the evaluation's)
    transaction; the number of channels it is owed to (rows already there are kept). A resolve goes to the PagerDuty channels that were paged
    for the incident (it closes their alert); chat and webhooks hear of new and changed
    verdicts only."""
    operator_id = note.operator_id
    channels = list(
        NotificationChannel.objects.for_tenant(operator_id)
        .filter(enabled=True)
        .prefetch_related("rules")
    )
    if not channels:
        return 0
    if note.kind == DeliveryKind.RESOLVED:
        paged = set(
            OutboxDelivery.objects.for_tenant(operator_id)
            .filter(
                incident_id=note.incident_id,
                kind__in=[DeliveryKind.NEW, DeliveryKind.CHANGED],
                channel__kind=ChannelKind.PAGERDUTY,
            )
            .values_list("channel_id", flat=True)
        )
        targets = [c for c in channels if c.pk in paged]
        money: Decimal | None = None
        currency = "USD"
    else:
        gpu_hours = (note.verdict.get("impact") or {}).get("gpu_hours_lost")
        money, currency = money_lost(operator_id, note.verdict)
        targets = [
            c
            for c in channels
            if not c.rules.all()
            or any(rule_matches(r, note, gpu_hours, money) for r in c.rules.all())
        ]
    if not targets:
        return 0
    event_id = event_id_for(note)
    payload = {
        "kind": note.kind,
        "incident": note.incident_public_id,
        "event_id": event_id,
        "revision": note.revision,
        "job": note.job,
        "customer": note.customer_id,
        "previous_family": note.previous_family,
        "previous_category": note.previous_category,
        "verdict": note.verdict,
        "url": public_url(f"/incidents/{note.incident_public_id}/"),
        "money_lost": str(money) if money is not None else None,
        "currency": currency,
    }
    now = timezone.now()
    rows = [
        OutboxDelivery(
            operator_id=operator_id,
            channel=c,
            incident_id=note.incident_id,
            kind=note.kind,
            event_id=event_id,
            payload=payload,
            state=DeliveryState.PENDING,
            next_attempt_at=now,
        )
        for c in targets
    ]
    # ignore_conflicts: a row this notification already owes (unique channel, event_id) stays
    # as it is, whatever its state: an event is queued once per channel.
    OutboxDelivery.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def active_secrets(channel: NotificationChannel, now: datetime) -> list[str]:
    return [s.secret for s in channel.secrets.all() if s.expires_at is None or s.expires_at > now]
