"""Query-parameter parsing for the fleet, health and price pages: a bad value is a 400 that
names the parameter and says what it accepts, never a 500."""

from __future__ import annotations

from datetime import date
from decimal import Decimal, InvalidOperation

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render


class BadParameter(ValueError):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def bad_parameter_response(request: HttpRequest, error: BadParameter, section: str) -> HttpResponse:
    return render(
        request,
        "proof/console/_fleet_bad_parameter.html",
        {"error": error, "section": section, "page_title": "Bad request"},
        status=400,
    )


def _one(params: QueryDict, name: str) -> str | None:
    value = params.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def int_param(params: QueryDict, name: str, default: int, lo: int, hi: int) -> int:
    raw = _one(params, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParameter(name, f"{raw!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise BadParameter(name, f"{value} is outside {lo}–{hi}")
    return value


def choice_param(params: QueryDict, name: str, choices: tuple[str, ...], default: str) -> str:
    raw = _one(params, name)
    if raw is None:
        return default
    if raw not in choices:
        raise BadParameter(name, f"{raw!r} is not one of {', '.join(choices)}")
    return raw


def date_param(params: QueryDict, name: str) -> date | None:
    raw = _one(params, name)
    if raw is None:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise BadParameter(name, f"{raw!r} is not a date (YYYY-MM-DD)") from None


def decimal_param(
    params: QueryDict, name: str, *, lo_exclusive: Decimal, hi: Decimal
) -> Decimal | None:
    raw = _one(params, name)
    if raw is None:
        return None
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise BadParameter(name, f"{raw!r} is not a number") from None
    if not value.is_finite() or not lo_exclusive < value <= hi:
        raise BadParameter(name, f"{raw} must be above {lo_exclusive} and at most {hi}")
    return value


def text_param(params: QueryDict, name: str, max_length: int = 255) -> str | None:
    raw = _one(params, name)
    if raw is not None and len(raw) > max_length:
        raise BadParameter(name, f"longer than {max_length} characters")
    return raw
