"""Placeholder until this area is built."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import console_view
from tenants.access import Principal


@console_view(operator_only=False)
def incident_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    return render(
        request,
        "proof/console/placeholder.html",
        {"page_title": "Incidents", "section": "incidents"},
    )


@console_view(operator_only=False)
def incident_detail(request: HttpRequest, principal: Principal, public_id: object) -> HttpResponse:
    return render(
        request, "proof/console/placeholder.html", {"page_title": "Incident", "section": "incident"}
    )
