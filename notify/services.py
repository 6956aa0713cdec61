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

from engine.drain import DRAIN_MARGIN_H
from investigations.models import ComponentForecast, GpuListPrice
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
    return _rule_holds(rule, note.family, note.category, note.customer_id, gpu_hours, money)


def _rule_holds(
    rule: RoutingRule,
    family: str,
    category: str,
    customer_id: int | None,
    gpu_hours: float | None,
    money: Decimal | None,
) -> bool:
    if rule.families and family not in rule.families:
        return False
    if rule.categories and category not in rule.categories:
        return False
    if rule.customer_id is not None and rule.customer_id != customer_id:
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
    return _queue(operator_id, targets, note.kind, event_id, payload, incident_id=note.incident_id)


def _queue(
    operator_id: int,
    targets: list[NotificationChannel],
    kind: str,
    event_id: str,
    payload: dict[str, Any],
    *,
    incident_id: int | None = None,
) -> int:
    """One pending outbox row per target channel; how many were asked for."""
    now = timezone.now()
    rows = [
        OutboxDelivery(
            operator_id=operator_id,
            channel=c,
            incident_id=incident_id,
            kind=kind,
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


# --- the outbox rows of a forecast that crossed a risk level (in the pass's transaction) ------

# What routing rules match a forecast notification on: it is about the operator's own hardware
# (category infrastructure), of no customer (a rule naming a customer never matches), and has
# no GPU-hours lost yet (a rule with a loss floor above zero never matches).
FORECAST_FAMILY = "fleet_forecast"
FORECAST_CATEGORY = "infrastructure"
_KIND_LABEL = {"gpu": "GPU", "pcie": "PCIe link of GPU", "nvlink": "NVLink of GPU", "ib_port": "IB port"}  # fmt: skip


def forecast_event_id(operator_id: int, forecast: ComponentForecast) -> str:
    """One id per crossing: the component, the level it rose to and when it got there. The
    same pass retried gives the same id (and the unique (channel, event_id) queues it once);
    a later crossing, after a recovery cleared it, has a new `level_since` and so a new id."""
    key = (
        f"forecast|{operator_id}|{forecast.kind}|{forecast.key}|{forecast.level}|"
        f"{forecast.level_since.isoformat()}"
    )
    return "msg_" + uuid.uuid5(EVENT_NAMESPACE, key).hex


def forecast_message(forecast: ComponentForecast, previous: str, event_id: str) -> dict[str, Any]:
    """The body a forecast crossing sends: verdict-shaped (title, summary, recommendation,
    subject, evidence), so every channel kind formats it as it formats a verdict, plus the
    forecast itself (level, risks, time to failure)."""
    what = f"{_KIND_LABEL.get(forecast.kind, forecast.kind)} {forecast.key}"
    ttf = forecast.ttf_hours
    when = f", estimated failure in {ttf:.0f} h" if ttf is not None else ""
    drain_by = (
        f"within {max(ttf - DRAIN_MARGIN_H, 0.0):.0f} h ({DRAIN_MARGIN_H:.0f} h before the "
        "estimated failure)"
        if ttf is not None
        else "at the next opportunity"
    )
    result: dict[str, Any] = forecast.result or {}
    evidence = [
        {
            "id": f"e{i + 1}",
            "signal": e.get("label") or e.get("signal"),
            "node": forecast.node or None,
            "gpu": forecast.gpu or None,
            "rank": None,
            "observed": e.get("now"),
            "baseline": e.get("three_days_ago"),
            "note": f"{e.get('unit', '')} now (baseline: 3 days ago), heading for "
            f"{e.get('heading_for')}",
        }
        for i, e in enumerate(result.get("evidence") or [])
    ]
    return {
        "id": event_id,
        "family": FORECAST_FAMILY,
        "category": FORECAST_CATEGORY,
        "title": f"Fleet health: {what} at {forecast.level}{when}",
        "summary": forecast.summary,
        "recommendation": (
            f"Drain {forecast.node or 'its node'} {drain_by}; the drain plan on the health "
            "page groups it with the nodes that share a running job, so that job restarts once."
        ),
        "confidence": forecast.risk_7d,
        "subject": {
            "job": None,
            "node": forecast.node or None,
            "gpu": forecast.gpu or None,
            "rank": None,
            "mount": None,
        },
        "interval": None,
        "impact": {"slowdown_pct": None, "gpu_hours_lost": None},
        "evidence": evidence,
        "cleared": [],
        "explanation": "",
        "forecast": {
            "id": forecast.pk,
            "kind": forecast.kind,
            "key": forecast.key,
            "node": forecast.node,
            "level": forecast.level,
            "previous_level": previous,
            "level_since": forecast.level_since.isoformat(),
            "risk": {"1d": forecast.risk_1d, "3d": forecast.risk_3d, "7d": forecast.risk_7d},
            "ttf_hours": ttf,
        },
    }


def enqueue_for_forecast(operator_id: int, forecast: ComponentForecast, previous: str) -> int:
    """Insert the outbox rows owed for a component that rose into drain or urgent, in the
    caller's (the forecast pass's) transaction; the number of channels it is owed to."""
    channels = list(
        NotificationChannel.objects.for_tenant(operator_id)
        .filter(enabled=True)
        .prefetch_related("rules")
    )
    targets = [
        c
        for c in channels
        if not c.rules.all()
        or any(
            _rule_holds(r, FORECAST_FAMILY, FORECAST_CATEGORY, None, None, None)
            for r in c.rules.all()
        )
    ]
    if not targets:
        return 0
    event_id = forecast_event_id(operator_id, forecast)
    payload = {
        "kind": DeliveryKind.FORECAST.value,
        "incident": None,
        "event_id": event_id,
        "verdict": forecast_message(forecast, previous, event_id),
        "url": public_url("/health/"),
        "money_lost": None,
        "currency": "USD",
    }
    return _queue(operator_id, targets, DeliveryKind.FORECAST, event_id, payload)


def active_secrets(channel: NotificationChannel, now: datetime) -> list[str]:
    return [s.secret for s in channel.secrets.all() if s.expires_at is None or s.expires_at > now]
