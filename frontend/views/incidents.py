"""The incidents list (`/incidents/`) and the verdict page (`/incidents/<public_id>/`).

Both are open to customer users, scoped to their own jobs' incidents (frontend/selectors/
incidents.py); another tenant's or another customer's incident is a 404.
"""

from __future__ import annotations

import uuid

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import console_view
from frontend.selectors import incidents as selectors
from investigator.ask import MAX_QUESTION_CHARS
from tenants.access import Principal


@console_view(operator_only=False)
def incident_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    try:
        params = selectors.list_params(request.GET)
        page = selectors.incident_page(principal, params)
    except selectors.BadParameter as bad:
        return render(
            request,
            "proof/console/_incident_bad_request.html",
            {"section": "incidents", "parameter": bad.name, "message": bad.message},
            status=400,
        )
    return render(
        request,
        "proof/console/incidents.html",
        {
            "section": "incidents",
            "wide": True,
            "page": page,
            "params": page.params,
            "states": selectors.STATES,
            "categories": selectors.CATEGORIES,
            "families": selectors.FAMILIES,
            "sort_keys": selectors.SORT_KEYS,
        },
    )


@console_view(operator_only=False)
def incident_detail(
    request: HttpRequest, principal: Principal, public_id: uuid.UUID
) -> HttpResponse:
    detail = selectors.incident_detail(principal, public_id)
    return render(
        request,
        "proof/console/incident.html",
        {
            "section": "incidents",
            "wide": True,
            "detail": detail,
            "incident": detail.incident,
            # "Ask about this incident" (frontend/static/proof/ask.js): asking writes a
            # question, so it needs a role that may write, as the API does.
            "can_ask": principal.can_write,
            "ask_max_chars": MAX_QUESTION_CHARS,
        },
    )
