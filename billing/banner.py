"""The console's billing banner (past due, paused; an air-gapped licence past its cap or
expiry), kept in the cache by billing's state changes so that no page pays a query for it.

Written by every dunning transition (billing/services.py) and the licence check, and
refreshed for every account by the hourly dunning pass, so a cache that lost it (a restart of
the embedded process) has it back within the hour. Read by the context processor
(billing/context_processors.py) for operator users; customers of the operator never see it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache

from billing.models import AccountState, BillingAccount

LICENCE_KEY = "billing-banner:licence"


def _key(operator_id: int) -> str:
    return f"billing-banner:{operator_id}"


def banner_for(account: BillingAccount) -> dict[str, str] | None:
    if account.state == AccountState.PAST_DUE and account.past_due_since is not None:
        pause_at = account.past_due_since + timedelta(days=settings.BILLING_GRACE_DAYS)
        return {
            "level": "warning",
            "text": (
                f"Payment overdue since {account.past_due_since:%Y-%m-%d}. New verdicts pause "
                f"on {pause_at:%Y-%m-%d %H:%M} UTC unless it is paid; telemetry is collected "
                "either way."
            ),
        }
    if account.state in (AccountState.PAUSED, AccountState.CANCELED):
        since = account.paused_since
        return {
            "level": "error",
            "text": (
                f"New verdicts are paused{f' since {since:%Y-%m-%d}' if since else ''}: "
                f"{account.state_reason or 'billing'}. Telemetry is still collected and kept; "
                "the paused period's verdicts are computed when billing is resumed."
            ),
        }
    return None


def publish(account: BillingAccount) -> None:
    banner = banner_for(account)
    if banner is None:
        cache.delete(_key(account.operator_id))
    else:
        cache.set(_key(account.operator_id), banner, None)


def publish_licence(message: str | None) -> None:
    if message is None:
        cache.delete(LICENCE_KEY)
    else:
        cache.set(LICENCE_KEY, {"level": "error", "text": f"Licence: {message}"}, None)


def banners(operator_id: int) -> list[dict[str, Any]]:
    found = cache.get_many([_key(operator_id), LICENCE_KEY])
    return [b for b in (found.get(_key(operator_id)), found.get(LICENCE_KEY)) if b]
