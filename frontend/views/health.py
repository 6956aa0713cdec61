"""/health/ — operators only: the GPUs degrading or failing, ranked by drain urgency, with
trend charts of the counters their verdicts cite."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import console_view
from frontend.selectors import health as selectors
from frontend.views._fleet_params import BadParameter, bad_parameter_response, int_param
from tenants.access import Principal


@console_view(operator_only=True)
def health(request: HttpRequest, principal: Principal) -> HttpResponse:
    try:
        days = int_param(request.GET, "days", selectors.DEFAULT_DAYS, 1, selectors.MAX_DAYS)
        page = int_param(request.GET, "page", 1, 1, 1_000_000)
    except BadParameter as error:
        return bad_parameter_response(request, error, "health")
    data = selectors.health_page(principal, days=days, page=page)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "proof/console/health.html",
        {
            "page_title": "Fleet health",
            "section": "health",
            "wide": True,
            "data": data,
            "query": query.urlencode(),
            "tiers": selectors.TIERS,
        },
    )
