"""/price/ — the real price per job, per customer (operators) and for the fleet over a period,
the money the open verdicts' causes cost, and the effective-price calculator."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import console_view
from frontend.selectors import price as selectors
from frontend.views._fleet_params import (
    BadParameter,
    bad_parameter_response,
    choice_param,
    date_param,
    decimal_param,
    int_param,
)
from tenants.access import Principal

SORTS = tuple(k for s in selectors.JOB_SORTS for k in (s, f"-{s}"))


def period_from(request: HttpRequest) -> selectors.Period:
    """?from=YYYY-MM-DD&to=YYYY-MM-DD (UTC days, both included); default the last 7 days. One
    of them alone keeps the default length on the other side."""
    start = date_param(request.GET, "from")
    end = date_param(request.GET, "to")
    default = selectors.default_period()
    if start is None and end is None:
        return default
    length = timedelta(days=selectors.DEFAULT_DAYS - 1)
    if end is None:
        first: date = start if start is not None else default.start
        end = max(first, min(first + length, datetime.now(UTC).date()))
    if start is None:
        start = end - length
    if end < start:
        raise BadParameter("to", f"{end} is before from ({start})")
    if (end - start).days + 1 > selectors.MAX_DAYS:
        raise BadParameter("to", f"the period is longer than {selectors.MAX_DAYS} days")
    return selectors.Period(start, end)


@console_view(operator_only=False)
def price(request: HttpRequest, principal: Principal) -> HttpResponse:
    try:
        period = period_from(request)
        sort = choice_param(request.GET, "sort", SORTS, selectors.DEFAULT_JOB_SORT)
        page = int_param(request.GET, "page", 1, 1, 1_000_000)
        list_price = decimal_param(
            request.GET, "list_price", lo_exclusive=Decimal(0), hi=Decimal(1_000_000)
        )
        share_pct = decimal_param(request.GET, "share", lo_exclusive=Decimal(0), hi=Decimal(100))
    except BadParameter as error:
        return bad_parameter_response(request, error, "price")
    data = selectors.price_page(principal, period, sort=sort, page=page)
    if list_price is None:
        list_price = data.mean_list_price
    if share_pct is None and data.fleet.productive_share:
        share_pct = Decimal(str(round(data.fleet.productive_share * 100, 1)))
    calculator = None
    if list_price is not None and share_pct is not None and share_pct > 0:
        calculator = selectors.calculate(list_price, share_pct / 100, data.lost_share)
    query = request.GET.copy()
    query.pop("page", None)
    unsorted = query.copy()
    unsorted.pop("sort", None)
    return render(
        request,
        "proof/console/price.html",
        {
            "page_title": "Real price",
            "section": "price",
            "wide": True,
            "data": data,
            "calculator": calculator,
            "list_price": list_price,
            "share_pct": share_pct,
            "currency": data.fleet.currency or "USD",
            "query": query.urlencode(),
            "unsorted_query": unsorted.urlencode(),
            "sorts": selectors.JOB_SORTS,
        },
    )
