"""Placeholder until this area is built."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import console_view
from tenants.access import Principal


@console_view(operator_only=False)
def settings_index(request: HttpRequest, principal: Principal) -> HttpResponse:
    return render(
        request, "proof/console/placeholder.html", {"page_title": "Settings", "section": "settings"}
    )
