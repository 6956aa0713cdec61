"""Formatting for console pages: one place decides how money, shares, durations and GPU-hours
read, so every page says them the same way."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from django import template

register = template.Library()


@register.filter
def pct(value: float | None, digits: int = 0) -> str:
    """0.642 -> "64%"; None -> "–" (not measured)."""
    if value is None:
        return "–"
    return f"{float(value) * 100:.{int(digits)}f}%"


@register.filter
def money(value: Decimal | float | None, currency: str = "USD") -> str:
    if value is None:
        return "–"
    symbol = {"USD": "$", "EUR": "€", "GBP": "£"}.get(currency, f"{currency} ")
    return f"{symbol}{float(value):,.2f}"


@register.filter
def duration(seconds: float | None) -> str:
    """3725 -> "1h 02m"; 75 -> "1m 15s"."""
    if seconds is None:
        return "–"
    s = round(float(seconds))
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


@register.filter
def gpu_hours(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{float(seconds) / 3600:,.1f} GPU-h"


@register.filter
def ts(value: float | None) -> str:
    """Unix seconds -> "2026-12-02 05:50:53 UTC" (data timestamps are unix seconds)."""
    if value is None:
        return "–"
    return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
