"""The audit log's one writer: `record_audit()`, called by the services that change something
worth answering "who did that?" for — incident actions, API tokens, share links, notification
channels, list prices, memberships — inside their own transaction, so an entry exists exactly
when the change committed.

`actor_label()` names a principal the way the audit log and an incident's history show it: the
user's username, or `api-token:<prefix>` for a token (a token acts on its own, whoever made it),
or `system` for work no person asked for.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from tenants.access import Principal
from tenants.models import ApiToken, AuditEvent

SYSTEM_ACTOR = "system"


def actor_label(principal: Principal | None) -> str:
    """Who a principal is, in words that outlive the user or the token (one query)."""
    if principal is None:
        return SYSTEM_ACTOR
    if principal.api_token_id is not None:
        prefix = (
            ApiToken.objects.filter(pk=principal.api_token_id)
            .values_list("prefix", flat=True)
            .first()
        )
        return f"api-token:{prefix or principal.api_token_id}"
    if principal.user_id is not None:
        username = (
            get_user_model()
            .objects.filter(pk=principal.user_id)
            .values_list("username", flat=True)
            .first()
        )
        return str(username or f"user:{principal.user_id}")
    return SYSTEM_ACTOR


def record_audit(
    principal: Principal | int,
    action: str,
    target_type: str,
    target_id: object = "",
    *,
    customer_id: int | None = None,
    detail: dict[str, Any] | None = None,
    actor: str | None = None,
) -> AuditEvent:
    """One audit entry in the caller's transaction (and tenant context). `principal` is who
    did it, or the operator id for work no principal asked for (actor "system"); `actor`
    overrides the label when the caller has it already (no second lookup)."""
    if isinstance(principal, Principal):
        operator_id = principal.operator_id
        user_id = principal.user_id if principal.api_token_id is None else None
        label = actor if actor is not None else actor_label(principal)
        customer_id = customer_id if customer_id is not None else principal.customer_id
    else:
        operator_id, user_id, label = int(principal), None, actor or SYSTEM_ACTOR
    return AuditEvent.objects.create(
        operator_id=operator_id,
        customer_id=customer_id,
        actor=label[:200],
        actor_user_id=user_id,
        action=action,
        target_type=target_type,
        target_id=str(target_id)[:200],
        detail=detail or {},
    )
