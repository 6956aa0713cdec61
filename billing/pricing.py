"""A month's invoice from its GPU-days (no database): GPU-months, graduated tiers, the trial,
the minimum commitment (docs/billing.md, "Pricing")."""

from __future__ import annotations

import calendar
from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

CENT = Decimal("0.01")
MONTHS_PLACES = Decimal("0.0001")


def days_in_month(month: date) -> int:
    return calendar.monthrange(month.year, month.month)[1]


def month_start(value: date) -> date:
    return value.replace(day=1)


def next_month(month: date) -> date:
    return date(month.year + (month.month == 12), month.month % 12 + 1, 1)


def parse_month(text: str) -> date:
    """`YYYY-MM` → the first day of that month; a clear error otherwise."""
    try:
        year, mon = text.split("-")
        return date(int(year), int(mon), 1)
    except ValueError:
        raise ValueError(f"month must be YYYY-MM (e.g. 2028-02), got {text!r}") from None


def gpu_months(gpu_days: int, month: date) -> Decimal:
    """GPU-days ÷ days in the month (exact; shown to 4 places)."""
    return Decimal(gpu_days) / Decimal(days_in_month(month))


@dataclass(frozen=True)
class PlanTerms:
    currency: str
    price_per_gpu_month: Decimal
    tiers: list[dict[str, Any]] = field(default_factory=list)
    minimum_monthly: Decimal = Decimal("0")
    trial_ends_on: date | None = None


@dataclass(frozen=True)
class Line:
    description: str
    gpu_months: Decimal
    unit_price: Decimal
    amount: Decimal

    def as_dict(self) -> dict[str, str]:
        return {
            "description": self.description,
            "gpu_months": str(self.gpu_months.quantize(MONTHS_PLACES)),
            "unit_price": str(self.unit_price),
            "amount": str(self.amount),
        }


@dataclass(frozen=True)
class Priced:
    month: date
    gpu_days: int
    billable_gpu_days: int
    gpu_months: Decimal
    lines: list[Line]
    total: Decimal
    currency: str


def _tiered(months: Decimal, terms: PlanTerms) -> list[Line]:
    if not terms.tiers:
        return [
            Line(
                "GPU-months",
                months,
                terms.price_per_gpu_month,
                (months * terms.price_per_gpu_month).quantize(CENT, ROUND_HALF_UP),
            )
        ]
    lines: list[Line] = []
    floor = Decimal(0)
    for tier in terms.tiers:
        up_to = tier.get("up_to")
        price = Decimal(str(tier["price"]))
        top = months if up_to is None else min(months, Decimal(str(up_to)))
        if top <= floor:
            break
        qty = top - floor
        label = (
            f"GPU-months {floor:.0f}–{up_to}"
            if up_to is not None
            else f"GPU-months over {floor:.0f}"
        )
        lines.append(Line(label, qty, price, (qty * price).quantize(CENT, ROUND_HALF_UP)))
        floor = top
        if up_to is None:
            break
    return lines


def price_month(month: date, day_counts: dict[date, int], terms: PlanTerms) -> Priced:
    """The month's invoice from its GPUs per day. Days up to the trial's end are free; the
    minimum commitment tops the total up when usage is below it (not during a trial month)."""
    total_days = sum(day_counts.values())
    trial = terms.trial_ends_on
    free = sum(n for d, n in day_counts.items() if trial is not None and d <= trial)
    billable = total_days - free
    months = gpu_months(billable, month)
    lines: list[Line] = []
    if free:
        lines.append(Line("Trial (free)", gpu_months(free, month), Decimal(0), Decimal("0.00")))
    lines.extend(_tiered(months, terms))
    total = sum((line.amount for line in lines), Decimal("0.00"))
    in_trial = trial is not None and trial >= month
    if terms.minimum_monthly and total < terms.minimum_monthly and not in_trial:
        lines.append(
            Line(
                "Minimum monthly commitment",
                Decimal(0),
                Decimal(0),
                (terms.minimum_monthly - total).quantize(CENT),
            )
        )
        total = terms.minimum_monthly.quantize(CENT)
    return Priced(
        month, total_days, billable, gpu_months(total_days, month), lines, total, terms.currency
    )
