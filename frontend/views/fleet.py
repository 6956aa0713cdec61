"""/fleet/ — operators only: headline cards, the nodes × GPUs heat map (coloured by
utilisation or health, filtered, 50 nodes a page), GPUs idle while holding memory."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import console_view
from frontend.selectors import fleet as selectors
from frontend.views._fleet_params import (
    BadParameter,
    bad_parameter_response,
    choice_param,
    int_param,
    text_param,
)
from tenants.access import Principal


def filters_from(request: HttpRequest, principal: Principal) -> selectors.FleetFilters:
    params = request.GET
    customer_id = int_param(params, "customer", 0, 1, 2**62) or None
    if customer_id is not None and not selectors.customer_exists(principal, customer_id):
        # Another operator's customer id reads the same as one that never existed.
        raise BadParameter("customer", f"no customer {customer_id}")
    return selectors.FleetFilters(
        model=text_param(params, "model", 128),
        state=choice_param(params, "state", selectors.STATES, "") or None,
        customer_id=customer_id,
        silent_min=int_param(params, "silent_min", selectors.DEFAULT_SILENT_MIN, 1, 7 * 24 * 60),
        colour=choice_param(params, "colour", selectors.COLOURS, "utilisation"),
        idle_memory_mib=int_param(
            params, "idle_memory_mib", selectors.DEFAULT_IDLE_MEMORY_MIB, 1, 10_000_000
        ),
        page=int_param(params, "page", 1, 1, 1_000_000),
    )


@console_view(operator_only=True)
def fleet(request: HttpRequest, principal: Principal) -> HttpResponse:
    try:
        filters = filters_from(request, principal)
    except BadParameter as error:
        return bad_parameter_response(request, error, "fleet")
    data = selectors.fleet_page(principal, filters)
    query = request.GET.copy()
    query.pop("page", None)
    uncoloured = query.copy()
    uncoloured.pop("colour", None)
    return render(
        request,
        "proof/console/fleet.html",
        {
            "page_title": "Fleet",
            "section": "fleet",
            "wide": True,
            "data": data,
            "query": query.urlencode(),
            "uncoloured_query": uncoloured.urlencode(),
            "states": selectors.STATES,
            "currency": data.cards.price.currency or "USD",
        },
    )
