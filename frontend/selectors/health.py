"""Reads of the fleet-health page (/health/, operators only). The ranking, the drain tiers and
the trends are investigations.selectors_health's (the API's /api/v1/fleet-health/ shows the
same); this module keeps the page's own size."""

from __future__ import annotations

from investigations.selectors_fleet import HARDWARE_FAULT
from investigations.selectors_health import (
    COUNTERS,
    DEFAULT_DAYS,
    FAMILIES,
    MANY_SIGNS,
    MAX_DAYS,
    THROTTLE_CHART,
    TIERS,
    AtRiskGpu,
    AtRiskIncident,
    HealthPage,
    HealthSummary,
    Sign,
    Trend,
)
from investigations.selectors_health import health_page as _health_page
from tenants.access import Principal

__all__ = [
    "COUNTERS",
    "DEFAULT_DAYS",
    "FAMILIES",
    "HARDWARE_FAULT",
    "MANY_SIGNS",
    "MAX_DAYS",
    "PER_PAGE",
    "THROTTLE_CHART",
    "TIERS",
    "AtRiskGpu",
    "AtRiskIncident",
    "HealthPage",
    "HealthSummary",
    "Sign",
    "Trend",
    "health_page",
]

# GPUs a page of /health/ lists.
PER_PAGE = 25


def health_page(
    principal: Principal, *, days: int, page: int, now: float | None = None
) -> HealthPage:
    """Everything /health/ shows (8 queries, whatever the page holds)."""
    return _health_page(principal, days=days, page=page, now=now, per_page=PER_PAGE)
